"""probes.patterns.without_captures: the block-wide finder's patterns lose their groups, never
a match."""

import pytest
import re2

from probes.patterns import engine, without_captures
from probes.signatures import shipped


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (r"(a)(?P<x>b)c", "(?:a)(?:b)c"),
        (r"\(lit\)(?:kept)(?i:x)", r"\(lit\)(?:kept)(?i:x)"),
        (r"[(]x[^)(]y[]()]z", r"[(]x[^)(]y[]()]z"),
        (r"\\(x)", r"\\(?:x)"),
    ],
)
def test_groups_become_non_capturing_outside_classes_and_escapes(pattern, expected):
    assert without_captures(pattern) == expected


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
