"""The parent's judgement over what ranks reported, without starting any process."""

from __future__ import annotations

import pytest

from probes.microtests import TEST_NAMES, run_microtests
from probes.microtests.channel import RankReport
from probes.microtests.checks import SIZES, size_label
from probes.microtests.errors import rendezvous_error_kind
from probes.microtests.judge import bandwidth
from probes.microtests.runner import (
    Run,
    _skip_reason,
    child_env,
    judge_run,
    plan,
    verdict,
)
from probes.microtests.watchdog import Ended, Watched

CPU = {
    "python": "py",
    "torch": "2.13.0",
    "distributed": True,
    "gloo": True,
    "nccl": False,
    "cuda": False,
    "device_count": 0,
    "lightning": True,
    "deepspeed": False,
}
ONE_GPU = {**CPU, "nccl": True, "cuda": True, "device_count": 1}
EIGHT_GPUS = {**ONE_GPU, "device_count": 8}


def _run(reports, exits, *, deadline_hit=False, failed_first=(), nproc=2, extra=None) -> Run:
    watched = Watched(exits=exits, deadline_hit=deadline_hit, failed_first=list(failed_first), elapsed_s=1.0)
    return Run(watched, dict(enumerate(reports)), None, nproc, "gloo", 5.0, extra or {})


def _done(**measurements) -> RankReport:
    return RankReport(steps=["started", "process group up"], measurements=measurements, done=True)


def test_bandwidth_is_defined_as_in_nccl_tests():
    assert bandwidth(10**9, 1.0, 2) == (1.0, 1.0)
    assert bandwidth(10**9, 0.5, 4) == (2.0, 3.0)  # busbw = algbw * 2 (n-1) / n
    assert bandwidth(10**9, 1.0, 1) == (1.0, 0.0)


def test_all_passing_ranks_pass():
    run = _run([_done(), _done()], {0: Ended(0), 1: Ended(0)})
    test = judge_run("rendezvous", run)
    assert (test.status, test.error) == ("passed", None)
    assert test.ranks == {"0": "done; exit 0", "1": "done; exit 0"}


def test_a_signal_death_outranks_the_errors_it_causes():
    dead = RankReport(steps=["process group up"])
    echo = RankReport(steps=["all_reduce 1KB"], error="RuntimeError: Connection closed by peer", error_time=2.0)
    run = _run([echo, dead], {0: Ended(1), 1: Ended(-9)}, failed_first=[0, 1])
    status, error = verdict(run)
    assert status == "failed"
    assert error == "rank 1 died from signal SIGKILL at step 'process group up'"


def test_a_rank_aborted_by_the_nccl_watchdog_is_timed_out_with_its_words():
    said = (
        "[rank0]:[E] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=256) ran for 5000 milliseconds "
        "before timing out.\nFatal Python error: Aborted\n\nThread 0x7f (most recent call first):\n"
        '  File "checks.py", line 160 in all_reduce\n'
    )
    run = _run([RankReport(steps=["all_reduce 1KB"]), _done()], {0: Ended(-6), 1: Ended(0)}, failed_first=[0])
    run.watched.output[0] = said
    status, error = verdict(run)
    assert status == "timed_out"
    assert error.startswith("rank 0 died from signal SIGABRT at step 'all_reduce 1KB': [rank0]")
    assert "Watchdog caught collective operation timeout" in error


def test_a_crash_is_explained_by_its_last_error_line():
    run = _run([RankReport(steps=["import torch"]), _done()], {0: Ended(-11), 1: Ended(0)}, failed_first=[0])
    run.watched.output[0] = "Fatal Python error: Segmentation fault\n\nCurrent thread:\n  File x\n"
    status, error = verdict(run)
    assert status == "failed"
    assert error == "rank 0 died from signal SIGSEGV at step 'import torch': " + (
        "Fatal Python error: Segmentation fault"
    )


def test_a_timeout_the_rank_reported_is_timed_out():
    waiting = RankReport(
        steps=["barrier"],
        error="RuntimeError: Ranks 1 failed",
        error_time=1.0,
        timeout=True,
        missing=[1],
    )
    stuck = RankReport(steps=["process group up"])
    run = _run(
        [waiting, stuck],
        {0: Ended(1), 1: Ended(None, killed="after rank 0 failed")},
        failed_first=[0],
    )
    test = judge_run("barrier", run)
    assert test.status == "timed_out"
    assert test.measurements["missing_ranks"] == "1" and test.measurements["arrived_count"] == 1
    assert test.error.startswith("ranks never reached the barrier: 1; rank 0: RuntimeError")
    assert test.ranks["1"] == "process group up; killed by the watchdog after rank 0 failed"


