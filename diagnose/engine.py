"""Matching: (facts, rules) -> Report. Pure, deterministic, no I/O.

Every check is three-valued (fired, not fired, unknown). A rule's score is the sum of the
weights of the evidence that fired; rules are ranked by score, then severity, then id.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from jinja2 import meta, nodes
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from diagnose import __version__
from diagnose.kb import KB
from diagnose.paths import lookup
from diagnose.report import (
    EvidenceItem,
    Finding,
    RenderedFix,
    Report,
    RuleOutcome,
    Summary,
    SymptomSeen,
)
from diagnose.rules import (
    SEVERITY_ORDER,
    AllCheck,
    AnyCheck,
    FactCheck,
    HangCheck,
    LogCheck,
    MicrotestCheck,
    Rule,
    SignatureCheck,
)
from diagnose.templates import render_fix
from probes.facts import Facts
from probes.signatures import shipped as shipped_catalog
from probes.symptoms import observe

FIRED, NOT_FIRED, UNKNOWN = "fired", "not_fired", "unknown"
EXCERPTS = 3
# A candidate's prior (0..1) counts like this much evidence: enough to order the causes of a
# symptom among themselves, never enough to outrank a cause whose own evidence fired.
PRIOR_WEIGHT = 2.0
# candidates shown for the observed symptoms without evidence of their own, most common first
MAX_CANDIDATES = 5
# how a rule that raised while evaluated is reported (among the rules not checked)
RULE_ERROR = "internal.rule-error"


@dataclass
class _Context:
    """Per-evaluation caches shared by all rules over one Facts."""

    facts: Facts
    kb: KB
    paths: dict[str, tuple[bool, Any]] = field(default_factory=dict)
    literal_lines: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    # results of checks that several rules share (the same fact test, the same log pattern)
    results: dict[Any, _Result] = field(default_factory=dict)

    def fact(self, path: str) -> tuple[bool, Any]:
        if path not in self.paths:
            self.paths[path] = lookup(self.facts, path)
        return self.paths[path]

    @cached_property
    def render(self) -> dict[str, Any]:
        """What fix templates see; built once, for the first rule that becomes a finding."""
        return render_context(self.facts)

    @cached_property
    def signatures(self) -> dict[str, list[Any]] | None:
        """The log's signatures by id, in log order (one pass, not one per signature check)."""
        signatures = self.facts.log.signatures
        if signatures is None:
            return None
        found: dict[str, list[Any]] = {}
        for signature in signatures:
            found.setdefault(signature.id, []).append(signature)
        return found

    @cached_property
    def log_text(self) -> str | None:
        lines = self.facts.log.lines
        return None if lines is None else "\n".join(line.text for line in lines)

    @cached_property
    def log_matching(self) -> set[str] | None:
        """The rules' log patterns that match somewhere in the log (one pass for all of them),
        or None where that could not be told."""
        return self.kb.log_patterns.matching(self.log_bytes)

    @cached_property
    def log_bytes(self) -> bytes:
        """The joined log as UTF-8, encoded once for every RE2 search of it."""
        return (self.log_text or "").encode("utf-8", errors="surrogatepass")

    @cached_property
    def _lowered(self) -> tuple[str, list[int]]:
        """The log lowercased, and where each line starts in it (lowering may change lengths)."""
        starts, offset = [], 0
        lowered = [line.text.lower() for line in self.facts.log.lines or []]
        for text in lowered:
            starts.append(offset)
            offset += len(text) + 1
        return "\n".join(lowered), starts

    def lines_containing(self, literals: tuple[str, ...]) -> list[int]:
        """Indexes of the lines holding any of the literals: a C-speed find, no regex."""
        if literals not in self.literal_lines:
            text, starts = self._lowered
            found: set[int] = set()
            for literal in literals:
                at = text.find(literal)
                while at != -1:
                    index = bisect_right(starts, at) - 1
                    found.add(index)
                    # continue after this line: one hit per line is enough
                    at = text.find(literal, starts[index + 1]) if index + 1 < len(starts) else -1
            self.literal_lines[literals] = sorted(found)
        return self.literal_lines[literals]


