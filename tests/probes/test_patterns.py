"""probes.patterns.without_captures and without_lookaround: the block-wide finder's patterns lose
their groups, never a match, and their look-arounds, never a line they match."""

import re

import pytest
import re2

from probes.patterns import engine, without_captures, without_lookaround
from probes.signatures import shipped


@pytest.mark.parametrize(
    ("transform", "pattern", "expected"),
    [
        (without_captures, r"(a)(?P<x>b)c", "(?:a)(?:b)c"),
        (without_captures, r"\(lit\)(?:kept)(?i:x)", r"\(lit\)(?:kept)(?i:x)"),
        (without_captures, r"[(]x[^)(]y[]()]z", r"[(]x[^)(]y[]()]z"),
        (without_captures, r"\\(x)", r"\\(?:x)"),
        (without_lookaround, r"^(?!.*[Nn]cclUniqueId).*Socket Timeout", r"^.*Socket Timeout"),
        (without_lookaround, r"(?<![没不无])(?<!没有)(?:报错|出错)", r"(?:报错|出错)"),
        (without_lookaround, r"a(?=b(?:c))d[(?!]x\(?!y", r"ad[(?!]x\(?!y"),
        # Python's \uXXXX is RE2's \x{XXXX}
        (without_lookaround, r"[\u4e00-\u9fff]", r"[\x{4e00}-\x{9fff}]"),
    ],
)
def test_groups_and_look_arounds_are_rewritten_outside_classes_and_escapes(transform, pattern, expected):
    assert transform(pattern) == expected


def test_every_shipped_signature_pattern_matches_its_examples_the_same_without_groups():
    checked = 0
    for sig in shipped().signatures.values():
        lines = [*sig.examples.match, *sig.examples.no_match]
        for pattern in sig.patterns:
            if engine(pattern) != "re2":
                continue
            bare = re2.compile(without_captures(pattern))
            assert bare.groups == 0, pattern
            original = re2.compile(pattern)
            for line in lines:
                assert (bare.search(line) is None) == (original.search(line) is None), (sig.id, pattern, line)
                checked += 1
    assert checked > 100


def test_every_shipped_pattern_without_its_look_arounds_still_matches_its_match_examples():
    """Left out, a look-around can only widen a pattern: each example line it matched, RE2 finds
    with the relaxed pattern, which the block-wide finder then holds instead of common literals."""
    relaxed_runs = 0
    for sig in shipped().signatures.values():
        for pattern in sig.patterns:
            if engine(pattern) == "re2":
                continue
            relaxed = re2.compile(without_captures(without_lookaround(pattern)))
            relaxed_runs += 1
            for line in sig.examples.match:
                if re.search(pattern, line):
                    assert relaxed.search(line), (sig.id, pattern, line)
    assert relaxed_runs >= 10
