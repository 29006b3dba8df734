"""Loading rules: every kind of bad rule file is one FILE:LINE line, never a traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from diagnose.kb import KBError, load_kb

GOOD = """\
id: area.good
title: A good rule
severity: warning
evidence:
  - {fact: gpus.count, ge: 2, weight: 2}
  - {log: 'NCCL WARN', weight: 3}
explain: Because.
fix:
  - title: Do this
    snippet: "export NCCL_DEBUG=INFO  # {{ nproc }} ranks"
references: [https://example.org/issue/1]
examples:
  - {expect: match, facts: {gpus: {count: 2}}}
  - {expect: no-match, facts: {gpus: {count: 1}}}
explains: [crash.nccl]
"""


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems(root: Path) -> list[str]:
    with pytest.raises(KBError) as info:
        load_kb([root], shipped=False)
    return info.value.problems


def test_good_rule_loads(tmp_path):
    write(tmp_path, "area/good.yaml", GOOD)
    kb = load_kb([tmp_path], shipped=False)
    assert [r.id for r in kb.rules] == ["area.good"]
    assert kb.files["area.good"] == tmp_path / "area/good.yaml"


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        (
            "fact: gpus.count",
            "fact: gpu.count",
            5,
            "evidence[0].fact: unknown fact path 'gpu.count' (did you mean 'gpus.count'?)",
        ),
        ("'NCCL WARN'", "'NCCL (WARN'", 6, "evidence[1].log: bad regex"),
        ("weight: 3}", "weight: 3, colour: red}", 6, "evidence[1].colour: unknown key"),
        ("ge: 2, weight: 2", "version: '>=2.x', weight: 2", 5, "bad version specifier '>=2.x'"),
        ("{{ nproc }}", "{{ nproc ", 10, "fix[0].snippet: template syntax error"),
        ("severity: warning", "severity: fatal", 3, "severity: Input should be 'error', 'warning' or 'info'"),
        ("ge: 2, weight: 2", "ge: 2, le: 4, weight: 2", 5, "exactly one operator"),
        (
            "fact: gpus.count, ge: 2",
            "fact: microtests.placement.measurements.no_such_measure, ge: 1",
            5,
            "evidence[0].fact: the placement micro-test measures no 'no_such_measure'",
        ),
        ("  - {expect: no-match, facts: {gpus: {count: 1}}}\n", "", 13, "missing no-match"),
        (
            "references: [https://example.org/issue/1]",
            "references: []",
            11,
            "references: List should have at least 1 item",
        ),
        (
            "{fact: gpus.count, ge: 2, weight: 2}",
            "{weight: 2}",
            5,
            "evidence[0]: a check needs exactly one of the keys",
        ),
        ("title: A good rule", "title: A good rule\ntitle: twice", 3, "duplicate key 'title'"),
        ("title: A good rule", "title: !!python/object/apply:os.system ['true']", 2, "unsupported tag"),
        ("explain: Because.", "explain: [unclosed", 8, "invalid YAML"),
    ],
)
def test_bad_rule_is_one_line_with_place(tmp_path, old, new, line, message):
    assert old in GOOD
    path = write(tmp_path, "area/good.yaml", GOOD.replace(old, new))
    found = problems(tmp_path)
    first = found[0]
    assert first.startswith(f"{path}:{line}: "), found
    assert message.split(": ")[-1].rstrip("'") in first or message in first, found
    assert "\n" not in first and "Traceback" not in first


def test_id_must_match_path(tmp_path):
    path = write(tmp_path, "area/other.yaml", GOOD)
    assert problems(tmp_path) == [f"{path}:1: id: 'area.good' does not match its path (expected 'area.other')"]


def test_duplicate_id_via_alias(tmp_path):
    write(tmp_path, "area/good.yaml", GOOD)
    second = GOOD.replace("id: area.good", "id: area.second\naliases: [area.good]")
    path = write(tmp_path, "area/second.yaml", second)
    assert any(p.startswith(f"{path}:1: id: 'area.good' already defined") for p in problems(tmp_path))


def test_unknown_signature_suggests(tmp_path):
    from probes.log import known_signatures

    known = sorted(known_signatures())[0]
    write(
        tmp_path, "area/good.yaml", GOOD.replace("{log: 'NCCL WARN', weight: 3}", f"{{signature: {known}x, weight: 3}}")
    )
    assert f"did you mean '{known}'" in problems(tmp_path)[0]


def test_when_takes_no_weight(tmp_path):
    write(
        tmp_path,
        "area/good.yaml",
        GOOD.replace("evidence:", "when:\n  - {fact: gpus.count, ge: 1, weight: 2}\nevidence:"),
    )
    assert "takes no weight" in problems(tmp_path)[0]


def test_not_a_folder(tmp_path):
    assert problems(tmp_path / "missing") == [f"{tmp_path / 'missing'}: not a rule folder"]


def test_shipped_kb_loads_and_covers_the_seed_causes():
    kb = load_kb()
    ids = {r.id for r in kb.rules}
    assert {
        "startup.staggered-init-hang",
        "ddp.checkpoint-on-gpu0",
        "sync.barrier-divergence",
        "devices.duplicate-gpu",
        "devices.hook-device-mismatch",
    } <= ids


def test_every_shipped_rule_explains_a_symptom():
    from diagnose.kb import load_kb

    assert [r.id for r in load_kb().rules if not r.explains] == []


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (
            "{fact: host.os, contains: 5, weight: 2}",
            "evidence[0].fact: contains: host.os holds text; contains takes a string",
        ),
        ("{fact: host.os, eq: 5, weight: 2}", "evidence[0].fact: eq: a int operand against text (host.os holds text)"),
        ("{fact: host.cpu_count, eq: '8', weight: 2}", "evidence[0].fact: eq: a text operand against a number"),
        ("{fact: host.os, gt: 5, weight: 2}", None),  # a numeric string compares as a number
        (
            "{fact: host.interactive, ge: 1, weight: 2}",
            "evidence[0].fact: ge: a number operand against host.interactive",
        ),
        (
            "{fact: gpus.count, version: '>=2', weight: 2}",
            "evidence[0].fact: version: gpus.count holds a number, not a version",
        ),
        (
            "{fact: microtests.barrier.status, in: [passed, timeout], weight: 2}",
            "in: 'timeout' is not a value it can take",
        ),
        ("{fact: gpus.devices.name, contains: 3, weight: 2}", "contains: a int operand against text"),
        (
            "{fact: env.NCCL_P2P_DISABLE, eq: 1, weight: 2}",
            "eq: a int operand against text (env.NCCL_P2P_DISABLE holds text)",
        ),
    ],
)
def test_operand_must_fit_the_fact(tmp_path, check, message):
    """An operand the fact can never hold is a load error on the check's line, not a rule that
    never fires or raises when it runs."""
    path = write(tmp_path, "area/good.yaml", GOOD.replace("{fact: gpus.count, ge: 2, weight: 2}", check))
    if message is None:
        assert [r.id for r in load_kb([tmp_path], shipped=False).rules] == ["area.good"]
        return
    found = problems(tmp_path)
    assert found[0].startswith(f"{path}:5: "), found
    assert message in found[0], found
