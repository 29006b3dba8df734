"""Snapshots: lossless round trip, and clear errors for anything that is not one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probes.facts import SCHEMA_VERSION, Facts
from probes.snapshot import SnapshotError, dump_snapshot, facts_from_dict, load_snapshot

SNAPSHOTS = sorted(Path(__file__).parent.parent.joinpath("fixtures", "snapshots").glob("*.json"))


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.stem)
def test_snapshot_round_trips_without_loss(path, tmp_path):
    facts = load_snapshot(path)
    again = tmp_path / "again.json"
    again.write_text(dump_snapshot(facts))
    assert load_snapshot(again) == facts
    assert json.loads(dump_snapshot(load_snapshot(again))) == json.loads(dump_snapshot(facts))


def test_unknown_is_not_false():
    facts = Facts()
    assert facts.gpus.count is None and facts.gpus.consumer is None
    assert facts.packages.lookup("torch") == (False, None)  # not collected: unknown
    facts.packages.complete = True
    assert facts.packages.lookup("torch") == (True, None)  # a complete listing: known absent
    facts.packages.values["pytorch-lightning"] = "2.5.0"
    assert facts.packages.lookup("PyTorch_Lightning") == (True, "2.5.0")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "invalid JSON"),
        (b"\x00\x01\xff\xfe binary", "binary data"),
        (b'{"host": {}}', "not a diagnose snapshot (no schema_version)"),
        (b"[1, 2]", "not a diagnose snapshot"),
        (json.dumps({"schema_version": SCHEMA_VERSION + 1}).encode(), f"snapshot schema {SCHEMA_VERSION + 1} is newer"),
        (json.dumps({"schema_version": 0}).encode(), "snapshot schema 0 is no longer supported"),
        (json.dumps({"schema_version": "1"}).encode(), "schema_version must be an integer"),
        (
            json.dumps({"schema_version": SCHEMA_VERSION, "gpus": {"count": "many"}}).encode(),
            "gpus.count: Input should be a valid integer",
        ),
        (json.dumps({"schema_version": SCHEMA_VERSION, "gpu": {}}).encode(), "gpu: Extra inputs are not permitted"),
        (b'{"schema_version": 1,', ":1:22: invalid JSON"),
    ],
)
def test_bad_snapshot_is_one_line(tmp_path, content, message):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(SnapshotError) as info:
        load_snapshot(path)
    text = str(info.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


def test_missing_file():
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot("/nonexistent/facts.json")


def test_upgrade_chain_is_applied(monkeypatch):
    import probes.snapshot as module

    monkeypatch.setattr(module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(module.UPGRADES, SCHEMA_VERSION, lambda d: {**d, "schema_version": SCHEMA_VERSION + 1})
    monkeypatch.setattr(module.Facts.model_fields["schema_version"], "default", SCHEMA_VERSION + 1)
    facts = facts_from_dict({"schema_version": SCHEMA_VERSION})
    assert facts.schema_version == SCHEMA_VERSION + 1
