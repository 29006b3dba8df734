"""The engine's semantics: three-valued checks, scores, ranking, outcomes, rendering."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from diagnose.engine import evaluate
from diagnose.kb import KB, load_kb
from diagnose.rules import Rule
from probes.facts import Facts, Gpu, Gpus, Log, LogLine, MicroTest, MicroTests
from probes.snapshot import load_snapshot

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"


def rule(
    rule_id: str = "t.rule", *, when=(), evidence, min_score: float = 1, severity: str = "error", snippet: str = "x"
) -> Rule:
    return Rule.model_validate(
        {
            "id": rule_id,
            "title": rule_id,
            "severity": severity,
            "explains": ["crash.nccl"],
            "when": list(when),
            "evidence": list(evidence),
            "min_score": min_score,
            "explain": "why",
            "fix": [{"title": "fix", "snippet": snippet}],
            "references": ["https://example.org/1"],
            "examples": [{"expect": "match"}, {"expect": "no-match"}],
        }
    )


def kb(*rules: Rule) -> KB:
    return KB(rules=list(rules), sources=[])


def gpus(*names: str) -> Gpus:
    return Gpus(count=len(names), devices=[Gpu(index=i, name=n) for i, n in enumerate(names)])


def with_log(*lines: str) -> Facts:
    return Facts(log=Log(lines=[LogLine(no=i + 1, text=t) for i, t in enumerate(lines)], signatures=[]))


def test_unknown_fact_is_not_checked_not_ruled_out():
    report = evaluate(Facts(), kb(rule(evidence=[{"fact": "gpus.count", "ge": 2}])))
    assert not report.findings and not report.ruled_out
    assert report.not_checked[0].missing == ("gpus.count",)


def test_gate_false_rules_out_with_reason():
    r = rule(when=[{"fact": "gpus.count", "ge": 2}], evidence=[{"log": "x"}])
    report = evaluate(Facts(gpus=gpus("A")), kb(r))
    assert report.ruled_out[0].reason == "gpus.count is not >= 2"


def test_gate_holds_but_evidence_unknown_is_possible():
    r = rule(when=[{"fact": "gpus.count", "ge": 1}], evidence=[{"log": "x"}])
    assert [o.id for o in evaluate(Facts(gpus=gpus("A")), kb(r)).possible] == ["t.rule"]


def test_all_evidence_known_and_absent_is_ruled_out():
    report = evaluate(with_log("all good"), kb(rule(evidence=[{"log": "NCCL WARN"}])))
    assert report.ruled_out[0].reason == "none of its evidence was seen"


def test_score_sums_fired_weights_and_ranks():
    low = rule("a.low", evidence=[{"log": "warn", "weight": 2}])
    high = rule("b.high", evidence=[{"log": "warn", "weight": 2}, {"log": "fatal", "weight": 5}], severity="warning")
    report = evaluate(with_log("warn: x", "fatal: y"), kb(low, high))
    assert [(f.id, f.score, f.confidence) for f in report.findings] == [("b.high", 7, "high"), ("a.low", 2, "low")]
    assert report.summary.top == "b.high"


def test_ties_break_on_severity_then_id():
    a = rule("z.err", evidence=[{"log": "x"}])
    b = rule("a.warn", evidence=[{"log": "x"}], severity="warning")
    c = rule("b.err", evidence=[{"log": "x"}])
    assert [f.id for f in evaluate(with_log("x"), kb(a, b, c)).findings] == ["b.err", "z.err", "a.warn"]


def test_negative_weight_counts_against():
    r = rule(evidence=[{"log": "torch.load", "weight": 3}, {"log": "map_location", "weight": -3}], min_score=1)
    assert not evaluate(with_log("torch.load(p, map_location='cpu')"), kb(r)).findings
    assert evaluate(with_log("torch.load(p)"), kb(r)).findings


def test_min_score_keeps_weak_hints_out():
    r = rule(evidence=[{"log": "hint", "weight": 1}, {"log": "proof", "weight": 5}], min_score=4)
    assert not evaluate(with_log("hint"), kb(r)).findings


def test_an_all_group_weighs_once_and_only_when_every_part_holds():
    both = {"all": [{"fact": "gpus.count", "ge": 2}, {"log": "hostfile"}], "weight": 3}
    r = rule(evidence=[both], min_score=3)
    assert [f.score for f in evaluate(Facts(gpus=gpus("A", "B"), log=with_log("no hostfile").log), kb(r)).findings] == [
        3
    ]
    # one part false: the group is false, whatever the other
    assert not evaluate(Facts(gpus=gpus("A"), log=with_log("no hostfile").log), kb(r)).findings
    # one part unknown and none false: not checked, not ruled out
    report = evaluate(with_log("no hostfile"), kb(r))
    assert not report.findings and not report.ruled_out
    with pytest.raises(ValidationError, match="plain checks"):
        rule(evidence=[{"all": [{"log": "a"}, {"any": [{"log": "b"}]}]}])


def test_list_facts_match_any_element_and_regex():
    r = rule(evidence=[{"fact": "gpus.devices.name", "matches": "(?i)rtx 3090"}])
    assert evaluate(Facts(gpus=gpus("A100", "NVIDIA GeForce RTX 3090")), kb(r)).findings
    assert not evaluate(Facts(gpus=gpus("A100", "A100")), kb(r)).findings


def test_version_specifier_and_keyed_sections():
    r = rule(evidence=[{"fact": "packages.torch", "version": ">=2.0,<2.3"}])
    facts = Facts()
    facts.packages.values["torch"] = "2.1.2+cu121"
    assert evaluate(facts, kb(r)).findings
    facts.packages.values["torch"] = "2.6.0"
    assert not evaluate(facts, kb(r)).findings


def test_exists_distinguishes_absent_from_unknown():
    r = rule(evidence=[{"fact": "packages.deepspeed", "exists": False}])
    facts = Facts()
    assert evaluate(facts, kb(r)).not_checked  # not listed at all: unknown
    facts.packages.complete = True
    assert evaluate(facts, kb(r)).findings  # a complete listing without it: absent


def test_microtest_and_variant_checks():
    r = rule(
        evidence=[
            {"microtest": "all_reduce", "status": "timed_out", "weight": 2},
            {"microtest": "all_reduce", "variant": "p2p_disabled", "status": "passed", "weight": 5},
        ]
    )
    tests = MicroTests(all_reduce=MicroTest(status="timed_out", variants={"p2p_disabled": "passed"}))
    finding = evaluate(Facts(microtests=tests), kb(r)).findings[0]
    assert finding.score == 7
    assert [e.state for e in finding.evidence] == ["fired", "fired"]


def test_evidence_items_carry_observed_and_log_lines():
    r = rule(evidence=[{"fact": "gpus.count", "ge": 2, "label": "several GPUs"}, {"log": "Duplicate GPU"}])
    facts = with_log("ok", "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000")
    facts.gpus = gpus("A", "B")
    finding = evaluate(facts, kb(r)).findings[0]
    fact, log = finding.evidence
    assert (fact.what, fact.observed, fact.expected, fact.state, fact.label) == (
        "gpus.count",
        2,
        ">= 2",
        "fired",
        "several GPUs",
    )
    assert log.lines == ("line 2: NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",)


def test_fix_is_rendered_with_facts_in_a_sandbox():
    r = rule(
        evidence=[{"fact": "gpus.count", "ge": 1}], snippet="devices={{ nproc }} on {{ facts.gpus.devices[0].name }}"
    )
    finding = evaluate(Facts(gpus=gpus("A100", "A100")), kb(r)).findings[0]
    assert finding.fixes[0].snippet == "devices=2 on A100"


def test_sandbox_refuses_unsafe_attributes():
    r = rule(evidence=[{"fact": "gpus.count", "ge": 1}], snippet="{{ facts.__class__.__init__.__globals__ }}")
    snippet = evaluate(Facts(gpus=gpus("A")), kb(r)).findings[0].fixes[0].snippet
    assert "could not fill in" in snippet and "__builtins__" not in snippet


def test_entries_shared_between_reports_cannot_be_changed():
    r = rule(evidence=[{"log": "boom"}, {"log": "bang"}])
    one, two = evaluate(with_log("boom"), kb(r)), evaluate(with_log("boom"), kb(r))
    shared = one.findings[0].evidence[1]
    assert shared is two.findings[0].evidence[1]  # "bang" not seen: the same entry
    with pytest.raises(ValidationError):
        shared.state = "fired"
    gone = evaluate(with_log("quiet"), kb(r)).ruled_out[0]
    with pytest.raises(ValidationError):
        gone.reason = "changed"
    assert evaluate(with_log("quiet"), kb(r)).ruled_out[0].reason == "none of its evidence was seen"


def test_evaluation_is_deterministic_and_pure():
    shipped = load_kb()
    facts = load_snapshot(SNAPSHOTS / "devices_duplicate-gpu.json")
    before = facts.model_dump_json()
    first = evaluate(facts, shipped).model_dump_json()
    assert evaluate(facts, shipped).model_dump_json() == first
    assert facts.model_dump_json() == before


SEED_SNAPSHOTS = {
    "startup_staggered-init-hang.json": "startup.staggered-init-hang",
    "ddp_checkpoint-on-gpu0.json": "ddp.checkpoint-on-gpu0",
    "sync_barrier-divergence.json": "sync.barrier-divergence",
    "devices_duplicate-gpu.json": "devices.duplicate-gpu",
    "devices_hook-device-mismatch.json": "devices.hook-device-mismatch",
}


@pytest.mark.parametrize(("snapshot", "cause"), SEED_SNAPSHOTS.items())
def test_seed_snapshot_ranks_its_cause_first(snapshot, cause):
    report = evaluate(load_snapshot(SNAPSHOTS / snapshot), load_kb())
    assert report.findings and report.findings[0].id == cause, [(f.id, f.score) for f in report.findings]


def test_healthy_snapshot_has_no_error_finding():
    report = evaluate(load_snapshot(SNAPSHOTS / "healthy.json"), load_kb())
    assert not report.has_error, [(f.id, f.score) for f in report.findings]


def test_literal_line_index_survives_unicode_lowering():
    # "İ".lower() is two characters: line offsets must come from the lowered text itself
    r = rule(evidence=[{"log": "NCCL WARN"}])
    facts = with_log("İİİİ İstanbul node", "ok", "NCCL WARN Cuda failure", "NCCL WARN again")
    finding = evaluate(facts, kb(r)).findings[0]
    assert finding.evidence[0].observed == 2
    assert finding.evidence[0].lines == ("line 3: NCCL WARN Cuda failure", "line 4: NCCL WARN again")


def test_a_skipped_micro_test_is_not_evidence():
    r = rule(evidence=[{"microtest": "placement", "status": "failed"}])
    report = evaluate(Facts(microtests=MicroTests(placement=MicroTest(status="skipped", reason="no GPU"))), kb(r))
    assert report.not_checked[0].missing == ("microtests.placement",)


RAISES = """\
id: site.raises
title: A site rule that raises when it runs
severity: warning
explains: [crash.nccl]
evidence:
  - {fact: torch.bundled_nccl, contains: 5}
