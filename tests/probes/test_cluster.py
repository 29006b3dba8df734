"""probes.cluster without processes: who a rank is, where ranks live, what rank 0 assembles."""

from __future__ import annotations

import pytest

from probes.cluster.assemble import assemble
from probes.cluster.identity import Identity, LaunchError, expand_hostlist, expected_nodes, identity, planted_hang
from probes.facts import Cluster, ClusterNode, Env, Facts, Gpus, Launcher, TorchBuild

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True", "RANK": "3", "LOCAL_RANK": "1",
    "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "DIAGNOSE_NODE_NAME": "b",
}  # fmt: skip
SLURM = {
    "SLURM_JOB_ID": "123456", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
    "SLURM_NTASKS": "6", "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_NODELIST": "gpu[07-08],login3", "SLURMD_NODENAME": "login3",
}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a1,b[9-10],c", ["a1", "b9", "b10", "c"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("single", ["single"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


def test_identity_under_torchrun():
    me = identity(TORCHRUN)
    assert (me.rank, me.local_rank, me.world_size, me.node, me.nnodes, me.kind) == (3, 1, 4, "b", 2, "torchrun")
    assert (me.master_addr, me.master_port, me.agent_store) == ("10.0.0.1", 29400, True)


def test_identity_under_srun_derives_the_store_address_like_lightning():
    me = identity(SLURM)
    assert (me.rank, me.local_rank, me.world_size, me.node_rank, me.kind) == (5, 1, 6, 2, "slurm")
    assert (me.master_addr, me.master_port, me.agent_store) == ("gpu07", 15000 + 3456, False)


def test_identity_outside_a_launcher_is_a_launch_error():
    with pytest.raises(LaunchError, match="under torchrun or srun"):
        identity({"PATH": "/bin"})


def test_expected_nodes_names_the_hosts_of_ranks_that_may_never_come():
    layout = expected_nodes(identity(SLURM), SLURM)
    assert layout[0] == (0, "gpu07") and layout[3] == (1, "gpu08") and layout[5] == (2, "login3")
    torchrun = expected_nodes(identity(TORCHRUN), TORCHRUN)
    assert torchrun == {0: (0, None), 1: (0, None), 2: (1, None), 3: (1, None)}


def test_planted_hang_needs_the_testing_switch():
    assert planted_hang({"DIAGNOSE_CLUSTER_FAULT": "1:barrier"}, 1) is None
    env = {"DIAGNOSE_CLUSTER_FAULT": "1:barrier", "DIAGNOSE_CLUSTER_TESTING": "1"}
    assert planted_hang(env, 1) == "barrier" and planted_hang(env, 0) is None


def _node(
    name: str, env: dict, torch: str = "2.3.1", inter: float | None = None, gpus: int = 2, ranks=(0, 1)
) -> ClusterNode:
    return ClusterNode(
        name=name, reported=True, ranks=list(ranks), inter_gbps=inter,
        env=Env(values=env, complete=True), torch=TorchBuild(version=torch, nccl="2.20.5"), gpus=Gpus(count=gpus),
    )  # fmt: skip


