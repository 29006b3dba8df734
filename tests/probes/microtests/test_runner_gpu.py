"""The runner's GPU paths, which this machine cannot run: device maps, variants, placement."""

from __future__ import annotations

from probes.microtests import TEST_NAMES, runner
from probes.microtests.channel import RankReport
from probes.microtests.checks import placement_summary
from probes.microtests.group import forks
from probes.microtests.runner import (
    Run,
    _grouped,
    _run_test,
    group_plan,
    judge_run,
    launches,
    plan,
)
from probes.microtests.watchdog import Ended, Watched

GPU = {
    "python": "py",
    "torch": "2.13.0",
    "distributed": True,
    "gloo": True,
    "nccl": True,
    "cuda": True,
    "lightning": True,
    "deepspeed": False,
}


def _plan(devices: int, nproc=None, backend=None):
    return plan({**GPU, "device_count": devices}, nproc, backend)


def _launched(name, setup, strategy="ddp", backend=None):
    return launches(
        name,
        setup,
        backend=backend or setup.backend,
        strategy=strategy,
        port=1234,
        deadline=0.0,
        work="/tmp/x",
    )


def _arg(launch, flag):
    return launch.argv[launch.argv.index(flag) + 1]


def test_nccl_ranks_take_one_gpu_each():
    found = _launched("all_reduce", _plan(4))
    assert [(_arg(x, "--rank"), _arg(x, "--device"), _arg(x, "--backend")) for x in found] == [
        ("0", "cuda:0", "nccl"),
        ("1", "cuda:1", "nccl"),
        ("2", "cuda:2", "nccl"),
        ("3", "cuda:3", "nccl"),
    ]


def test_gloo_collectives_stay_on_cpu_even_beside_gpus():
    found = _launched("all_reduce", _plan(4, nproc=2, backend="gloo"))
    assert [_arg(x, "--device") for x in found] == ["cpu", "cpu"]


def test_on_one_gpu_duplicate_gpu_puts_two_ranks_on_it():
    found = _launched("duplicate_gpu", _plan(1))
    assert [(_arg(x, "--device"), _arg(x, "--mode")) for x in found] == [("cuda:0", "shared")] * 2


def test_on_several_gpus_duplicate_gpu_maps_ranks_to_distinct_ones():
    found = _launched("duplicate_gpu", _plan(8, nproc=1))
    assert [(_arg(x, "--device"), _arg(x, "--mode")) for x in found] == [
        ("cuda:0", "distinct"),
        ("cuda:1", "distinct"),
    ]


def test_the_group_takes_the_tests_that_share_its_ranks():
    four = _plan(4)
    assert all(_grouped(name, four, "ddp") for name in TEST_NAMES)
    assert not _grouped("lightning_fit", four, "ddp_spawn")  # Lightning starts those ranks
    one = _plan(1)
    assert not _grouped("duplicate_gpu", one, "ddp")  # two ranks on the one GPU
    assert not _grouped("duplicate_gpu", _plan(8, nproc=1), "ddp")  # needs two ranks


def test_group_steps_put_each_rank_on_its_own_gpu_with_a_port_per_step():
    planned = group_plan(["barrier", "placement"], _plan(2), strategy="ddp", timeout=7.0)
    assert (planned.world_size, planned.backend, planned.timeout) == (2, "nccl", 7.0)
    assert [s.devices for s in planned.steps] == [["cuda:0", "cuda:1"]] * 2
    assert planned.steps[0].port != planned.steps[1].port
    on_cpu = group_plan(["all_reduce", "placement"], _plan(2, backend="gloo"), strategy="ddp", timeout=7.0)
    assert [s.devices for s in on_cpu.steps] == [["cpu", "cpu"], ["cuda:0", "cuda:1"]]
    assert group_plan([], _plan(2), strategy="ddp", timeout=7.0).world_size == 0


def test_rank_0_forks_the_others_only_for_cpu_steps_on_a_machine_without_gpus():
    on_cpu = group_plan(["barrier"], _plan(2, backend="gloo"), strategy="ddp", timeout=7.0)
    on_gpus = group_plan(["barrier"], _plan(2), strategy="ddp", timeout=7.0)
    no_gpu = {"cuda": False}
    assert forks(1, on_cpu, no_gpu)
    assert not forks(1, on_cpu, {"cuda": True})  # the query touched CUDA: a fork would break it
    assert not forks(1, on_gpus, no_gpu)
    assert not forks(2, on_cpu, no_gpu)  # every rank already has a process of its own
    one_rank = group_plan(["barrier"], _plan(2, nproc=1, backend="gloo"), strategy="ddp", timeout=7)
    assert not forks(1, one_rank, no_gpu)


def test_ddp_spawn_starts_one_launcher_without_local_rank():
    (only,) = _launched("lightning_fit", _plan(2), strategy="ddp_spawn")
    assert only.key == "launcher" and "--rank" not in only.argv
    assert "LOCAL_RANK" not in only.env and _arg(only, "--world-size") == "2"


def _fake_run(status: str, backend: str = "nccl") -> Run:
    code = 0 if status == "passed" else 1
    report = RankReport(
        steps=["all_reduce 1KB"],
        done=code == 0,
        error=None if code == 0 else "RuntimeError: NCCL error",
        error_time=1.0,
    )
    watched = Watched({0: Ended(code)}, False, [] if code == 0 else [0], 0.1)
    return Run(watched, {0: report}, None, 1, backend, 5.0, {"shared": False, "strategy": "ddp"})


