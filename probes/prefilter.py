"""Literal prefilters for log patterns: skip a regex when none of its required words occur.

Python's ``re`` has no literal-prefix acceleration for case-insensitive alternations, so a
typical rule pattern costs hundreds of microseconds on a few kilobytes of log even when
nothing matches. Every match of a pattern must contain one of the strings returned by
``required_literals``; one lowercase substring test per string (C speed) then rules most
patterns out before the regex runs. Literals are lowercased and compared with the
lowercased text, which only widens the test, so the prefilter never hides a match.
"""

from __future__ import annotations

import re
import sys

# the regex parser is private; it moved from sre_parse into the re package in Python 3.11
if sys.version_info >= (3, 11):
    from re import _constants as C  # noqa: N812 - the regex opcodes
    from re import _parser
else:  # pragma: no cover - exercised on 3.10 only
    import sre_constants as C  # noqa: N812
    import sre_parse as _parser

MIN_LITERAL = 3  # shorter required strings select too little to be worth testing
# ...measured in characters of ASCII; a CJK character is a word's worth, so two select as well
MIN_WIDE_LITERAL = 2

# possessive repeats and atomic groups exist from Python 3.11
_REPEATS = tuple(getattr(C, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(C, name))
_ATOMIC = getattr(C, "ATOMIC_GROUP", None)


def _strength(literal: str) -> int:
    """How selective a literal is, in ASCII characters' worth."""
    return len(literal) if literal.isascii() else len(literal) * MIN_LITERAL // MIN_WIDE_LITERAL


def _weakest(alternatives: frozenset[str]) -> int:
    return min(_strength(a) for a in alternatives)


def _required(items) -> frozenset[str] | None:
    """A set of strings one of which every match of the sequence contains, or None."""
    best: frozenset[str] | None = None
    run: list[str] = []

    def consider(candidate: frozenset[str] | None) -> None:
        nonlocal best
        if candidate and all(candidate) and (best is None or _weakest(candidate) > _weakest(best)):
            best = candidate

    for op, av in items:
        if op is C.LITERAL:
            run.append(chr(av).lower())
            continue
        consider(frozenset(["".join(run)]) if run else None)
        run = []
        if op is C.SUBPATTERN:
            consider(_required(av[3]))
        elif op is _ATOMIC:
            consider(_required(av))
        elif op is C.BRANCH:
            branches = [_required(branch) for branch in av[1]]
            if all(branches):
                consider(frozenset().union(*branches))
        elif op in _REPEATS and av[0] >= 1:
            consider(_required(av[2]))
        # anything else (classes, anchors, lookarounds, back-references) requires no literal
    consider(frozenset(["".join(run)]) if run else None)
    return best


def required_literals(pattern: str) -> tuple[str, ...] | None:
    """Lowercase strings one of which occurs in any text the pattern matches; None if unknown."""
    try:
        parsed = _parser.parse(pattern)
    except re.error:
        return None
    found = _required(parsed.data)
    if not found or _weakest(found) < MIN_LITERAL:
        return None
    return tuple(sorted(found))