@dataclass(slots=True)
class _Result:
    state: str
    observed: Any = None
    lines: list[str] = field(default_factory=list)


# the commonest results, shared (a result is never changed once made); their evidence items are
# made once per check (_Plan.items)
_UNKNOWN = _Result(UNKNOWN)
_NO_LOG_MATCH = _Result(NOT_FIRED, 0)  # no line and no signature of the log


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _version(value: Any) -> Version | None:
    return _parse_version(str(value))


@functools.lru_cache(maxsize=4096)
def _parse_version(text: str) -> Version | None:
    """Versions repeat across snapshots (a few torch, driver and CUDA releases): parsed once."""
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _holds(check: FactCheck, value: Any) -> bool:
    """One scalar observation against the check's operator."""
    op, want = check.op, check.operand
    if op == "eq":
        return value == want
    if op == "ne":
        return value != want
    if op in ("lt", "le", "gt", "ge"):
        number = _number(value)
        if number is None:
            return False
        return {"lt": number < want, "le": number <= want, "gt": number > want, "ge": number >= want}[op]
    if op == "in":
        return value in want
    if op == "not_in":
        return value not in want
    if op == "matches":
        return check.regex.search(str(value)) is not None
    if op == "not_matches":
        return check.regex.search(str(value)) is None
    if op == "contains":
        return want in value if isinstance(value, (str, list)) else False
    if op == "version":
        version = _version(value)
        return version is not None and check.specifier.contains(version, prereleases=True)
    raise AssertionError(op)  # pragma: no cover - FACT_OPS is closed


_ALL_ELEMENTS = ("ne", "not_in", "not_matches")


def _fact(check: FactCheck, ctx: _Context) -> _Result:
    result = ctx.results.get(check.key)
    if result is None:
        result = ctx.results[check.key] = _fact_result(check, ctx)
    return result


def _fact_result(check: FactCheck, ctx: _Context) -> _Result:
    known, value = ctx.fact(check.fact)
    if check.op == "exists":
        if not known:
            return _UNKNOWN
        present = value is not None and value != []
        return _Result(FIRED if present == check.exists else NOT_FIRED, value)
    if not known or value is None:
        return _UNKNOWN
    if isinstance(value, list) and check.op != "contains":
        if not value:
            return _Result(NOT_FIRED, value)
        results = [_holds(check, v) for v in value]
        held = all(results) if check.op in _ALL_ELEMENTS else any(results)
    else:
        held = _holds(check, value)
    return _Result(FIRED if held else NOT_FIRED, value)


def _log(check: LogCheck, ctx: _Context) -> _Result:
    result = ctx.results.get(check.log)
    if result is None:
        result = ctx.results[check.log] = _log_result(check, ctx)
    return result


def _log_result(check: LogCheck, ctx: _Context) -> _Result:
    lines = ctx.facts.log.lines
    if lines is None:
        return _UNKNOWN
    matching = ctx.log_matching if check.on_re2 else None
    if matching is not None:
        if check.log not in matching:
            return _NO_LOG_MATCH  # most log checks end here: one pass answered them all
    elif (
        check.whole_text is not None
        and check.whole_text.search(ctx.log_bytes if check.on_re2 else ctx.log_text) is None
    ):
        return _NO_LOG_MATCH
    if check.literals is not None:
        # every match lies within one line and holds one of the literals: test only those lines
        candidates = [lines[i] for i in ctx.lines_containing(check.literals)]
    else:
        candidates = lines
    hits = [line for line in candidates if check.regex.search(line.text)]
    if not hits:
        return _NO_LOG_MATCH
    return _Result(FIRED, len(hits), [_excerpt(h.no, h.rank, h.text) for h in hits[:EXCERPTS]])


