"""Patterns from data run in bounded time: RE2 first, a windowed fallback for look-around."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.kb import KBError, load_kb
from probes import patterns


def test_nested_repetition_runs_on_re2_in_linear_time() -> None:
    compiled = patterns.compile(r"(a+)+$")
    assert patterns.engine(r"(a+)+$") == "re2"
    # Python's re needs about 2**n steps here; RE2 answers at once
    assert compiled.search("a" * 100_000 + "b") is None
    assert compiled.search("xaaa").group(1) == "aaa"


def test_look_around_falls_back_to_a_window_sized_by_its_repetitions() -> None:
    one = patterns.compile(r"torch\.load\((?![^)]*map_location)")
    assert patterns.engine(r"torch\.load\((?![^)]*map_location)") == "re"
    assert one.search("ckpt = torch.load(path)") and not one.search("torch.load(path, map_location='cpu')")
    three = patterns.compile(r"a*b*c*(?=x)")
    assert three.window < one.window <= patterns.FALLBACK_CHARS
    assert three.window**4 <= patterns.STEP_BUDGET
    # a match past the window is not seen: the price of bounding backtracking
    assert one.search(" " * patterns.FALLBACK_CHARS + "torch.load(x)") is None
    multi = patterns.compile(r"^x(?!y)", multiline=True)
    assert multi.search("ab\nxz") and not multi.search("ab\nxy")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a+)+\1", "repeats a repetition"),
        (r"(?=x).*.*.*.*.*", "unbounded repetitions"),
        (r"(?<=a)(", "not a valid regular expression"),
    ],
)
def test_unboundable_patterns_are_refused_with_the_reason(pattern: str, why: str) -> None:
    assert why in (patterns.problem(pattern) or "")
    with pytest.raises(patterns.PatternError, match="RE2 cannot run it"):
        patterns.compile(pattern)


def test_flags_and_groups() -> None:
    compiled = patterns.compile(r"rank (?P<rank>\d+)", ignore_case=True)
    found = compiled.search("RANK 12 failed")
    assert found.group("rank") == "12" and found.groupdict() == {"rank": "12"}
    assert patterns.problem(r"rank (\d+)") is None


SHIPPED = Path(__file__).resolve().parents[2] / "kb" / "devices" / "hook-device-mismatch.yaml"
FIRST_LOG = "accelerate[/\\\\]hooks\\.py|\\baccelerate(?:.s)? hooks\\b|AlignDeviceHook|add_hook_to_module|_old_forward"


def _rule(folder: Path, log: str) -> tuple[Path, int]:
    """A shipped rule with its first log pattern replaced: (file, line of that pattern)."""
    text = SHIPPED.read_text(encoding="utf-8")
    assert FIRST_LOG in text
    text = text.replace("id: devices.hook-device-mismatch", "id: area.hostile").replace(FIRST_LOG, log)
    path = folder / "area" / "hostile.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path, text[: text.index(log)].count("\n") + 1


def test_a_rule_with_a_catastrophic_regex_loads_and_runs_bounded(tmp_path: Path) -> None:
    _rule(tmp_path, "(a+)+$")
    kb = load_kb([tmp_path], shipped=False)
    check = next(c for c in kb.get("area.hostile").evidence if getattr(c, "log", None) == "(a+)+$")
    assert check.regex.search("a" * 50_000 + "!") is None


def test_a_rule_regex_that_cannot_be_bounded_is_a_load_error_with_its_line(tmp_path: Path) -> None:
    path, line = _rule(tmp_path, r"(a+)+\1")
    with pytest.raises(KBError) as caught:
        load_kb([tmp_path], shipped=False)
    problem = next(p for p in caught.value.problems if str(path) in p)
    assert problem.startswith(f"{path}:{line}:") and "repeats a repetition" in problem and "\n" not in problem
