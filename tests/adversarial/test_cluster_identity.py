"""Two torchrun nodes on one host are two nodes: keyed by the launcher's node rank."""

from __future__ import annotations

import importlib.util

import pytest

from probes.cluster.assemble import assemble
from probes.cluster.identity import Identity, identity, node_key
from probes.facts import Env, Facts

_NEEDS = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch: two real torchrun nodes")


ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
       "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip


def _me(rank: int, group_rank: int) -> Identity:
    return identity({**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "GROUP_RANK": str(group_rank)})


def _payload(rank: int, env: dict[str, str] | None) -> dict:
    facts = Facts(env=Env(values=env, complete=True)) if env is not None else None
    return {"rank": rank, "step": "done", "error": None, "device": {"device": "cpu"}, "tests": {},
            "node_facts": facts.model_dump(mode="json") if facts else None, "node_error": None}  # fmt: skip


def test_two_nodes_on_one_host_are_two_nodes_and_their_env_is_compared() -> None:
    mes = [_me(0, 0), _me(1, 0), _me(2, 1), _me(3, 1)]
    assert len({m.hostname for m in mes}) == 1 and [m.node_rank for m in mes] == [0, 0, 1, 1]
    roster = {m.rank: {"node": m.node, "hostname": m.hostname, "node_rank": m.node_rank, "local_rank": m.local_rank, "pid": 1}
              for m in mes}  # fmt: skip
    payloads = {0: _payload(0, {"NCCL_DEBUG": "INFO"}), 1: _payload(1, None),
                2: _payload(2, {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"}), 3: _payload(3, None)}  # fmt: skip
    layout = {r: (r // 2, None) for r in range(4)}
    facts = assemble(mes[0], roster, payloads, {}, layout, backend="gloo", microtests_run=False)
    cluster = facts.cluster
    host = mes[0].hostname
    assert cluster.nnodes == 2
    assert [(n.name, n.node_rank, n.ranks, n.hostname) for n in cluster.nodes] == [
        (f"{host} (node 0)", 0, [0, 1], host),
        (f"{host} (node 1)", 1, [2, 3], host),
    ]
    assert [r.node for r in cluster.ranks] == [f"{host} (node 0)"] * 2 + [f"{host} (node 1)"] * 2
    assert cluster.differing_env == ["NCCL_P2P_DISABLE"]


def test_without_a_node_rank_the_name_tells_nodes_apart() -> None:
    assert node_key({"node": "gpu01", "node_rank": None}) == "gpu01"
    assert node_key({"node": "gpu01", "node_rank": 3}) == 3


@_NEEDS
def test_two_real_torchrun_nodes_on_one_host(tmp_path) -> None:
    """The issue's reproduction: no DIAGNOSE_NODE_NAME, one hostname, `--nnodes 2`."""
    import json
    import subprocess
    import sys
    import uuid

    from tests.diagnose.test_cluster import ROOT, _env, _free_port, _no_orphans, _run_all

    mark, port = uuid.uuid4().hex[:8], _free_port()
    report = tmp_path / "report.json"
    common = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
    ]
    program = ["-m", "diagnose", "cluster", "--json", "--out", str(report), "--microtests", "none", "--timeout", "60"]

    def start(node: int, **extra: str) -> subprocess.Popen:
        log = (tmp_path / f"node{node}.log").open("wb")
        argv = [sys.executable, "-m", "torch.distributed.run", "--node-rank", str(node), *common, *program]
        return subprocess.Popen(
            argv, cwd=ROOT, env=_env(mark, **extra), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    procs = [start(0), start(1, NCCL_P2P_DISABLE="1")]  # the variable is set on node 1 only
    _run_all(procs, mark, limit=90)
    _no_orphans(mark)
    assert report.exists(), (tmp_path / "node0.log").read_text()[-3000:]
    data = json.loads(report.read_text())
    cluster = data["facts"]["cluster"]
    assert cluster["nnodes"] == 2
    assert [(n["node_rank"], n["ranks"], n["reported"]) for n in cluster["nodes"]] == [(0, [0], True), (1, [1], True)]
    assert len({n["hostname"] for n in cluster["nodes"]}) == 1 and len({n["name"] for n in cluster["nodes"]}) == 2
    assert cluster["nodes"][1]["env"]["values"].get("NCCL_P2P_DISABLE") == "1"
    assert "NCCL_P2P_DISABLE" not in cluster["nodes"][0]["env"]["values"]
    finding = next(f for f in data["findings"] if f["id"] == "cluster.nccl-env-mismatch")
    assert ["NCCL_P2P_DISABLE"] in [e["observed"] for e in finding["evidence"] if e["state"] == "fired"]
