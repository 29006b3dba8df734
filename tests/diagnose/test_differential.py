"""The differential: which causes an observed symptom makes candidates."""

from __future__ import annotations

from diagnose.engine import evaluate
from diagnose.kb import KB
from diagnose.rules import Rule
from probes.offline import offline_facts


def _rule(rule_id: str, explains: list[str]) -> Rule:
    return Rule.model_validate(
        {
            "id": rule_id,
            "title": rule_id,
            "severity": "error",
            "explains": explains,
            "prior": 0.5,
            "evidence": [{"log": "never printed by anything", "weight": 5}],
            "min_score": 5,
            "explain": "why",
            "fix": [{"title": "fix", "snippet": "x"}],
            "references": ["https://example.org/1"],
            "examples": [{"expect": "match"}, {"expect": "no-match"}],
        }
    )


KB_ = KB(
    rules=[
        _rule("t.any-hang", ["hang"]),
        _rule("t.init-hang", ["hang.init"]),
        _rule("t.collective-hang", ["hang.collective"]),
    ],
    sources=[],
)


def _candidates(text: str) -> set[str]:
    report = evaluate(offline_facts(logs=[("log", text.splitlines(True))]), KB_)
    return {f.id for f in report.findings if f.basis == "symptom"}


def test_a_specific_symptom_keeps_causes_of_its_kind_and_of_the_vaguer_one():
    assert _candidates("the job is stuck at init, before the first step\n") == {"t.any-hang", "t.init-hang"}


def test_a_vague_symptom_keeps_every_refinement():
    assert _candidates("the job hangs\n") == {"t.any-hang", "t.init-hang", "t.collective-hang"}