def test_differing_env_ignores_rank_specific_variables_and_counts_unset():
    cluster = Cluster(nodes=[
        _node("a", {"NCCL_ALGO": "Ring", "SLURM_NODEID": "0", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO"}),
        _node("b", {"SLURM_NODEID": "1", "CUDA_VISIBLE_DEVICES": "2,3", "NCCL_DEBUG": "INFO"}),
    ])  # fmt: skip
    assert cluster.differing_env == ["NCCL_ALGO"]


def test_differing_versions_and_unknown_nodes():
    cluster = Cluster(nodes=[_node("a", {}, torch="2.3.1"), _node("b", {}, torch="2.1.0"), ClusterNode(name="c")])
    assert cluster.differing_versions == ["torch"]
    assert Cluster(nodes=[_node("a", {})]).differing_versions is None  # one node: nothing to compare


def test_slow_nodes_against_the_median():
    nodes = [_node("a", {}), _node("b", {}, inter=20.0), _node("c", {}, inter=22.0), _node("d", {}, inter=3.0)]
    assert Cluster(nodes=nodes).slow_nodes == ["d"]
    assert Cluster(nodes=nodes[:2]).slow_nodes is None  # one measurement is no comparison


def test_ranks_versus_gpu_slots_prefers_the_slurm_allocation():
    node = _node("a", {}, gpus=8, ranks=(0, 1, 2, 3))
    node.launcher = Launcher(slurm_gpus_on_node=2)
    cluster = Cluster(nodes=[node, _node("b", {}, gpus=4, ranks=(4, 5, 6, 7))])
    assert (cluster.ranks_exceed_gpus, cluster.gpus_exceed_ranks) == (["a"], [])


ME = Identity(rank=0, local_rank=0, world_size=3, node="n1", hostname="h1", node_rank=0, nnodes=2,
              kind="slurm", master_addr="n1", master_port=1, agent_store=False)  # fmt: skip


def _payload(rank: int, node: str, facts: Facts | None = None) -> dict:
    tests = {
        "rendezvous": {
            "status": "passed",
            "error": None,
            "duration_s": 0.1,
            "measurements": {"init_s": 0.1 * (rank + 1)},
        }
    }
    return {"rank": rank, "step": "done", "error": None, "device": {"device": "cpu"}, "tests": tests,
            "node_facts": facts.model_dump(mode="json") if facts else None, "node_error": None}  # fmt: skip


def test_assemble_names_missing_and_silent_ranks_and_lifts_rank0s_node():
    node_facts = Facts(torch=TorchBuild(version="2.3.1"), env=Env(values={"NCCL_ALGO": "Ring"}, complete=True))
    roster = {0: {"node": "n1", "hostname": "h1", "node_rank": 0, "local_rank": 0, "pid": 10},
              1: {"node": "n1", "hostname": "h1", "node_rank": 0, "local_rank": 1, "pid": 11}}  # fmt: skip
    layout = {0: (0, "n1"), 1: (0, "n1"), 2: (1, "n2")}
    facts = assemble(
        ME, roster, {0: _payload(0, "n1", node_facts)}, {1: "barrier"}, layout, backend="gloo", microtests_run=True
    )
    cluster = facts.cluster
    assert [(r.rank, r.state, r.node) for r in cluster.ranks] == [
        (0, "reported", "n1"),
        (1, "silent", "n1"),
        (2, "missing", "n2"),
    ]
    assert cluster.ranks[1].step == "barrier"
    assert (cluster.missing_ranks, cluster.missing_nodes, cluster.silent_ranks) == ([2], ["n2"], [1])
    assert facts.torch.version == "2.3.1" and facts.env.values == {"NCCL_ALGO": "Ring"}
    assert facts.microtests.rendezvous.status == "timed_out"
    assert facts.microtests.rendezvous.ranks == {"0": "done", "1": "silent at 'barrier'", "2": "never joined"}
    again = Facts.model_validate_json(facts.model_dump_json())  # a cluster snapshot reads back whole
    assert again.cluster.missing_nodes == ["n2"]


def test_single_machine_snapshot_has_no_cluster_key():
    assert "cluster" not in Facts().model_dump()


def test_shared_devices_by_uuid_per_node():
    from probes.facts import ClusterRank

    ranks = [ClusterRank(rank=r, node=n, state="reported", device_uuid=u)
             for r, n, u in ((0, "a", "GPU-1"), (1, "a", "GPU-1"), (2, "b", "GPU-1"), (3, "b", "GPU-2"))]  # fmt: skip
    assert Cluster(ranks=ranks).shared_devices == ["a: ranks 0,1"]
    assert Cluster(ranks=[ClusterRank(rank=0, state="reported", device="cpu")]).shared_devices is None
