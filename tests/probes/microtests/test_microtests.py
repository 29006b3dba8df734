"""Real ranks, real torch.distributed on gloo: the suite, a planted deadlock, a killed rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from probes.microtests import TEST_NAMES, run_microtests, runner, watchdog
from tests import pythonpath

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
    result = run_microtests(nproc=2, backend="gloo", timeout=60, progress=lambda *event: seen.append(event))
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
    assert [(n, s) for n, s, _ in seen] == [(n, s) for n in TEST_NAMES for s in ("running", getattr(result, n).status)]
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


@pytest.fixture
def launched(monkeypatch):
    """The key of every process a watchdog starts, in order; no GPU device nodes, so rank 0
    forks the other ranks wherever the steps run on CPU. The ranks see no GPU either (on a GPU
    machine rank 0 would find one and start the ranks itself)."""
    monkeypatch.setattr(runner, "_gpu_nodes", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    keys = []
    real = watchdog.Watchdog.launch

    def launch(self, what):
        keys.append(what.key)
        real(self, what)

    monkeypatch.setattr(watchdog.Watchdog, "launch", launch)
    return keys


@pytest.mark.parametrize(("gpu_nodes", "started"), [(False, [0]), (True, [0, 1])])
def test_the_tests_share_one_launch_of_ranks(launched, monkeypatch, gpu_nodes, started):
    # Where GPUs may be, each rank is an interpreter of its own from the start (CUDA does not
    # survive a fork); on CPU, rank 0 imports torch once and forks rank 1.
    monkeypatch.setattr(runner, "_gpu_nodes", lambda: gpu_nodes)
    result = run_microtests(["rendezvous", "barrier", "all_reduce"], nproc=2, backend="gloo")
    for test in (result.rendezvous, result.barrier, result.all_reduce):
        assert test.status == "passed", test.error
        assert test.ranks == {"0": "done; exit 0", "1": "done; exit 0"}
    assert launched == started
    assert _leftovers() == []


def test_a_step_that_hangs_is_cut_at_its_deadline_and_the_steps_after_it_still_run(plant, launched):
    plant("barrier:1:skip_barrier")
    seen = []
    result = run_microtests(nproc=2, backend="gloo", timeout=10, progress=lambda *event: seen.append(event))
    barrier = result.barrier
    assert barrier.status == "timed_out", barrier.error
    assert barrier.measurements["missing_ranks"] == "1"
    assert barrier.ranks["0"].startswith("barrier;") and not barrier.ranks["1"].startswith("barrier")
    for name in ("rendezvous", "all_reduce", "lightning_fit"):
        assert getattr(result, name).status == "passed", (name, getattr(result, name).error)
    assert result.lightning_fit.measurements["global_step"] == 4
    assert launched == [0, 0]  # the group, then a new one for the steps after the barrier
    assert [(n, s) for n, s, _ in seen] == [(n, s) for n in TEST_NAMES for s in ("running", getattr(result, n).status)]
    assert _leftovers() == []


@pytest.mark.parametrize(("gpu_nodes", "killed"), [(False, 1), (False, 0), (True, 1)])
def test_a_rank_killed_in_one_step_fails_that_step_only(plant, launched, monkeypatch, gpu_nodes, killed):
    monkeypatch.setattr(runner, "_gpu_nodes", lambda: gpu_nodes)
    plant(f"all_reduce:{killed}:kill")
    result = run_microtests(["barrier", "all_reduce", "lightning_fit"], nproc=2, backend="gloo")
    assert result.barrier.status == "passed"
    assert result.all_reduce.status == "failed"
    assert result.all_reduce.error == (f"rank {killed} died from signal SIGKILL at step 'process group up'")
    assert result.all_reduce.ranks[str(killed)] == "process group up; signal SIGKILL"
    assert result.lightning_fit.status == "passed", result.lightning_fit.error
    # Once rank 0 has said it found no GPU, the next group is forked whatever the device nodes.
    assert launched == ([0, 1, 0] if gpu_nodes else [0, 0])
    assert _leftovers() == []


def _fake_torch(tmp_path, monkeypatch, body: str) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))


def test_a_torch_that_cannot_be_imported_skips_every_test(tmp_path, monkeypatch):
    _fake_torch(tmp_path, monkeypatch, "raise ImportError('planted: no torch here')\n")
    seen = []
    result = run_microtests(progress=lambda *event: seen.append(event))
    for name in TEST_NAMES:
        test = getattr(result, name)
        assert test.status == "skipped"
        assert test.reason == (f"torch cannot be imported by {sys.executable}: ImportError: planted: no torch here")
    assert [(n, s) for n, s, _ in seen] == [(n, s) for n in TEST_NAMES for s in ("running", "skipped")]
    assert _leftovers() == []


def test_a_rank_that_dies_before_it_answers_skips_every_test_saying_why(tmp_path, monkeypatch):
    _fake_torch(
        tmp_path,
        monkeypatch,
        "import os, sys\nprint('planted crash', file=sys.stderr, flush=True)\nos._exit(3)\n",
    )
    result = run_microtests(["rendezvous", "lightning_fit"])
    assert result.rendezvous.status == result.lightning_fit.status == "skipped"
    assert result.rendezvous.reason == f"inspecting torch in {sys.executable} failed: exit 3: planted crash"
    assert _leftovers() == []


def test_a_lightning_that_fails_to_import_fails_only_the_fit(tmp_path, monkeypatch, launched):
    (tmp_path / "lightning").mkdir()
    (tmp_path / "lightning" / "__init__.py").write_text("raise RuntimeError('planted: broken')\n")
    monkeypatch.setenv("PYTHONPATH", pythonpath(tmp_path))
    result = run_microtests(["rendezvous", "lightning_fit"], nproc=2, backend="gloo")
    assert result.rendezvous.status == "passed", result.rendezvous.error
    assert result.lightning_fit.status == "failed"
    assert "RuntimeError: planted: broken" in result.lightning_fit.error
    assert _leftovers() == []
