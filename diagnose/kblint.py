"""What `diagnose kb lint` checks beyond what loading the rule base already refuses.

- every fix of every rule renders against an empty snapshot (nothing known) and a full one
  (every field of the Facts model present), so a template that reads a missing value without
  ``| default(...)``, or one that fails at all, is caught before a user meets it;
- no log pattern names a GPU model, an architecture or a version that ``kb/tables/`` knows:
  such a rule goes stale with the next GPU or release, where a table fact
  (``gpus.arch``, ``torch.supports_gpu_arch``, ``torch.nccl_known_issue``...) would not;
- every reference is a public https:// address a reader can open.
- no log pattern is searched over only the first few dozen characters of a line (the bounded
  fallback ``probes.patterns`` gives a pattern with look-around and many unbounded repeats).
"""

from __future__ import annotations

import re
import sys
import types
import typing
from functools import cache
from typing import Any

from pydantic import BaseModel

from diagnose.contract import Exit
from diagnose.engine import render_context
from diagnose.kb import KB
from diagnose.rules import FactCheck, LogCheck, Rule, parts
from diagnose.templates import lint_fix
from probes.facts import Facts, KeyedSection
from probes.patterns import compile as compile_pattern

# a version written into a pattern: 2\.4, 12\.[0-7], cu11x, sm_120, +cuda11
_VERSION = re.compile(r"\d\\?\.\[?\d|\bcu(?:\d|\(|\[)|\bsm_\d|\+cuda\d|\bcompute_\d")
# facts holding GPU names: a pattern over them names models the same way a log pattern does
GPU_NAME_FACTS = frozenset({"gpus.devices.name", "gpus.models", "cluster.gpu_models"})
# the full snapshot's values: strings a version parser, a table and a regex all accept, and a
# GPU the tables know, so derived facts (gpus.arch, torch.supports_gpu_arch...) have values too
_SAMPLE_VERSION = "12.4"
_SAMPLE_STRINGS = {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "platform": "linux"}
_SAMPLE_KEYS = {"packages": "2.5.1", "env": "1"}


def _sample(annotation: Any, name: str) -> Any:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        return _sample(args[0], name)
    if origin is typing.Literal:
        return args[0]
    if origin is list:
        return [_sample(args[0], name)]
    if origin is dict:
        return {"sample": _sample(args[1], name)}
    if isinstance(annotation, type) and issubclass(annotation, KeyedSection):
        return annotation(values={"torch": _SAMPLE_KEYS.get(name, "1"), "NCCL_DEBUG": "INFO"}, complete=True)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.model_construct(
            **{field: _sample(info.annotation, field) for field, info in annotation.model_fields.items()}
        )
    if annotation is str:
        return _SAMPLE_STRINGS.get(name, _SAMPLE_VERSION)
    return {bool: True, int: 2, float: 1.5}.get(annotation, None)


@cache
def full_facts() -> Facts:
    """Facts with every field present: what a fix may read from a live, complete snapshot."""
    return Facts.model_validate(_sample(Facts, "facts").model_dump())


def fix_problems(kb: KB) -> list[str]:
    """``RULE: fix 'TITLE': why`` for each fix that cannot be filled in from an empty or a
    full snapshot."""
    contexts = [render_context(Facts()), render_context(full_facts())]
    return [
        f"{rule.id}: fix '{fix.title}': {why}"
        for rule in kb.rules
        for fix in rule.fix
        if (why := lint_fix(fix.snippet, contexts))
    ]


def _patterns(rule: Rule) -> list[str]:
    """The rule's log regexes, and the patterns it tests GPU names with."""
    out, stack = [], [*rule.when, *rule.evidence]
    while stack:
        check = stack.pop()
        stack.extend(parts(check))
        if isinstance(check, LogCheck):
            out.append(check.log)
        elif isinstance(check, FactCheck) and check.fact in GPU_NAME_FACTS and check.regex is not None:
            out.append(check.regex.pattern)
    return out


def _model_words() -> frozenset[str]:
    from probes.tables import shipped

    tables = shipped()
    # brand words stand for gpus.consumer
    words = {c.arch for c in tables.gpus.capabilities} | {"geforce", "titan", "quadro"}
    for model in tables.gpus.models:
        words.add(model.name.lower())
        last = model.name.split()[-1]
        if any(ch.isdigit() for ch in last) and len(last) >= 3:
            words.add(last.lower())
    return frozenset(words)


def naming_offenders(rules: list[Rule]) -> dict[str, list[str]]:
    """Rule id -> ``'PATTERN': what it names`` for each pattern naming what a table knows."""
    words = _model_words()
    found: dict[str, list[str]] = {}
    for rule in rules:
        for pattern in _patterns(rule):
            # class escapes (\b, \d) become spaces so "\bGB200\b" still reads as the word GB200
            plain = re.sub(r"\\[bBdDsSwWAZ]", " ", pattern).replace("\\", "").lower()
            hits = sorted(w for w in words if re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", plain))
            if _VERSION.search(pattern):
                hits.append("a version number")
            if hits:
                found.setdefault(rule.id, []).append(f"{pattern!r}: {', '.join(hits)}")
    return found


# A pattern that needs look-around or a back-reference runs on Python's re over the first `window` characters of each
# line only (probes.patterns: the more unbounded repeats, the shorter); under this it misses what a
# line says after its first words, and no example shows it
MIN_WINDOW = 100


def narrow_patterns(kb: KB) -> list[str]:
    """``RULE: log pattern ...`` for each pattern searched over fewer than MIN_WINDOW characters."""
    out = []
    for rule in kb.rules:
        for pattern in _patterns(rule):
            window = getattr(compile_pattern(pattern), "window", None)
            if window is not None and window < MIN_WINDOW:
                out.append(
                    f"{rule.id}: log pattern {pattern!r} is searched in the first {window} characters of a line only"
                    " (look-around or a back-reference puts it on Python's re, bounded by its unbounded repeats):"
                    " bound its repeats, split it, or do without the look-around"
                )
    return out


def private_references(kb: KB) -> list[str]:
    """``RULE: reference 'REF' ...`` for each reference that is not public https: the loader takes
    any URL, a rule's sources have to be pages a reader can open."""
    return [
        f"{rule.id}: reference {ref!r} is not a public https:// address: cite the thread it came from"
        for rule in kb.rules
        for ref in rule.references
        if not ref.startswith("https://")
    ]


def lint(kb: KB) -> list[str]:
    """Every problem, one line each, naming the rule's file."""
    where = {rule.id: str(kb.files.get(rule.id, rule.id)) for rule in kb.rules}
    problems = [
        f"{where[p.split(':', 1)[0]]}: {p}" for p in fix_problems(kb) + private_references(kb) + narrow_patterns(kb)
    ]
    for rule_id, hits in sorted(naming_offenders(kb.rules).items()):
        problems += [
            f"{where[rule_id]}: {rule_id}: log pattern names what kb/tables/ knows, test a table fact instead: {hit}"
            for hit in hits
        ]
    return problems


def report(kb: KB) -> int:
    """Print each problem on stderr, or that the rules are fine; the exit code of `kb lint`."""
    problems = lint(kb)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"diagnose: error: {len(problems)} problem(s) in the rule base", file=sys.stderr)
        return Exit.USAGE
    print(f"{len(kb.rules)} rules OK")
    return Exit.OK