def _excerpt(no: int, rank: int | None, text: str) -> str:
    where = f"line {no}" + (f", rank {rank}" if rank is not None else "")
    return f"{where}: {text.strip()[:300]}"


def _signature(check: SignatureCheck, ctx: _Context) -> _Result:
    found = ctx.signatures
    if found is None:
        return _UNKNOWN
    hits = found.get(check.signature)
    if not hits:
        return _NO_LOG_MATCH
    return _Result(FIRED, len(hits), [_excerpt(s.line, s.rank, s.excerpt) for s in hits[:EXCERPTS]])


def _microtest(check: MicrotestCheck, ctx: _Context) -> _Result:
    test = getattr(ctx.facts.microtests, check.microtest)
    if test is None:
        return _UNKNOWN
    status = test.status if check.variant is None else test.variants.get(check.variant)
    if status is None or (status == "skipped" and "skipped" not in check.status):
        return _UNKNOWN  # a test that did not run is no evidence either way
    return _Result(FIRED if status in check.status else NOT_FIRED, status)


def _hang(check: HangCheck, ctx: _Context) -> _Result:
    ranks = ctx.facts.hang.ranks
    if not ranks:
        return _UNKNOWN
    places = [r.waiting_in or "unknown" for r in ranks]
    hits = [bool(check.regex.search(p)) for p in places]
    held = {"any": any(hits), "all": all(hits), "some": any(hits) and not all(hits)}[check.ranks]
    # where each rank waits, matching ranks first: the code line a fix has to change
    lines = (
        [_hang_line(r) for _, r in sorted(zip(hits, ranks, strict=True), key=lambda p: not p[0])][:8] if held else []
    )
    return _Result(FIRED if held else NOT_FIRED, sorted(set(places)), lines)


def _hang_line(stack) -> str:
    who = f"rank {stack.rank}" if stack.rank is not None else f"pid {stack.pid}"
    frame = stack.user_frame
    where = f" at {frame.file}:{frame.line}" + (f" in {frame.function}" if frame.function else "") if frame else ""
    return f"{who}: {stack.waiting_in or 'unknown'}{where}"


def _any(check: AnyCheck, ctx: _Context) -> _Result:
    states = [_evaluate(c, ctx).state for c in check.any]
    if FIRED in states:
        return _Result(FIRED)
    return _Result(UNKNOWN if UNKNOWN in states else NOT_FIRED)


def _all(check: AllCheck, ctx: _Context) -> _Result:
    states = [_evaluate(c, ctx).state for c in check.all]
    if NOT_FIRED in states:
        return _Result(NOT_FIRED)
    return _Result(UNKNOWN if UNKNOWN in states else FIRED)


_EVALUATORS = {
    FactCheck: _fact,
    LogCheck: _log,
    SignatureCheck: _signature,
    MicrotestCheck: _microtest,
    HangCheck: _hang,
    AnyCheck: _any,
    AllCheck: _all,
}


def _evaluate(check: Any, ctx: _Context) -> _Result:
    return _EVALUATORS[type(check)](check, ctx)


_SHARED_RESULTS = frozenset({id(_UNKNOWN), id(_NO_LOG_MATCH)})


def _item(plan: _Plan, check: Any, result: _Result) -> EvidenceItem:
    if id(result) in _SHARED_RESULTS:
        key = (id(check), id(result))
        item = plan.items.get(key)
        if item is None:
            item = plan.items[key] = _new_item(check, result)
        return item
    return _new_item(check, result)


def _new_item(check: Any, result: _Result) -> EvidenceItem:
    kind, what, expected = check.display
    return EvidenceItem(
        kind=kind,
        what=what,
        expected=expected,
        observed=result.observed,
        state=result.state,
        weight=check.weight,
        label=check.label,
        lines=result.lines,
    )


def _needs(checks: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.need for c in checks))


