"""Golden output of every view for fixed snapshots, over the five seed rules.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/diagnose/test_render.py``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagnose.engine import evaluate
from diagnose.kb import KB, load_rule_file, shipped_kb_dir
from diagnose.render import render
from probes.snapshot import load_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEEDS = {
    "startup.staggered-init-hang",
    "ddp.checkpoint-on-gpu0",
    "sync.barrier-divergence",
    "devices.duplicate-gpu",
    "devices.hook-device-mismatch",
}
CASES = ["devices_duplicate-gpu", "healthy", "cpu-machine-live"]  # the last one recorded on a 2-core CPU machine


@pytest.fixture(scope="module")
def seed_kb() -> KB:
    root = shipped_kb_dir()
    rules = [load_rule_file(root.joinpath(*rule_id.split(".")).with_suffix(".yaml"), root) for rule_id in sorted(SEEDS)]
    return KB(rules=rules, sources=[root])


@pytest.mark.parametrize("fmt", ["json", "markdown", "text"])
@pytest.mark.parametrize("case", CASES)
def test_golden(seed_kb, case, fmt):
    report = evaluate(load_snapshot(FIXTURES / "snapshots" / f"{case}.json"), seed_kb)
    output = render(report, fmt)
    golden = FIXTURES / "golden" / f"{case}.{ {'json': 'json', 'markdown': 'md', 'text': 'txt'}[fmt] }"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(output, encoding="utf-8")
    assert output == golden.read_text(encoding="utf-8"), f"{golden.name} differs: rerun with UPDATE_GOLDEN=1 and review"


def test_text_fits_80_columns(seed_kb):
    report = evaluate(load_snapshot(FIXTURES / "snapshots" / "startup_staggered-init-hang.json"), seed_kb)
    assert max(len(line) for line in render(report, "text").splitlines()) <= 80


def test_color_only_when_asked(seed_kb):
    report = evaluate(load_snapshot(FIXTURES / "snapshots" / "devices_duplicate-gpu.json"), seed_kb)
    assert "\x1b[" not in render(report, "text")
    assert "\x1b[" in render(report, "text", color=True)
