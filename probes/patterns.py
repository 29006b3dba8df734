"""Compiling patterns that come from data (rules, signatures) to run over untrusted text.

Python's ``re`` backtracks: ``(a+)+$`` or ``.*x.*y`` over a long hostile line can run for
minutes. Every pattern therefore goes to RE2 (``google-re2``), whose matching time is linear
in the text. RE2 has no look-around and no back-references; a pattern that needs them runs
on Python's ``re``, line by line, only when it is tame (no repetition nested in an unbounded repetition, at
most ``MAX_UNBOUNDED`` unbounded repetitions), and then only over the first ``window``
characters of each line, chosen so that ``window ** (k + 1)`` (the backtracking worst case
with k unbounded repetitions, searched from every start) stays under ``STEP_BUDGET``.
Anything else is refused with the reason, which is what ``diagnose kb lint`` shows.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator
from typing import Any

try:  # Python 3.11 renamed it; 3.10 has only the old name
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

import re2

FALLBACK_CHARS = 1000
STEP_BUDGET = 10**8
MAX_UNBOUNDED = 4
# a bounded repetition this long costs like an unbounded one in a backtracking engine
_LONG_REPEAT = 100
_RE2_MEMORY = 32 << 20

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would otherwise print its own line on stderr
_OPTIONS.max_mem = _RE2_MEMORY


class PatternError(ValueError):
    """A pattern neither RE2 nor the bounded fallback can run."""


def compile(pattern: str, *, ignore_case: bool = False, multiline: bool = False) -> Any:
    """``pattern`` ready to search untrusted text in bounded time, or ``PatternError``.

    The result has ``search``, ``match``, ``fullmatch``, ``finditer`` and ``pattern`` like a
    compiled ``re`` pattern; match objects have ``group``, ``groupdict``, ``start``, ``end``.
    """
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern is a string, not {type(pattern).__name__}")
    flags = ("i" if ignore_case else "") + ("m" if multiline else "")
    try:
        return re2.compile(f"(?{flags}){pattern}" if flags else pattern, options=_OPTIONS)
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
    problem, unbounded = _fallback_problem(pattern)
    if problem:
        raise PatternError(f"bad regex {pattern!r}: RE2 cannot run it ({why}), and {problem}")
    flags = (re.IGNORECASE if ignore_case else 0) | (re.MULTILINE if multiline else 0)
    window = min(FALLBACK_CHARS, int(STEP_BUDGET ** (1 / (unbounded + 1))))
    return _Bounded(re.compile(pattern, flags), multiline, window)


def problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be run safely, or None: the check ``kb lint`` applies."""
    try:
        compile(pattern)
    except PatternError as exc:
        return str(exc)
    return None


def engine(pattern: str) -> str:
    """'re2' or 're' (bounded): which engine ``compile`` gives this pattern."""
    return "re" if isinstance(compile(pattern), _Bounded) else "re2"


def _fallback_problem(pattern: str) -> tuple[str | None, int]:
    """(why Python's re cannot be bounded on it or None, its number of unbounded repetitions)."""
    try:
        parsed = _sre.parse(pattern)
    except re.error as exc:
        return f"it is not a valid regular expression either ({exc})", 0
    unbounded: list[int] = []
    if _nested(parsed, False, unbounded):
        return (
            "it repeats a repetition (like (a+)+), which backtracking cannot bound; rewrite it without look-around or nesting",
            0,
        )
    if len(unbounded) > MAX_UNBOUNDED:
        return f"it has {len(unbounded)} unbounded repetitions (at most {MAX_UNBOUNDED} where look-around is needed)", 0
    return None, len(unbounded)


def _nested(items: Any, inside: bool, unbounded: list[int]) -> bool:
    """True when an unbounded repetition holds another repetition; counts unbounded ones."""
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            big = high is _sre.MAXREPEAT or high > _LONG_REPEAT
            if big:
                if inside:
                    return True
                unbounded.append(1)
            if _nested(sub, inside or big, unbounded) or (big and _repeats(sub)):
                return True
        elif name == "SUBPATTERN":
            if _nested(arg[-1], inside, unbounded):
                return True
        elif name in ("BRANCH",):
            if any(_nested(branch, inside, unbounded) for branch in arg[1]):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _nested(arg[1], inside, unbounded):
                return True
        elif name == "ATOMIC_GROUP":
            if _nested(arg, inside, unbounded):
                return True
        elif name == "GROUPREF_EXISTS":
            if any(part is not None and _nested(part, inside, unbounded) for part in arg[1:]):
                return True
    return False


def _repeats(items: Any) -> bool:
    """Any repetition at all inside, bounded or not (x{2,5} inside (...)* is still nesting)."""
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if arg[1] > 1 or _repeats(arg[2]):
                return True
        elif name == "SUBPATTERN" and _repeats(arg[-1]):
            return True
        elif name == "BRANCH" and any(_repeats(b) for b in arg[1]):
            return True
        elif name in ("ASSERT", "ASSERT_NOT") and _repeats(arg[1]):
            return True
    return False