def _confidence(score: float, gate_unknown: bool) -> str:
    levels = ["low", "medium", "high"]
    level = 2 if score >= 6 else 1 if score >= 3 else 0
    return levels[max(0, level - 1) if gate_unknown else level]


def render_context(facts: Facts) -> dict[str, Any]:
    launcher, gpus = facts.launcher, facts.gpus
    nproc = launcher.world_size or launcher.devices_requested or gpus.count or 2
    return {"facts": facts, "packages": facts.packages.values, "env": facts.env.values, "nproc": nproc}


def render_fixes(rule: Rule, context: dict[str, Any]) -> list[RenderedFix]:
    fixes = []
    for fix in rule.fix:
        # a template that cannot render on these facts still shows its source, with why
        snippet = _reused_render(fix, context)
        if snippet is None:
            snippet = render_fix(fix.snippet, fix.template, context)
        fixes.append(RenderedFix(title=fix.title, kind=fix.kind, language=fix.language, snippet=snippet))
    return fixes


# what a template may read besides the facts: small values, so a render is reused by them
_SMALL_INPUTS = ("nproc", "packages", "env")


@functools.lru_cache(maxsize=1024)
def _template_inputs(snippet: str, environment: Any) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]] | None:
    """What a fix's template reads: the small inputs it names and the attribute chains it
    follows from ``facts`` (``facts.gpus.count`` -> ("gpus", "count")); None when it reads
    the facts any other way (a loop over ranks, ``facts`` passed whole), so it must render
    for each snapshot."""
    tree = environment.parse(snippet)
    names = meta.find_undeclared_variables(tree)
    if not names <= {*_SMALL_INPUTS, "facts"}:
        return None
    inner = {id(node.node) for node in tree.find_all(nodes.Getattr)}
    chains = []
    for node in tree.find_all(nodes.Getattr):
        if id(node) in inner:
            continue  # a step of a longer chain
        chain: list[str] = []
        while isinstance(node, nodes.Getattr):
            chain.insert(0, node.attr)
            node = node.node
        if isinstance(node, nodes.Name) and node.name == "facts":
            chains.append(tuple(chain))
    uses = sum(1 for n in tree.find_all(nodes.Name) if n.name == "facts")
    if uses != len(chains) or any(part.startswith("_") for chain in chains for part in chain):
        return None
    return tuple(n for n in _SMALL_INPUTS if n in names), tuple(dict.fromkeys(chains))


_PLAIN = (str, int, float, bool, type(None))


def _frozen(value: Any) -> Any:
    """A value read as part of a cache key: plain values, lists of them as tuples; anything
    else (a model, a method) is no key (TypeError) and the template renders in the sandbox."""
    if isinstance(value, list) and all(isinstance(v, _PLAIN) for v in value):
        return tuple(value)
    if isinstance(value, _PLAIN):
        return value
    raise TypeError(f"{type(value).__name__} is not a plain value")


def _reused_render(fix: Any, context: dict[str, Any]) -> str | None:
    """The fix rendered, reused across snapshots when its template reads only small inputs and
    plain values at the end of ``facts.`` chains (the same values render the same), or None
    when it must be rendered for these facts."""
    try:
        found = _template_inputs(fix.snippet, fix.template.environment)
    except Exception:  # noqa: BLE001 - a template that does not parse renders (and says why) below
        return None
    if found is None:
        return None
    inputs, chains = found
    try:
        small = tuple(context[n] if n == "nproc" else tuple(context[n].items()) for n in inputs)
        read = tuple(_frozen(_follow(context["facts"], chain)) for chain in chains)
        return _rendered(fix.snippet, fix.template, inputs, small, chains, read)
    except TypeError:  # a value that cannot be a key: render it for these facts
        return None


