"""Hostile rule files stop the load with one FILE:LINE line, quickly; library inputs are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.kb import MAX_DEPTH, MAX_VALUES, KBError, load_kb

ALIAS_BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    + ["id: area.bomb"]
)


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        (ALIAS_BOMB, 1, f"more than {MAX_VALUES} values"),
        ("a: " + "[" * 5000 + "]" * 5000, 1, f"nested deeper than {MAX_DEPTH} levels"),
        ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 60)), None, f"nested deeper than {MAX_DEPTH} levels"),
        ("base: &b {id: x}\nrule:\n  <<: *b\n", 3, "no merge keys"),
        ("? [a, b]\n: c\n", 1, "a key is plain text"),
    ],
    ids=["alias-bomb", "deep-flow", "deep-block", "merge-key", "complex-key"],
)
def test_hostile_yaml_is_a_load_error_with_its_line(
    tmp_path: Path, content: str, line: int | None, message: str
) -> None:
    path = tmp_path / "area" / "bomb.yaml"
    path.parent.mkdir()
    path.write_text(content, encoding="utf-8")
    with pytest.raises(KBError) as caught:
        load_kb([tmp_path], shipped=False)
    problem = caught.value.problems[0]
    assert problem.startswith(f"{path}:{line if line else ''}") and message in problem and "\n" not in problem


def test_a_huge_rule_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "area" / "huge.yaml"
    path.parent.mkdir()
    with path.open("wb") as f:
        f.truncate(2 << 20)
    with pytest.raises(KBError, match=r"huge.yaml:1: larger than 1024 KiB"):
        load_kb([tmp_path], shipped=False)


def test_one_folder_as_a_string_or_bytes_is_one_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for given in (str(missing), bytes(missing), missing):
        with pytest.raises(KBError, match=f"^{missing}: not a rule folder$"):
            load_kb(given, shipped=False)


@pytest.mark.parametrize("given", [42, [3.5], [None]])
def test_other_types_are_a_clear_type_error(given: object) -> None:
    with pytest.raises(TypeError, match="rule folder"):
        load_kb(given, shipped=False)


def test_a_broken_signature_is_one_problem_not_one_per_rule(tmp_path: Path, monkeypatch) -> None:
    import shutil

    import probes.signatures as signatures

    root = tmp_path / "kb"
    shutil.copytree(signatures.kb_dir(), root)
    catalog = root / "signatures" / "nccl.yaml"
    catalog.write_text(catalog.read_text("utf-8").replace("patterns:\n", "patterns:\n  - '(?P<broken'\n", 1), "utf-8")
    monkeypatch.setattr(signatures, "kb_dir", lambda: root)
    signatures.shipped.cache_clear()
    try:
        with pytest.raises(KBError) as caught:
            load_kb()
    finally:
        signatures.shipped.cache_clear()
    assert len(caught.value.problems) == 1 and str(catalog) in caught.value.problems[0]