def test_a_failing_nccl_collective_is_rerun_under_each_variant(monkeypatch):
    calls = []

    def fake_execute(name, setup, *, backend, timeout, strategy="ddp", extra_env=None):
        calls.append((backend, extra_env))
        passes = backend == "gloo" or (extra_env or {}).get("NCCL_P2P_DISABLE") == "1"
        return _fake_run("passed" if passes else "failed", backend)

    monkeypatch.setattr(runner, "execute", fake_execute)
    seen = []
    test = _run_test("barrier", _plan(2), timeout=5, strategy="ddp", notify=lambda *e: seen.append(e))
    assert test.status == "failed"
    assert test.variants == {
        "p2p_disabled": "passed",
        "shm_disabled": "failed",
        "ib_disabled": "failed",
        "gloo": "passed",
    }
    assert calls[1:] == [
        ("nccl", {"NCCL_P2P_DISABLE": "1"}),
        ("nccl", {"NCCL_SHM_DISABLE": "1"}),
        ("nccl", {"NCCL_IB_DISABLE": "1"}),
        ("gloo", None),
    ]
    assert [d for _, _, d in seen] == [
        "variant p2p_disabled",
        "variant shm_disabled",
        "variant ib_disabled",
        "variant gloo",
    ]


def test_a_passing_or_gloo_test_gets_no_variants(monkeypatch):
    monkeypatch.setattr(runner, "execute", lambda *a, **k: _fake_run("passed"))
    assert _run_test("all_reduce", _plan(2), timeout=5, strategy="ddp", notify=lambda *e: None).variants == {}
    monkeypatch.setattr(runner, "execute", lambda *a, **k: _fake_run("failed", k["backend"]))
    cpu = _plan(2, backend="gloo")
    assert _run_test("all_reduce", cpu, timeout=5, strategy="ddp", notify=lambda *e: None).variants == {}


def test_a_rank_on_a_foreign_gpu_fails_placement():
    measured = placement_summary([(100, 0), (101, 1)], {0: {100, 101}, 1: {101}})
    report = RankReport(steps=["nvml"], measurements=measured, done=True)
    watched = Watched({0: Ended(0), 1: Ended(0)}, False, [], 0.1)
    run = Run(watched, {0: report, 1: RankReport(done=True)}, None, 2, "nccl", 5.0, {})
    test = judge_run("placement", run)
    assert test.status == "failed"
    assert test.error == "ranks 1 hold memory on a GPU not their own"


def test_ddp_spawn_ranks_are_judged_through_their_launcher():
    launcher = RankReport(steps=["started", "trainer", "fit"], measurements={"fit_s": 2.0}, done=True)
    ranks = {
        r: RankReport(steps=["setup", "training_step 3", "fit done"], measurements=m)
        for r, m in ((0, {"global_step": 4, "loss_finite": True}), (1, {}))
    }
    watched = Watched({"launcher": Ended(0)}, False, [], 3.0)
    extra = {"shared": False, "strategy": "ddp_spawn"}
    test = judge_run("lightning_fit", Run(watched, ranks, launcher, 2, "gloo", 60.0, extra))
    assert test.status == "passed"
    assert test.ranks == {"0": "fit done; exit 0", "1": "fit done; exit 0"}
    assert test.measurements == {
        "strategy": "ddp_spawn",
        "fit_s": 2.0,
        "global_step": 4,
        "loss_finite": True,
    }
    ranks[1].steps.remove("fit done")
    test = judge_run("lightning_fit", Run(watched, ranks, launcher, 2, "gloo", 60.0, extra))
    assert (test.status, test.error) == ("failed", "ranks 1 never finished Trainer.fit")


def test_on_a_gpu_a_failed_step_gets_its_variants_and_the_steps_after_it_a_new_group(monkeypatch):
    groups, executed, seen = [], [], []

    def fake_run_group(plan, *, workers, answer_limit, env, on_start, on_result):
        if callable(plan):
            plan = plan({**GPU, "device_count": 1})
        groups.append(([step.test for step in plan.steps], workers))
        for step in plan.steps:
            on_start(step.test)
            run = _fake_run("failed" if step.test == "barrier" else "passed")
            run.reports[0].steps.append("fit done")
            on_result(step.test, run)
            if step.test == "barrier":
                return {}  # a failed step ends the group
        return {}

    def fake_execute(name, setup, *, backend, timeout, strategy="ddp", extra_env=None):
        executed.append((name, backend, extra_env))
        return _fake_run("passed", backend)

    monkeypatch.setattr(runner, "run_group", fake_run_group)
    monkeypatch.setattr(runner, "execute", fake_execute)
    monkeypatch.setattr(runner, "_gpu_nodes", lambda: True)
    result = runner.run_microtests(progress=lambda *event: seen.append(event))

    # One GPU: two ranks sharing it is a launch of its own, after the group.
    assert groups == [
        (["rendezvous", "barrier", "all_reduce", "placement", "lightning_fit"], 2),
        (["all_reduce", "placement", "lightning_fit"], 1),
    ]
    assert result.barrier.status == "failed"
    assert result.barrier.variants == dict.fromkeys(("p2p_disabled", "shm_disabled", "ib_disabled", "gloo"), "passed")
    assert [getattr(result, n).status for n in TEST_NAMES if n != "barrier"] == ["passed"] * 5
    assert [(name, backend) for name, backend, _ in executed] == [
        *[("barrier", "nccl")] * 3,
        ("barrier", "gloo"),
        ("duplicate_gpu", "nccl"),
    ]
    assert [(n, s) for n, s, _ in seen] == [
        ("rendezvous", "running"),
        ("rendezvous", "passed"),
        ("barrier", "running"),
        *[("barrier", "running")] * 4,  # one per variant
        ("barrier", "failed"),
        *[(n, s) for n in ("all_reduce", "placement", "lightning_fit") for s in ("running", "passed")],
        ("duplicate_gpu", "running"),
        ("duplicate_gpu", "passed"),
    ]