def _follow(node: Any, chain: tuple[str, ...]) -> Any:
    """The value at the end of a chain, through model fields and properties only (what the
    sandbox would let the template read); TypeError for any other step."""
    for part in chain:
        if node is None:
            return None  # the template's own ``facts.cluster and ...`` guards stop here too
        model = type(node)
        if not isinstance(node, BaseModel) or not (
            part in model.model_fields or isinstance(getattr(model, part, None), property)
        ):
            raise TypeError(f"{model.__name__}.{part} is not a fact")
        node = getattr(node, part)
    return node


@functools.lru_cache(maxsize=4096)
def _rendered(
    snippet: str,
    template: Any,
    inputs: tuple[str, ...],
    small: tuple[Any, ...],
    chains: tuple[tuple[str, ...], ...],
    read: tuple[Any, ...],
) -> str:
    values: dict[str, Any] = {n: v if n == "nproc" else dict(v) for n, v in zip(inputs, small, strict=True)}
    if chains:
        values["facts"] = _Read(chains, read)
    return render_fix(snippet, template, values)


class _Read:
    """Stands for the facts in a reused render: exactly the chains the template follows, with
    the values read from the snapshot that filled the cache."""

    def __init__(self, chains: tuple[tuple[str, ...], ...], read: tuple[Any, ...]) -> None:
        self._values = dict(zip(chains, read, strict=True))
        self._prefix: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        path = (*self._prefix, name)
        if path in self._values:
            value = self._values[path]
            return list(value) if isinstance(value, tuple) else value
        step = _Read.__new__(_Read)
        step._values, step._prefix = self._values, path
        return step


def _rank_key(finding: Finding) -> tuple:
    return (-finding.score, SEVERITY_ORDER[finding.severity], finding.id)


def _explains(rule: Rule, symptom: str) -> bool:
    """A rule explains an observed symptom it names, one the symptom refines ("hang" for
    "hang.init") or, for a vague observation, a refinement of it ("hang.init" for "hang")."""
    return any(e == symptom or e.startswith(symptom + ".") or symptom.startswith(e + ".") for e in rule.explains)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the engine needs of a rule that depends on the rule alone, worked out once."""

    rule: Rule
    gate: tuple[tuple[Any, Any, Any], ...]  # (check, evaluator, key of its shared result or None)
    evidence: tuple[tuple[Any, Any, Any, bool], ...]  # (check, evaluator, key, weight > 0)
    # the most the evidence after each one can still add: past the point where the score can no
    # longer reach min_score, a rule explaining no observed symptom cannot become a finding
    reachable: tuple[float, ...]
    explains: dict[str, bool] = field(default_factory=dict)  # observed symptom -> explained
    # report entries that depend on the rule alone (immutable models, shared between reports):
    # (reason, unknown checks) -> outcome; (check, shared result) -> evidence item
    outcomes: dict[tuple[str, tuple[int, ...]], RuleOutcome] = field(default_factory=dict)
    items: dict[tuple[int, int], EvidenceItem] = field(default_factory=dict)


def _step(check: Any) -> tuple[Any, Any, Any]:
    """How the hot loop evaluates a check: the uncached evaluator and the key its result is
    shared under (the same as ``_fact`` and ``_log`` use), or the evaluator itself."""
    if type(check) is FactCheck:
        return check, _fact_result, check.key
    if type(check) is LogCheck:
        return check, _log_result, check.log
    if type(check) is SignatureCheck:
        return check, _signature, ("signature", check.signature)
    if type(check) is AnyCheck:
        # the same group (a GPU or NCCL in play) gates many rules: shared when its checks are
        keys = tuple(_step(c)[2] for c in check.any)
        return check, _any, ("any", keys) if None not in keys else None
    return check, _EVALUATORS[type(check)], None


# rule id() -> its plan; a plan holds its rule, so an id stays its rule's while it is here
_PLANS: dict[int, _Plan] = {}
_MAX_PLANS = 20_000  # forgotten all at once past this many (KBs loaded again and again)


def _plan(rule: Rule) -> _Plan:
    plans = _PLANS
    plan = plans.get(id(rule))
    if plan is None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        weights = [c.weight for c in rule.evidence]
        reachable = tuple(sum(w for w in weights[i + 1 :] if w > 0) for i in range(len(weights)))
        plan = plans[id(rule)] = _Plan(
            rule,
            tuple(_step(c) for c in rule.when),
            tuple((*_step(c), c.weight > 0) for c in rule.evidence),
            reachable,
        )
    return plan


def _result(check: Any, evaluator: Any, key: Any, ctx: _Context) -> _Result:
    if key is None:
        return evaluator(check, ctx)
    result = ctx.results.get(key)
    if result is None:
        result = ctx.results[key] = evaluator(check, ctx)
    return result


def _unknown(check: Any, evaluator: Any, key: Any, ctx: _Context) -> bool:
    """Whether a check's state is unknown, without searching the log when only that matters."""
    if evaluator is _log_result:
        return ctx.facts.log.lines is None
    if evaluator is _signature:
        return ctx.facts.log.signatures is None
    return _result(check, evaluator, key, ctx).state == UNKNOWN


