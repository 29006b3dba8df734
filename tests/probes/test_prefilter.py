"""The literal prefilter may only skip patterns that cannot match."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.kb import load_kb
from diagnose.rules import LogCheck
from probes.prefilter import required_literals


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        ("Duplicate GPU detected", ("duplicate gpu detected",)),
        (r"(?i)iommu|\bvt-d\b", ("iommu", "vt-d")),
        (r"(?i)(gpus|devices)\W{0,4}(\d+),\2", ("devices", "gpus")),
        (r"torch\.load\((?![^)]*map_location)", ("torch.load(",)),
        (r"(?:abc)+xy", ("abc",)),
        (r"a|bcd", None),  # one branch has no usable literal
        (r"(?:abc)?", None),  # optional: nothing is required
        (r"[A-Z]+ error", (" error",)),
        (r"(?x) NCCL \s WARN", ("nccl",)),  # equal lengths: the first run is kept
    ],
)
def test_required_literals(pattern, literals):
    assert required_literals(pattern) == literals


def may_match(literals: tuple[str, ...] | None, lowered_text: str) -> bool:
    """What the engine relies on: a match implies one of the literals in the lowered text."""
    return literals is None or any(literal in lowered_text for literal in literals)


def _kb_patterns() -> list[str]:
    return sorted({c.log for r in load_kb().rules for c in [*r.evidence, *r.when] if isinstance(c, LogCheck)})


def _kb_texts() -> list[str]:
    return [line for r in load_kb().rules for e in r.examples if e.log for line in e.log.splitlines()]


def test_never_hides_a_match_on_kb_examples():
    texts = _kb_texts()
    for pattern in _kb_patterns():
        regex, literals = re.compile(pattern), required_literals(pattern)
        for text in texts:
            if regex.search(text):
                assert may_match(literals, text.lower()), (pattern, text)


WORDS = st.sampled_from(
    [
        "NCCL",
        "WARN",
        "error",
        "Error",
        "GPU",
        "rank",
        "0",
        "1",
        ",",
        " ",
        "hang",
        "Hung",
        "stuck",
        "cuda:0",
        "IOMMU",
        "torch.load(",
        "map_location",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(WORDS, max_size=12).map("".join), st.sampled_from(_kb_patterns()))
def test_never_hides_a_match_on_generated_text(text, pattern):
    if re.search(pattern, text):
        assert may_match(required_literals(pattern), text.lower())
