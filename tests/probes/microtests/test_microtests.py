"""Real ranks, real torch.distributed on gloo: the suite, a planted deadlock, a killed rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from probes.microtests import TEST_NAMES, run_microtests, runner

pytest.importorskip("torch")


def _leftovers() -> list[psutil.Process]:
    """Our descendants, and any rank still naming this process as its parent, orphaned or not."""
    me = str(os.getpid())
    found = {p.pid: p for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "--parent-pid" in cmd and cmd[cmd.index("--parent-pid") + 1 :][:1] == [me]:
            found[proc.pid] = proc
    return [p for p in found.values() if _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def plant(monkeypatch):
    def plant(spec: str) -> None:
        monkeypatch.setenv("DIAGNOSE_MICROTEST_TESTING", "1")
        monkeypatch.setenv("DIAGNOSE_MICROTEST_FAULT", spec)

    return plant


def test_importing_the_package_does_not_import_torch():
    code = "import sys, probes.microtests; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_the_suite_passes_on_two_gloo_ranks():
    seen = []
    result = run_microtests(
        nproc=2, backend="gloo", timeout=60, progress=lambda *event: seen.append(event)
    )
    assert result.source == "microtest"
    for name in ("rendezvous", "barrier", "all_reduce", "lightning_fit"):
        test = getattr(result, name)
        assert test.status == "passed", (name, test.error)
        assert (test.backend, test.nproc) == ("gloo", 2)
        assert test.ranks == {"0": "done; exit 0", "1": "done; exit 0"}
    measured = result.all_reduce.measurements
    assert measured["correct"] is True
    assert measured["busbw_gbps_max"] > 0 and measured["busbw_gbps_64MB"] > 0
    assert result.barrier.measurements["missing_count"] == 0
    assert result.lightning_fit.measurements["global_step"] == 4
    if result.placement.status == "skipped":  # no GPU here
        assert result.unavailable["placement"] == result.placement.reason
        assert result.duplicate_gpu.reason
    assert [(n, s) for n, s, _ in seen] == [
        (n, s) for n in TEST_NAMES for s in ("running", getattr(result, n).status)
    ]
    assert _leftovers() == []


def test_a_rank_that_skips_the_barrier_times_out_named_and_leaves_nothing(plant):
    plant("barrier:1:skip_barrier")
    # Long enough for rank 0 to reach the barrier on a busy 2-core machine, so that the
    # missing rank is the planted one and not a slow import.
    deadline = 8
    test = run_microtests(["barrier"], nproc=2, backend="gloo", timeout=deadline).barrier
    assert test.duration_s < deadline + 2  # from the ranks' start to the last one reaped
    assert test.status == "timed_out", test.error
    assert test.measurements["missing_ranks"] == "1" and test.measurements["missing_count"] == 1
    assert "never reached the barrier: 1" in test.error
    assert test.ranks["0"].startswith("barrier;")
    assert not test.ranks["1"].startswith("barrier")
    assert _leftovers() == []


def test_a_rank_killed_mid_test_is_reported_failed_with_its_signal(plant):
    plant("all_reduce:1:kill")
    test = run_microtests(["all_reduce"], nproc=2, backend="gloo", timeout=30).all_reduce
    assert test.status == "failed"
    assert test.error == "rank 1 died from signal SIGKILL at step 'process group up'"
    assert test.ranks["1"] == "process group up; signal SIGKILL"
    assert test.measurements["correct"] is None
    assert _leftovers() == []


def test_a_wrong_sum_is_caught(plant):
    plant("all_reduce:1:wrong_sum")
    test = run_microtests(["all_reduce"], nproc=2, backend="gloo", timeout=30).all_reduce
    assert test.status == "failed"
    assert test.measurements["correct"] is False
    assert test.error.startswith("1KB: rank ") and "expected 3.0" in test.error


def test_a_port_taken_by_another_process_is_retried_once_then_reported(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picked = []
        monkeypatch.setattr(runner, "free_port", lambda: picked.append(1) or taken.getsockname()[1])
        test = run_microtests(["rendezvous"], nproc=2, backend="gloo", timeout=30).rendezvous
    assert len(picked) == 2
    assert test.status == "failed"
    assert test.measurements["error_kind"] == "address_in_use"
    assert "EADDRINUSE" in test.error
    assert _leftovers() == []