def _explained(plan: _Plan, observed: dict[str, list[str]]) -> list[str]:
    explains = plan.explains
    found = []
    for symptom in observed:
        hit = explains.get(symptom)
        if hit is None:
            hit = explains[symptom] = _explains(plan.rule, symptom)
        if hit:
            found.append(symptom)
    return found


def _judge(plan: _Plan, ctx: _Context, observed: dict[str, list[str]]) -> tuple[str, Any]:
    """One rule over the facts: which list of the report it joins, and its entry there."""
    rule = plan.rule
    gate, gate_unknown = [], []
    for check, evaluator, key in plan.gate:  # the first condition that fails settles the rule
        result = _result(check, evaluator, key, ctx)
        if result.state == NOT_FIRED:
            kind, what, expected = check.display
            return "ruled_out", _outcome(plan, f"{what} is not {expected}")
        gate.append((check, result))
        if result.state == UNKNOWN:
            gate_unknown.append(check)
    explained = _explained(plan, observed)
    results, unknown, score, fired = [], [], 0.0, False
    settled = False  # whether the evidence left can still make the rule a finding
    cache = ctx.results
    # the rules' log patterns that match somewhere in the log: a check on any other needs no call
    matching = ctx.log_matching if ctx.facts.log.lines is not None else None
    for i, (check, evaluator, key, positive) in enumerate(plan.evidence):  # the engine's hot path
        if settled:
            if positive and _unknown(check, evaluator, key, ctx):
                unknown.append(check)
            continue
        if key is None:
            result = evaluator(check, ctx)
        elif evaluator is _log_result and matching is not None and key not in matching and check.on_re2:
            result = _NO_LOG_MATCH
        else:
            result = cache.get(key)
            if result is None:
                result = cache[key] = evaluator(check, ctx)
        results.append((check, result))
        if result.state == FIRED:
            score += check.weight
            fired = fired or positive
        elif result.state == UNKNOWN and positive:
            unknown.append(check)
        settled = not explained and score + plan.reachable[i] < rule.min_score - 1e-9
    score = round(score, 3)
    decisive = fired and score >= rule.min_score
    if decisive or (explained and score >= 0):
        total = round(score + (PRIOR_WEIGHT * rule.prior if explained else 0.0), 3)

        def finding() -> Finding:
            return Finding(
                id=rule.id,
                title=rule.title,
                severity=rule.severity,
                score=total,
                confidence=_confidence(total, bool(gate_unknown)) if decisive else "low",
                basis="evidence" if decisive else "symptom",
                explains=explained,
                check=rule.check,
                explain=rule.explain.strip(),
                evidence=[_item(plan, c, r) for c, r in results],
                gate=[_item(plan, c, r) for c, r in gate],
                missing=list(_needs(gate_unknown + unknown)),
                fixes=render_fixes(rule, ctx.render),
                references=list(rule.references),
            )

        if decisive:
            return "findings", finding()
        # a candidate's report entry is built only if it ranks among those shown
        return "candidates", ((-total, SEVERITY_ORDER[rule.severity], rule.id), rule, finding)
    if not unknown:
        return "ruled_out", _outcome(plan, "none of its evidence was seen")
    if rule.when and not gate_unknown:
        return "possible", _outcome(plan, "its conditions hold; its evidence could not be checked", unknown)
    return "not_checked", _outcome(plan, "the facts it needs are unknown", gate_unknown + unknown)