explain: The bundled NCCL is text; '5 in text' raises.
fix:
  - title: Fix the rule
    snippet: x
references: [https://example.org/1]
examples:
  - {expect: match}
  - {expect: no-match}
"""


def test_a_rule_that_raises_is_reported_and_the_rest_goes_on(tmp_path):
    path = tmp_path / "site" / "raises.yaml"
    path.parent.mkdir()
    path.write_text(RAISES, encoding="utf-8")
    facts = load_snapshot(SNAPSHOTS / "devices_duplicate-gpu.json")
    assert facts.torch.bundled_nccl, "the snapshot's torch has a bundled NCCL the rule looks at"
    shipped = load_kb()
    report = evaluate(facts, load_kb([tmp_path]))
    errors = [o for o in report.not_checked if o.id == "site.raises"]
    assert len(errors) == 1
    assert errors[0].reason.startswith(f"internal.rule-error: {path}: TypeError: ")
    assert "\n" not in errors[0].reason
    assert [f.id for f in report.findings] == [f.id for f in evaluate(facts, shipped).findings]


def test_a_raising_kb_rule_keeps_the_exit_code_of_the_findings(tmp_path):
    import json
    import subprocess
    import sys

    path = tmp_path / "site" / "raises.yaml"
    path.parent.mkdir()
    path.write_text(RAISES, encoding="utf-8")
    snapshot = str(SNAPSHOTS / "devices_duplicate-gpu.json")
    argv = [sys.executable, "-m", "diagnose", "--from", snapshot, "--json"]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    proc = subprocess.run([*argv, "--kb", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == plain.returncode != 3, proc.stderr
    reasons = [o["reason"] for o in json.loads(proc.stdout)["not_checked"] if o["id"] == "site.raises"]
    assert reasons and reasons[0].startswith("internal.rule-error: ")


def test_a_rule_that_can_no_longer_reach_its_threshold_still_says_what_was_unknown():
    """Once its score cannot reach min_score the rule stops searching the log, but the evidence
    it could not check (an unknown fact after the log checks) is still what it asks for."""
    r = rule(
        evidence=[
            {"log": "never here", "weight": 3},
            {"log": "nor here", "weight": 1},
            {"fact": "gpus.count", "ge": 2, "weight": 1},
        ],
        min_score=4,
    )
    report = evaluate(with_log("an ordinary line"), kb(r))
    assert not report.findings
    assert [o.missing for o in report.not_checked + report.possible] == [("gpus.count",)]
    facts = with_log("an ordinary line")
    facts.gpus = gpus("A", "B")
    assert evaluate(facts, kb(r)).ruled_out[0].reason == "none of its evidence was seen"


def test_a_fix_reading_only_nproc_renders_for_each_snapshots_value():
    r = rule(evidence=[{"log": "boom"}], snippet="torchrun --nproc-per-node {{ nproc }} train.py")
    one, four = with_log("boom"), with_log("boom")
    four.gpus = gpus("A", "B", "C", "D")
    fixes = [evaluate(f, kb(r)).findings[0].fixes[0].snippet for f in (one, four, one)]
    assert fixes == [
        "torchrun --nproc-per-node 2 train.py",
        "torchrun --nproc-per-node 4 train.py",
        "torchrun --nproc-per-node 2 train.py",
    ]


def test_a_fix_reading_fact_chains_renders_each_snapshots_values():
    r = rule(
        evidence=[{"log": "boom"}],
        snippet="torch {{ facts.torch.version or '?' }} on {{ (facts.gpus.arch or ['?']) | join(',') }}",
    )
    old, new, none = with_log("boom"), with_log("boom"), with_log("boom")
    old.torch.version, new.torch.version = "1.13.1", "2.5.1"
    new.gpus = gpus("NVIDIA H100 80GB HBM3")
    fixes = [evaluate(f, kb(r)).findings[0].fixes[0].snippet for f in (old, new, none, old)]
    assert fixes == ["torch 1.13.1 on ?", "torch 2.5.1 on hopper", "torch ? on ?", "torch 1.13.1 on ?"]


@pytest.mark.parametrize(
    "snippet", ["{{ facts.log.lines.clear() }}", "{{ facts.env.values.clear() }}", "{{ facts.gpus.model_dump() }}"]
)
def test_a_fix_calling_a_method_of_the_facts_stays_in_the_sandbox(snippet):
    r = rule(evidence=[{"log": "boom"}], snippet=snippet)
    facts = with_log("boom")
    facts.env.values["RANK"] = "0"
    for _ in range(2):  # the second render is where a reused one would come from
        fixed = evaluate(facts, kb(r)).findings[0].fixes[0].snippet
        assert "could not fill in" in fixed
    assert facts.log.lines and facts.env.values == {"RANK": "0"}


def test_signature_evidence_shows_its_occurrences_in_log_order():
    from probes.facts import Signature

    facts = with_log("x")
    ids = ["cuda_oom", "nccl_warn", "cuda_oom", "cuda_oom", "cuda_oom"]
    facts.log.signatures = [Signature(id=s, line=n, excerpt=f"{s} at {n}") for n, s in enumerate(ids, 1)]
    report = evaluate(
        facts, kb(rule(evidence=[{"signature": "cuda_oom"}]), rule("t.other", evidence=[{"signature": "cuda_error"}]))
    )
    assert report.findings[0].evidence[0].observed == 4
    assert report.findings[0].evidence[0].lines == (
        "line 1: cuda_oom at 1",
        "line 3: cuda_oom at 3",
        "line 4: cuda_oom at 4",
    )
    assert report.ruled_out[0].id == "t.other"