def test_at_the_deadline_the_ranks_outside_the_barrier_are_missing():
    inside = RankReport(steps=["process group up", "barrier"])
    outside = RankReport(steps=["process group up"])
    killed = Ended(None, killed="at the 5 s deadline")
    test = judge_run("barrier", _run([inside, outside], {0: killed, 1: killed}, deadline_hit=True))
    assert test.status == "timed_out"
    assert test.measurements["missing_ranks"] == "1"
    assert "rank 0 at 'barrier', rank 1 at 'process group up'" in test.error


def test_a_rank_that_fails_without_a_word_is_explained_by_its_output():
    run = _run([RankReport(), _done()], {0: Ended(1), 1: Ended(0)}, failed_first=[0])
    run.watched.output[0] = "Traceback...\nModuleNotFoundError: No module named 'torch'\n"
    status, error = verdict(run)
    assert status == "failed"
    assert error == "rank 0 exit 1: ModuleNotFoundError: No module named 'torch'"


def test_a_cpp_trace_is_cut_from_errors():
    text = "RuntimeError: NCCL error: invalid usage\nLast error: Duplicate GPU\nException raised from x at y\nframe #0"
    report = RankReport(error=text, error_time=1.0)
    _, error = verdict(_run([report, _done()], {0: Ended(1), 1: Ended(0)}, failed_first=[0]))
    assert error == "rank 0: RuntimeError: NCCL error: invalid usage | Last error: Duplicate GPU"


def test_all_reduce_averages_time_over_ranks_and_reports_bus_bandwidth():
    times = [
        {f"time_s_{size_label(s)}": s / 1e9 for s in SIZES},
        {f"time_s_{size_label(s)}": s / 1e9 * 3 for s in SIZES},
    ]
    reports = [
        RankReport(steps=[f"all_reduce {size_label(s)}" for s in SIZES], measurements=t, done=True) for t in times
    ]
    test = judge_run("all_reduce", _run(reports, {0: Ended(0), 1: Ended(0)}))
    m = test.measurements
    assert test.status == "passed" and m["correct"] is True
    assert m["algbw_gbps_1KB"] == 0.5 and m["busbw_gbps_64MB"] == 0.5  # mean time: 2 ns/byte
    assert m["time_us_1KB"] == pytest.approx(2.0, abs=0.1)
    assert m["busbw_gbps_max"] == m["busbw_gbps_avg"] == 0.5


def test_one_rank_records_no_bus_bandwidth():
    # seen on the H200: one rank's nccl-tests busbw of 0 read as "busbw up to 0.00 GB/s", which a
    # rule's "all_reduce crawls at under 1 GB/s" would take for a broken link
    report = RankReport(
        steps=[f"all_reduce {size_label(s)}" for s in SIZES],
        measurements={f"time_s_{size_label(s)}": s / 1e9 for s in SIZES},
        done=True,
    )
    m = judge_run("all_reduce", _run([report], {0: Ended(0)}, nproc=1)).measurements
    assert m["algbw_gbps_max"] == 1.0 and m["correct"] is True
    assert not [key for key in m if key.startswith("busbw")]


def test_a_wrong_sum_fails_all_reduce():
    wrong = RankReport(
        steps=["all_reduce 64MB"],
        checks_failed=["1KB: rank 0 got 4.0", "4KB: rank 0 got 4.0"],
        done=True,
    )
    test = judge_run("all_reduce", _run([wrong, _done()], {0: Ended(0), 1: Ended(0)}))
    assert test.status == "failed" and test.measurements["correct"] is False
    assert test.error == "1KB: rank 0 got 4.0 (and 1 more wrong results)"


def test_two_ranks_on_one_gpu_fail_duplicate_gpu():
    reports = [_done(device_uuid="a"), _done(device_uuid="b"), _done(device_uuid="a")]
    exits = {r: Ended(0) for r in range(3)}
    test = judge_run("duplicate_gpu", _run(reports, exits, nproc=3, extra={"shared": False}))
    assert test.status == "failed"
    assert test.measurements == {
        "mode": "distinct",
        "distinct_devices": 2,
        "duplicates": True,
        "duplicate_ranks": "0,2",
    }


