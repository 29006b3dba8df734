"""What one real GPU recorded, replayed on any machine (tests/fixtures/gpu/h200, README there).

Each GPU-only path ran for real on an NVIDIA H200 (torch 2.11.0+cu130, NCCL 2.28.9), recorded by
tests/fixtures/gpu/record.sh: the live facts and micro-tests on NCCL, two ranks bound to one GPU,
ranks loading a checkpoint without map_location, CUDA used in forked DataLoader workers,
accelerate's dispatch hooks against Lightning's placement, and a barrier on rank 0 alone under
NCCL supervised by ``diagnose run``. Here the recorded facts and logs go through today's probes
and rules: each must still be named first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import diagnose
from probes.facts import Facts
from probes.microtests import TEST_NAMES
from probes.microtests.channel import RankReport
from probes.microtests.checks import placement_summary
from probes.microtests.judge import judge

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200"


@pytest.fixture(scope="module")
def kb():
    return diagnose.load_kb()


def _first(report) -> tuple[str, str]:
    assert report.findings, "no finding"
    return report.findings[0].id, report.findings[0].confidence


def test_the_live_facts_name_the_gpu_driver_and_nccl(kb):
    facts = diagnose.load_snapshot(H200 / "facts.json")
    gpu = facts.gpus.devices[0]
    assert (facts.gpus.count, gpu.name, gpu.memory_total_mib, gpu.compute_capability) == (
        1,
        "NVIDIA H200",
        143771.0,
        "9.0",
    )
    assert facts.driver.version == "580.159.04" and facts.driver.cuda_version == "13.0"
    assert (facts.torch.version, facts.torch.nccl, facts.torch.cuda_available) == ("2.11.0+cu130", "2.28.9", True)
    assert facts.packages.values["accelerate"] == "1.15.0"
    report = diagnose.evaluate(facts, kb)
    assert not [f.id for f in report.findings if f.severity == "error"]


def test_the_full_live_diagnosis_ran_every_micro_test_on_nccl(kb):
    facts = Facts.model_validate(json.loads((H200 / "live-report.json").read_text())["facts"])
    for name in TEST_NAMES:
        test = getattr(facts.microtests, name)
        assert (test.status, test.backend) == ("passed", "nccl"), name
    assert facts.microtests.all_reduce.measurements["correct"] is True
    # on one GPU the duplicate-GPU test puts two ranks on it on purpose: NCCL's own refusal
    shared = facts.microtests.duplicate_gpu.measurements
    assert shared["nccl_rejects_shared"] is True and "Duplicate GPU detected" in shared["nccl_error"]
    assert facts.microtests.placement.measurements["nvml_pids_matched"] is True
    report = diagnose.evaluate(facts, kb)
    assert not report.findings  # a healthy machine: nothing fired, as recorded


@pytest.mark.parametrize(
    ("job", "cause"),
    [
        ("run-duplicate", "devices.duplicate-gpu"),
        ("run-fork", "cuda.fork-after-init"),
        ("run-hook", "devices.hook-device-mismatch"),
        ("run-hang", "sync.barrier-divergence"),
    ],
)
def test_a_recorded_gpu_failure_is_named_first_from_its_facts_and_from_its_log_alone(kb, job, cause):
    facts = diagnose.load_snapshot(H200 / job / "facts.json")
    assert _first(diagnose.evaluate(facts, kb)) == (cause, "high")
    # the same log pasted by someone else, with no facts of the machine
    offline = diagnose.diagnose_text(log=(H200 / job / "output.log").read_text(), kb=kb)
    assert offline.findings[0].id == cause


def test_nccl_names_the_shared_gpu_in_its_own_words():
    log = (H200 / "run-duplicate" / "output.log").read_text()
    assert "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device" in log


def test_a_hang_under_nccl_is_caught_with_every_ranks_stack():
    hang = diagnose.load_snapshot(H200 / "run-hang" / "facts.json").hang
    assert hang.detected and hang.outcome == "hung"
    ranks = {r.rank: r for r in hang.ranks}
    assert (ranks[0].method, ranks[0].waiting_in, ranks[0].rank_branch) == ("py-spy", "barrier", "if rank == 0:")
    assert (ranks[1].method, ranks[1].waiting_in) == ("py-spy", "user_code")


def test_a_checkpoint_loaded_without_map_location_puts_a_foreign_rank_on_gpu_0(kb):
    recorded = json.loads((H200 / "checkpoint" / "placement.json").read_text())
    ranks = [tuple(r) for r in recorded["ranks"]]
    holders = {int(device): set(pids) for device, pids in recorded["holders"].items()}
    summary = placement_summary(ranks, holders)
    assert summary == recorded["summary"] and summary["gpu0_foreign_ranks"] == "1"
    placement = judge(
        "placement",
        {0: RankReport(measurements=summary, done=True), 1: RankReport(done=True)},
        status="passed",
        error=None,
        nproc=2,
        backend="gloo",
        duration_s=1.0,
        ranks={"0": "done; exit 0", "1": "done; exit 0"},
    )
    assert placement.status == "failed"
    facts = diagnose.load_snapshot(H200 / "checkpoint" / "facts.json")  # taken while both ranks held it
    assert facts.gpus.processes_on_gpu0 == 2
    assert _first(diagnose.evaluate(facts, kb))[0] == "ddp.checkpoint-on-gpu0"
    facts.microtests.source = "microtest"
    facts.microtests.placement = placement
    assert _first(diagnose.evaluate(facts, kb)) == ("ddp.checkpoint-on-gpu0", "high")