class _Bounded:
    """Python's ``re`` for a tame pattern, over lines cut to ``window`` characters."""

    def __init__(self, compiled: re.Pattern[str], multiline: bool, window: int) -> None:
        self._re = compiled
        self._multiline = multiline
        self.window = window
        self.pattern = compiled.pattern
        self.groupindex = compiled.groupindex
        self.groups = compiled.groups

    def _pieces(self, text: str) -> Iterator[str]:
        # line by line whatever the flags: the window bounds one line's backtracking, and a
        # pattern that must look across lines cannot be bounded this way
        for line in text.split("\n"):
            yield line[: self.window]

    def search(self, text: str) -> re.Match[str] | None:
        for piece in self._pieces(text):
            found = self._re.search(piece)
            if found:
                return found
        return None

    def match(self, text: str) -> re.Match[str] | None:
        return self._re.match(text[: self.window])

    def fullmatch(self, text: str) -> re.Match[str] | None:
        return self._re.fullmatch(text) if len(text) <= self.window else None

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        for piece in self._pieces(text):
            yield from self._re.finditer(piece)

    def __repr__(self) -> str:
        return f"patterns.compile({self.pattern!r}) [re, first {self.window} characters of a line]"


def _tokens(pattern: str) -> Iterator[tuple[int, str, bool]]:
    """(offset, piece, syntax) over ``pattern``: an escape (two characters, or a \\uXXXX) is
    one piece; ``syntax`` is false for an escape and for anything inside a character class,
    where "(" and ")" are only characters."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            code = pattern[i + 2 : i + 6]
            size = (
                6
                if pattern[i + 1 : i + 2] == "u" and len(code) == 4 and all(c in string.hexdigits for c in code)
                else 2
            )
            yield i, pattern[i : i + size], False
            i += size
            continue
        if in_class:
            in_class = ch != "]" or pattern[i - 1] == "[" or pattern[i - 2 : i] == "[^"
            yield i, ch, False
        else:
            in_class = ch == "["
            yield i, ch, True
        i += 1


def without_captures(pattern: str) -> str:
    """``pattern`` with every capturing group made non-capturing: the same matches, and for
    RE2 a much faster search where only where a match is matters (submatch tracking in a big
    alternation costs more than the scan itself)."""
    out: list[str] = []
    skip_to = 0
    for i, piece, syntax in _tokens(pattern):
        if i < skip_to:
            continue
        if syntax and piece == "(" and pattern.startswith("(?P<", i):
            skip_to = pattern.index(">", i) + 1
            piece = "(?:"
        elif syntax and piece == "(" and not pattern.startswith("(?", i):
            piece = "(?:"
        out.append(piece)
    return "".join(out)


def without_lookaround(pattern: str) -> str:
    """``pattern`` with its look-ahead and look-behind assertions left out, and Python's \\uXXXX
    escapes written as RE2 writes them (\\x{XXXX}): it matches wherever ``pattern`` does (an
    assertion only ever rejects), so it flags a superset of the lines, and RE2 can usually run it
    where it cannot run ``pattern``."""
    out: list[str] = []
    depth, skip_from = 0, None
    for i, piece, syntax in _tokens(pattern):
        if syntax and piece == "(":
            depth += 1
            if skip_from is None and pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                skip_from = depth
        elif syntax and piece == ")":
            depth -= 1
            if skip_from is not None and depth < skip_from:
                skip_from = None
                continue
        if skip_from is None:
            out.append(f"\\x{{{piece[2:]}}}" if len(piece) == 6 else piece)
    return "".join(out)


class PatternSet:
    """Which of many patterns match somewhere in a text, in one pass (RE2's multi-pattern
    search) instead of one search each. Patterns RE2 cannot run are left out: ask them one
    by one."""

    def __init__(self, patterns: Iterable[str], *, multiline: bool = False) -> None:
        self.patterns = [p for p in dict.fromkeys(patterns) if engine(p) == "re2"]
        options = re2.Options()
        options.log_errors = False
        options.max_mem = 2 * _RE2_MEMORY
        self._set = re2.Set.SearchSet(options)
        for pattern in self.patterns:
            self._set.Add(f"(?m){pattern}" if multiline else pattern)
        # always matches: missing from an answer, it says RE2 ran out of memory and gave up
        self._sentinel = self._set.Add(r"\A")
        self._set.Compile()

    def matching(self, text: str | bytes) -> set[str] | None:
        """The patterns that match in ``text``, or None where RE2 could not tell."""
        found = self._set.Match(text) or []
        if self._sentinel not in found:
            return None
        return {self.patterns[i] for i in found if i != self._sentinel}
