"""The cluster run and the local runner share one micro-test judge: the same rank results give
the same MicroTest on both paths, and the facts rules read (error_kind) exist on both."""

from __future__ import annotations

from probes.cluster.assemble import assemble
from probes.cluster.identity import Identity
from probes.microtests.channel import RankReport
from probes.microtests.runner import Run, judge_run
from probes.microtests.watchdog import Ended, Watched

ME = Identity(rank=0, local_rank=0, world_size=2, node="n1", hostname="h1", node_rank=0, nnodes=1,
              kind="torchrun", master_addr="n1", master_port=1, agent_store=True)  # fmt: skip
ROSTER = {r: {"node": "n1", "hostname": "h1", "node_rank": 0, "local_rank": r, "pid": 10 + r} for r in range(2)}
REFUSED = "DistNetworkError: The client socket has failed to connect to [n1]:29500 (errno: 111 - Connection refused)."


def _payload(rank: int, tests: dict) -> dict:
    return {"rank": rank, "step": "done", "error": None, "device": {"device": "cpu"}, "tests": tests,
            "node_facts": None, "node_error": None}  # fmt: skip


def _test(status: str, error: str | None = None, **measurements) -> dict:
    return {"status": status, "error": error, "duration_s": 0.5, "measurements": measurements}


def _cluster(tests_of: dict[int, dict]):
    payloads = {r: _payload(r, tests) for r, tests in tests_of.items()}
    return assemble(
        ME, ROSTER, payloads, {}, {0: (0, "n1"), 1: (0, "n1")}, backend="gloo", microtests_run=True
    ).microtests


def _local(name: str, reports: list[RankReport], exits: list[int]) -> object:
    watched = Watched(exits={r: Ended(rc) for r, rc in enumerate(exits)}, deadline_hit=False,
                      failed_first=[r for r, rc in enumerate(exits) if rc], elapsed_s=0.5)  # fmt: skip
    return judge_run(name, Run(watched, dict(enumerate(reports)), None, 2, "gloo", 5.0, {}))


def test_a_refused_cluster_rendezvous_says_why_as_the_local_one_does():
    failed = _test("failed", REFUSED)
    cluster = _cluster({0: {"rendezvous": failed}, 1: {"rendezvous": failed}})
    local = _local("rendezvous", [RankReport(steps=["started"], error=REFUSED, error_time=1.0)] * 2, [1, 1])
    assert cluster.rendezvous.status == local.status == "failed"
    assert cluster.rendezvous.measurements["error_kind"] == local.measurements["error_kind"] == "connection_refused"


def test_the_rendezvous_rule_reads_the_cluster_error_kind():
    from diagnose.engine import evaluate
    from diagnose.kb import load_kb
    from probes.facts import Facts, Launcher

    failed = _test("failed", REFUSED)
    microtests = _cluster({0: {"rendezvous": failed}, 1: {"rendezvous": failed}})
    facts = Facts(microtests=microtests, launcher=Launcher(kind="torchrun", nnodes=2, master_addr="n1"))
    found = {f.id: f for f in evaluate(facts, load_kb([])).findings}
    assert "launch.rendezvous-failure" in found
    fired = [e.label for e in found["launch.rendezvous-failure"].evidence if e.state == "fired"]
    assert "the rendezvous micro-test could not reach its store" in fired


def test_all_reduce_measurements_are_the_same_on_both_paths():
    times = {"time_s_1KB": 0.001, "time_s_4KB": 0.002}
    cluster = _cluster({r: {"all_reduce": _test("passed", correct=True, **times)} for r in range(2)})
    local = _local("all_reduce", [RankReport(steps=["started"], measurements=times, done=True)] * 2, [0, 0])
    assert cluster.all_reduce.measurements == local.measurements
    assert cluster.all_reduce.measurements["correct"] is True and "busbw_gbps_max" in local.measurements


def test_a_wrong_cluster_sum_fails_the_sweep_as_locally():
    wrong = _test("failed", "1KB: rank 1 got a wrong all_reduce sum", correct=False, time_s_1KB=0.001)
    cluster = _cluster({0: {"all_reduce": _test("passed", correct=True, time_s_1KB=0.001)}, 1: {"all_reduce": wrong}})
    assert cluster.all_reduce.status == "failed"
    assert cluster.all_reduce.measurements["correct"] is False


def test_a_monitored_barrier_names_the_missing_cluster_rank():
    timed_out = _test("timed_out", "RuntimeError: Rank 1 failed to pass monitoredBarrier in 5000 ms", missing_ranks=[1])
    cluster = _cluster({0: {"barrier": timed_out}, 1: {"barrier": _test("timed_out", "echo")}})
    barrier = cluster.barrier
    assert barrier.status == "timed_out"
    assert (barrier.measurements["missing_ranks"], barrier.measurements["missing_count"]) == ("1", 1)
    assert barrier.error.startswith("ranks never reached the barrier: 1;")