def _guarded(rule: Rule, kb: KB, judge: Any) -> tuple[str, Any]:
    """``judge()``, or, when the rule raises, its entry among the rules not checked (rule id,
    file and error in one line): one broken rule must not cost the whole diagnosis."""
    try:
        return judge()
    except Exception as exc:  # noqa: BLE001 - the boundary itself
        where = kb.files.get(rule.id, "(no file)")
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        return "not_checked", _outcome(_plan(rule), f"{RULE_ERROR}: {where}: {why}")


def evaluate(facts: Facts, kb: KB) -> Report:
    ctx = _Context(facts, kb)
    observed = observe(facts)
    findings: list[Finding] = []
    candidates: list[Finding] = []
    possible: list[RuleOutcome] = []
    not_checked: list[RuleOutcome] = []
    ruled_out: list[RuleOutcome] = []

    buckets: dict[str, list] = {
        "findings": findings, "candidates": candidates, "possible": possible,
        "not_checked": not_checked, "ruled_out": ruled_out,
    }  # fmt: skip
    for rule in kb.rules:
        bucket, entry = _guarded(rule, kb, lambda rule=rule: _judge(_plan(rule), ctx, observed))
        buckets[bucket].append(entry)

    candidates.sort(key=lambda candidate: candidate[0])
    findings.sort(key=_rank_key)
    for _, rule, finding in candidates[:MAX_CANDIDATES]:  # after every cause whose own evidence fired
        bucket, entry = _guarded(rule, kb, lambda finding=finding: ("findings", finding()))
        buckets[bucket].append(entry)
    for _, rule, _ in candidates[MAX_CANDIDATES:]:
        possible.append(_outcome(_plan(rule), "a less common cause of the observed symptoms"))
    symptoms = shipped_catalog().symptoms
    seen = [
        SymptomSeen(id=s, title=symptoms[s].title, check=symptoms[s].check.strip(), shown_by=sources)
        for s, sources in sorted(observed.items())
    ]
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    return Report.model_construct(
        schema_version=Report.model_fields["schema_version"].default,
        tool={"name": "lightning-diagnose", "version": __version__},
        summary=Summary(
            errors=counts["error"],
            warnings=counts["warning"],
            infos=counts["info"],
            top=findings[0].id if findings else None,
            rules=len(kb.rules),
        ),
        symptoms=seen,
        findings=findings,
        possible=possible,
        not_checked=not_checked,
        ruled_out=ruled_out,
        probe_errors=list(facts.errors),
        skipped=list(facts.skipped),
        facts=facts,
    )


def _outcome(plan: _Plan, reason: str, unknown: list[Any] | tuple = ()) -> RuleOutcome:
    """The rule's entry among those not found, naming what the ``unknown`` checks need; the same
    reason and checks give the same (immutable) entry."""
    key = (reason, tuple(map(id, unknown)))
    outcome = plan.outcomes.get(key)
    if outcome is None:
        if len(plan.outcomes) >= 64:  # reasons naming values (a rule error) must not pile up
            plan.outcomes.clear()
        rule = plan.rule
        outcome = plan.outcomes[key] = RuleOutcome(
            id=rule.id, title=rule.title, severity=rule.severity, reason=reason, missing=_needs(unknown)
        )
    return outcome
