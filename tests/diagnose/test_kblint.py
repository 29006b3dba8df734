"""`diagnose kb lint` beyond loading: every fix renders on an empty and a full snapshot, and no
log pattern names a GPU model or a version that kb/tables/ holds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diagnose.kb import KBError, load_kb
from diagnose.kblint import full_facts, lint

ROOT = Path(__file__).resolve().parents[2]

RULE = """\
id: local.{name}
title: A local rule
severity: error
explains: [crash.nccl]
evidence:
  - {{log: '{pattern}', weight: 6}}
explain: why
fix:
  - title: Try this
    kind: shell
    snippet: |
{snippet}
references: [https://github.com/pytorch/pytorch/issues/1]
examples:
  - {{name: m, expect: match, log: "boom"}}
  - {{name: n, expect: no-match, log: "fine"}}
"""


def write_rule(tmp_path: Path, name: str, snippet: str, pattern: str = "boom") -> Path:
    folder = tmp_path / "local"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(
        RULE.format(name=name, pattern=pattern, snippet=textwrap.indent(snippet, " " * 6)), encoding="utf-8"
    )
    return path


def kb_lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diagnose", "kb", "lint", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_the_shipped_rules_lint_clean():
    assert lint(load_kb()) == []


def test_the_full_snapshot_has_every_section_and_the_derived_facts_built_on_the_tables():
    facts = full_facts()
    assert facts.gpus.count and facts.torch.version and facts.hang.ranks and facts.log.signatures
    assert facts.gpus.arch == ["ada"] and facts.gpus.consumer is True
    assert facts.packages.lookup("torch") == (True, "2.5.1")


@pytest.mark.parametrize(
    ("snippet", "why"),
    [
        ("{{ 1/0 }}", "ZeroDivisionError"),
        ("{{ facts.gpus.devices[0].name }}", "undefined"),  # fine on a full snapshot, not on an empty one
        # fine on an empty snapshot, where the branch is not taken
        ("{% if facts.gpus.count %}{{ facts.gpus.count + 'x' }}{% endif %}", "TypeError"),
        ("{{ env.NCCL_SOCKET_IFNAME }}", "undefined"),  # a variable that may be unset needs | default
    ],
)
def test_a_fix_that_fails_on_either_snapshot_is_named_with_its_file(tmp_path, snippet, why):
    path = write_rule(tmp_path, "bad-fix", snippet)
    problems = lint(load_kb([tmp_path], shipped=False))
    assert len(problems) == 1 and problems[0].startswith(f"{path}: local.bad-fix: fix 'Try this': ")
    assert why.lower() in problems[0].lower()


def test_a_fix_with_defaults_passes(tmp_path):
    write_rule(
        tmp_path,
        "good-fix",
        "export NCCL_SOCKET_IFNAME={{ env.NCCL_SOCKET_IFNAME | default('eth0') }}  # {{ nproc }}\n",
    )
    assert lint(load_kb([tmp_path], shipped=False)) == []


def test_a_pattern_naming_a_gpu_model_or_a_release_is_listed(tmp_path):
    path = write_rule(tmp_path, "names", "true", pattern=r"(?i)RTX 4090|NCCL version 2\.18")
    problems = lint(load_kb([tmp_path], shipped=False))
    assert len(problems) == 1 and problems[0].startswith(f"{path}: local.names: log pattern names")
    assert problems[0].endswith("': 4090, a version number")


def test_a_pattern_searched_in_a_narrow_window_is_listed(tmp_path):
    # look-around forces the bounded fallback; three unbounded repeats leave it a few dozen characters
    path = write_rule(tmp_path, "narrow", "true", pattern=r"^(?!.*ok)boom\s*,\s*\d+")
    problems = lint(load_kb([tmp_path], shipped=False))
    assert len(problems) == 1 and problems[0].startswith(f"{path}: local.narrow: log pattern ")
    assert "is searched in the first 39 characters of a line only" in problems[0]
    # the same with bounded repeats is searched over whole lines
    write_rule(tmp_path, "narrow", "true", pattern=r"^(?!.*ok)boom\s{0,3},\s{0,3}\d+")
    assert lint(load_kb([tmp_path], shipped=False)) == []


def test_a_reference_a_reader_cannot_open_is_listed(tmp_path):
    ref = "http://example.org/forum/1"
    path = write_rule(tmp_path, "private-ref", "true")
    path.write_text(
        path.read_text(encoding="utf-8").replace("https://github.com/pytorch/pytorch/issues/1", ref), encoding="utf-8"
    )
    assert lint(load_kb([tmp_path], shipped=False)) == [
        f"{path}: local.private-ref: reference {ref!r} is not a public https:// address: cite the thread it came from"
    ]


def test_a_private_note_as_a_reference_does_not_load(tmp_path):
    path = write_rule(tmp_path, "private-ref", "true")
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            "https://github.com/pytorch/pytorch/issues/1", "seed:000_c7a549bc7e3b7d4c.txt"
        ),
        encoding="utf-8",
    )
    with pytest.raises(KBError, match="not a URL"):
        load_kb([tmp_path], shipped=False)


def test_kb_lint_exits_2_listing_each_problem(tmp_path):
    write_rule(tmp_path, "bad-fix", "{{ 1/0 }}")
    proc = kb_lint("--kb", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "local.bad-fix: fix 'Try this': ZeroDivisionError" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "diagnose: error: 1 problem(s) in the rule base"
