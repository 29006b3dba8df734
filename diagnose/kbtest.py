"""Running every rule's examples: the same code behind `diagnose kb test` and the pytest suite."""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from diagnose.engine import evaluate, render_context
from diagnose.kb import KB
from diagnose.rules import Example, Rule
from probes.facts import SCHEMA_VERSION, Facts, KeyedSection
from probes.snapshot import facts_from_dict

_KEYED_META = {"values", "complete", "source", "unavailable"}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _expand_keyed(partial: dict[str, Any]) -> dict[str, Any]:
    """Examples may write ``packages: {deepspeed: "0.14"}``: a complete listing, as live."""
    out = dict(partial)
    for name, field in Facts.model_fields.items():
        value = out.get(name)
        is_keyed = isinstance(field.annotation, type) and issubclass(field.annotation, KeyedSection)
        if is_keyed and isinstance(value, dict) and not set(value) <= _KEYED_META:
            out[name] = {"values": value, "complete": True}
    return out


# neutral noise around a log example: a rule must fire the same far into a long log
PAD_LINE = "[2026-05-01 10:00:00,000] INFO data.py:42 - prefetching shard 17 of 512\n"


def example_facts(example: Example, origin: str = "<example>", keep: Iterable[str] = (), pad: int = 0) -> Facts:
    """The Facts an example describes: its log and report read by the real readers."""
    if example.log is not None or example.report is not None:
        from probes.offline import offline_facts

        reports = [("example-report", example.report)] if example.report is not None else []
        text = example.log
        if text is not None and pad:
            noise = PAD_LINE * pad
            text = noise + text + ("" if text.endswith("\n") else "\n") + noise
        logs = [("example-log", io.StringIO(text))] if text is not None else []
        base = offline_facts(reports=reports, logs=logs, keep=keep).model_dump()
    else:
        base = Facts().model_dump()
    data = _merge(base, _expand_keyed(example.facts))
    data["schema_version"] = SCHEMA_VERSION
    return facts_from_dict(data, origin)


@dataclass
class ExampleResult:
    rule: str
    name: str
    expect: str
    ok: bool
    message: str


def example_name(example: Example, index: int) -> str:
    return example.name or f"{example.expect}-{index}"


def run_example(rule: Rule, example: Example, index: int) -> ExampleResult:
    name = example_name(example, index)
    facts = example_facts(example, f"{rule.id}::{name}")
    kb = KB(rules=[rule], sources=[])
    report = evaluate(facts, kb)
    matched = any(f.basis == "evidence" for f in report.findings)  # its own evidence, not a symptom's prior
    if example.log is not None:
        from probes.log import SHORT_LOG_LINES

        padded = example_facts(example, f"{rule.id}::{name} (padded)", kb.log_literals, SHORT_LOG_LINES)
        if any(f.basis == "evidence" for f in evaluate(padded, kb).findings) != matched:
            return ExampleResult(
                rule.id,
                name,
                example.expect,
                False,
                f"{'matched' if matched else 'did not match'} as written but not inside a long log",
            )
    context = render_context(facts)
    for fix in rule.fix:
        try:
            fix.template.render(context)
        except Exception as exc:  # a template bug of any kind fails the example
            return ExampleResult(rule.id, name, example.expect, False, f"fix '{fix.title}' does not render: {exc}")
    if example.expect == "match":
        ok, why = matched, "did not match" if not matched else "matched"
        if not matched:
            outcome = report.ruled_out + report.possible + report.not_checked
            if outcome:
                why += (
                    f" ({outcome[0].reason}"
                    + (f"; unknown: {', '.join(outcome[0].missing)}" if outcome[0].missing else "")
                    + ")"
                )
    elif example.expect == "no-match":
        ok, why = not matched, f"matched with score {report.findings[0].score:g}" if matched else "did not match"
    else:  # known-miss documents a gap; it fails once the rule catches it, so it gets promoted
        ok, why = not matched, "now matches: make it a match example" if matched else "still a known miss"
    return ExampleResult(rule.id, name, example.expect, ok, why)


def run_signature_example(sig_id: str, kind: str, index: int, line: str) -> ExampleResult:
    """One example line of the signature catalog, read by the real log reader alone; a
    signature's first match example also in the middle of a log far past the short-log size
    (where only relevant lines are kept), one long log per signature to keep the run short."""
    from probes.log import SHORT_LOG_LINES, log_from_text

    expect = "match" if kind == "match" else "no-match"
    name = f"{expect}-{index}"
    found = sig_id in log_from_text(line).signature_ids
    if found != (kind == "match"):
        return ExampleResult(
            f"signature {sig_id}", name, expect, False, f"{'matched' if found else 'did not match'}: {line!r}"
        )
    if found and index == 0:
        noise = PAD_LINE * SHORT_LOG_LINES
        if sig_id not in log_from_text(noise + line + "\n" + noise).signature_ids:
            return ExampleResult(f"signature {sig_id}", name, expect, False, f"not found inside a long log: {line!r}")
    return ExampleResult(f"signature {sig_id}", name, expect, True, "matched" if found else "did not match")


def signature_examples() -> list[tuple[str, str, int, str]]:
    """(signature id, 'match' or 'no_match', index, line) for every example of the catalog."""
    from probes.signatures import shipped

    return [
        (sig.id, kind, i, line)
        for sig in shipped().signatures.values()
        for kind, lines in (("match", sig.examples.match), ("no_match", sig.examples.no_match))
        for i, line in enumerate(lines)
    ]


def run_all(kb: KB, signatures: bool = True) -> list[ExampleResult]:
    """Every rule's examples, then (unless ``signatures`` is false) every example line of the
    signature catalog."""
    rules = [run_example(rule, ex, i) for rule in kb.rules for i, ex in enumerate(rule.examples)]
    return rules + ([run_signature_example(*example) for example in signature_examples()] if signatures else [])