def test_on_a_single_gpu_duplicate_gpu_records_what_nccl_said():
    said = (
        "DistBackendError: NCCL error ... Last error: Duplicate GPU detected : "
        "rank 1 and rank 0 both on CUDA device 1000"
    )
    reports = [_done(nccl_error=said), _done(nccl_error=said)]
    test = judge_run("duplicate_gpu", _run(reports, {0: Ended(0), 1: Ended(0)}, extra={"shared": True}))
    assert test.status == "passed"
    assert test.measurements == {"mode": "shared", "nccl_error": said, "nccl_rejects_shared": True}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (
            "DistNetworkError: The server socket has failed to listen on any local network address "
            "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
            "address_in_use",
        ),
        ("DistNetworkError: ... Connection refused", "connection_refused"),
        (
            "DistStoreError: Timed out after 31 seconds waiting for clients. 1/2 clients joined.",
            "timeout",
        ),
        ("gaierror: Name or service not known", "hostname"),
        ("RuntimeError: something else", "other"),
    ],
)
def test_rendezvous_errors_are_classified(text, kind):
    assert rendezvous_error_kind(text) == kind


def test_plan_picks_nccl_with_one_rank_per_gpu_and_gloo_with_two_on_cpu():
    assert (plan(CPU, None, None).backend, plan(CPU, None, None).nproc) == ("gloo", 2)
    assert (plan(EIGHT_GPUS, None, None).backend, plan(EIGHT_GPUS, None, None).nproc) == ("nccl", 8)
    assert (plan(EIGHT_GPUS, 2, "gloo").backend, plan(EIGHT_GPUS, 2, "gloo").nproc) == ("gloo", 2)


def test_plan_skips_everything_when_torch_or_the_backend_is_missing():
    assert (
        "torch cannot be imported"
        in plan({"python": "py", "torch_error": "ModuleNotFoundError: torch"}, None, None).skip_all
    )
    assert plan(CPU, None, "nccl").skip_all == "this torch build has no nccl backend"
    assert "needs a CUDA GPU" in plan({**CPU, "nccl": True}, None, "nccl").skip_all


def test_skip_reasons_per_test():
    cpu = plan(CPU, None, None)
    assert _skip_reason("placement", cpu, "ddp") == "needs a CUDA GPU; torch sees none"
    assert _skip_reason("duplicate_gpu", cpu, "ddp") == "needs a CUDA GPU; torch sees none"
    assert _skip_reason("lightning_fit", cpu, "ddp") is None
    assert "needs CUDA GPUs and NCCL" in _skip_reason("lightning_fit", cpu, "fsdp")
    assert "deepspeed package" in _skip_reason("lightning_fit", plan(ONE_GPU, None, None), "deepspeed")
    assert "lightning" in _skip_reason("lightning_fit", plan({**CPU, "lightning": False}, None, None), "ddp")
    assert _skip_reason("duplicate_gpu", plan(ONE_GPU, None, None), "ddp") is None
    assert "gloo" in _skip_reason("duplicate_gpu", plan(ONE_GPU, None, "gloo"), "ddp")


def test_child_env_drops_launcher_variables_and_keeps_nccl_settings(monkeypatch):
    for name, value in {
        "RANK": "3",
        "MASTER_PORT": "1",
        "SLURM_PROCID": "3",
        "TORCHELASTIC_RUN_ID": "x",
        "NCCL_P2P_DISABLE": "1",
        "CUDA_VISIBLE_DEVICES": "1,2",
    }.items():
        monkeypatch.setenv(name, value)
    env = child_env({"LOCAL_RANK": "1"})
    assert not {"RANK", "MASTER_PORT", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"} & set(env)
    assert env["NCCL_P2P_DISABLE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "1,2" and env["LOCAL_RANK"] == "1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"names": ["rendezvous", "allreduce"]}, "unknown micro-test 'allreduce'"),
        ({"strategy": "horovod"}, "unknown strategy 'horovod'"),
        ({"backend": "mpi"}, "unknown backend 'mpi'"),
        ({"nproc": 0}, "nproc must be at least 1"),
        ({"timeout": 0}, "timeout must be positive"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_microtests(**kwargs)


def test_no_names_runs_nothing():
    result = run_microtests([])
    assert result.source == "microtest"
    assert all(getattr(result, name) is None for name in TEST_NAMES)
