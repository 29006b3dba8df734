"""`diagnose cluster` as a job's program: two "nodes" on this machine, over loopback and gloo.

torchrun is started twice (node ranks 0 and 1) like on two hosts; the srun cases start the
ranks directly with the variables srun sets. Every spawned process carries a marker in its
environment, so the tests can prove that none is left behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from probes.clusterfacts import slow_nodes
from tests import pythonpath

_NEEDS = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch: real ranks under torchrun or srun"
)


ROOT = Path(__file__).resolve().parents[2]
_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_LAUNCHER_PREFIXES = ("SLURM", "TORCHELASTIC_", "NCCL_", "OMPI_", "PMI_", "DIAGNOSE_")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(mark: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
    # the "nodes" share this host: on a GPU host they would all drive its GPU(s) with NCCL, which
    # refuses two ranks on one device, so they see none and test on gloo as on a CPU host
    env.update(
        PYTHONPATH=pythonpath(ROOT), DIAGNOSE_TEST_MARK=mark, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra
    )
    return env


def _leftovers(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DIAGNOSE_TEST_MARK") == mark:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _run_all(procs: list[subprocess.Popen], mark: str, limit: float) -> float:
    """Wait for every process; on overrun kill them all and fail. Returns the wall time."""
    start = time.monotonic()
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, limit - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not end within {limit} s")
    finally:
        for proc in _leftovers(mark):
            proc.kill()
    return time.monotonic() - start


def _no_orphans(mark: str) -> None:
    deadline = time.monotonic() + 3  # a killed process may take a moment to be reaped
    while _leftovers(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _leftovers(mark), "processes of the run were left behind"


def _srun_rank(rank: int, nodes: list[str], tasks_per_node: int, port: int, mark: str, args: list[str], log: Path,
               prefix: tuple[str, ...] = (), **extra: str) -> subprocess.Popen:  # fmt: skip
    """One rank as srun starts it: SLURM's variables, rank 0's node hosting the store."""
    node = rank // tasks_per_node
    slurm = dict(
        SLURM_JOB_ID="77", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % tasks_per_node),
        SLURM_NODEID=str(node), SLURM_NTASKS=str(len(nodes) * tasks_per_node), SLURM_NNODES=str(len(nodes)),
        SLURM_TASKS_PER_NODE=f"{tasks_per_node}(x{len(nodes)})", SLURM_JOB_NODELIST=",".join(nodes),
        SLURMD_NODENAME=nodes[node], MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    env = _env(mark, **{**slurm, **extra})
    argv = [*prefix, sys.executable, "-m", "diagnose", "cluster", "--json", *args]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _diagnose(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *argv],
        cwd=ROOT,
        env=_env("offline"),
        capture_output=True,
        text=True,
        timeout=60,
    )


FIXTURE = ROOT / "tests" / "fixtures" / "cluster" / "two-nodes-torch-differs.json"


def test_a_recorded_cluster_snapshot_with_a_faked_version_is_rediagnosed(capsys):
    # recorded from the two-node run below (NCCL_IB_DISABLE=1 on node1); node0's torch edited older
    from diagnose.cli import main

    assert main(["cluster", "--from", str(FIXTURE), "--json"]) == 1
    findings = {f["id"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    versions = findings["cluster.version-mismatch"]
    assert [e["observed"] for e in versions["evidence"] if e["state"] == "fired"] == [["torch"]]
    assert [e["observed"] for e in findings["cluster.nccl-env-mismatch"]["evidence"] if e["state"] == "fired"] == [
        ["NCCL_IB_DISABLE"]
    ]


@pytest.mark.parametrize("command", [["cluster"], []], ids=["diagnose cluster", "diagnose"])
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_the_report_has_a_section_per_node(capsys, fmt, command):
    from diagnose.cli import main

    main([*command, "--from", str(FIXTURE), "--format", fmt])
    out = capsys.readouterr().out
    node0, node1 = out.index("Node node0"), out.index("Node node1")
    assert (
        "2.12.1+cpu (differs between nodes)" in out[node0:] and "2.13.0+cpu (differs between nodes)" in out[node1:node0]
    )
    assert "NCCL_IB_DISABLE" in out[node1:node0] and "rank 3" in out[node0:]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cluster"], "run `diagnose cluster` under torchrun or srun"),
        (["cluster", "--timeout", "0"], "--timeout: must be a positive number"),
        (
            ["cluster", "--from", str(ROOT / "tests" / "fixtures" / "snapshots" / "healthy.json")],
            "not a cluster snapshot",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(capsys, monkeypatch, argv, message):
    from diagnose.cli import main

    for name in [*_LAUNCHER_VARS, *(k for k in os.environ if k.startswith(("SLURM", "TORCHELASTIC_")))]:
        monkeypatch.delenv(name, raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@_NEEDS
def test_two_nodes_under_torchrun_one_report_and_a_planted_nccl_difference(tmp_path):
    mark, port = uuid.uuid4().hex[:8], _free_port()
    report, snapshot = tmp_path / "report.json", tmp_path / "facts.json"
    procs = []
    for node in (0, 1):
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "-m", "diagnose", "cluster", "--json", "--out", str(report), "--save-facts", str(snapshot),
            "--max-size", "64KB", "--timeout", "60", "--join-timeout", "45",
        ]  # fmt: skip
        extra = {"NCCL_ALGO": "Ring"} if node == 1 else {}
        env = _env(mark, DIAGNOSE_NODE_NAME=f"node{node}", **extra)
        log = (tmp_path / f"node{node}.log").open("wb")
        procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    _run_all(procs, mark, limit=90)
    _no_orphans(mark)
    assert report.exists(), (tmp_path / "node0.log").read_text()[-3000:]

    data = json.loads(report.read_text())
    cluster = data["facts"]["cluster"]
    assert sorted(n["name"] for n in cluster["nodes"]) == ["node0", "node1"]
    assert all(n["reported"] and n["torch"]["version"] for n in cluster["nodes"])
    assert [r["state"] for r in cluster["ranks"]] == ["reported"] * 4
    tests = data["facts"]["microtests"]
    for name in ("rendezvous", "barrier", "all_reduce"):
        assert (tests[name]["status"], tests[name]["nproc"]) == ("passed", 4), tests[name]
    assert tests["all_reduce"]["measurements"]["correct"] is True
    assert tests["all_reduce"]["measurements"]["busbw_gbps_max"] > 0
    other = next(n for n in cluster["nodes"] if 0 not in n["ranks"])
    assert other["inter_gbps"] > 0  # measured across the two "nodes"
    assert all(n["intra_busbw_gbps"] > 0 for n in cluster["nodes"])

    ids = [f["id"] for f in data["findings"]]
    assert "cluster.nccl-env-mismatch" in ids
    finding = data["findings"][ids.index("cluster.nccl-env-mismatch")]
    fired = [e for e in finding["evidence"] if e["state"] == "fired"]
    assert fired[0]["observed"] == ["NCCL_ALGO"] and finding["score"] >= 5
    assert all(
        ids.index("cluster.nccl-env-mismatch") < i
        for i, f in enumerate(ids)
        if f.startswith("cluster.") and f != "cluster.nccl-env-mismatch"
    )

    offline = _diagnose("--from", str(snapshot), "--json")  # the saved cluster snapshot, re-diagnosed
    assert offline.returncode == 1, offline.stderr
    assert "cluster.nccl-env-mismatch" in [f["id"] for f in json.loads(offline.stdout)["findings"]]
    text = _diagnose("cluster", "--from", str(snapshot)).stdout
    assert "Node node0" in text and "Node node1" in text and "NCCL_ALGO" in text


@_NEEDS
def test_a_node_that_never_starts_ends_the_run_within_the_deadline(tmp_path):
    mark, port = uuid.uuid4().hex[:8], _free_port()
    nodes = [f"c{mark}a", f"c{mark}b"]
    args = ["--join-timeout", "3", "--timeout", "20", "--out", str(tmp_path / "report.json")]
    proc = _srun_rank(0, nodes, 1, port, mark, args, tmp_path / "rank0.log")  # the second node never starts
    wall = _run_all([proc], mark, limit=30)
    _no_orphans(mark)
    assert proc.returncode == 1, (tmp_path / "rank0.log").read_text()[-3000:]
    assert wall < 18  # the join deadline, not the whole run's, ended it

    data = json.loads((tmp_path / "report.json").read_text())
    cluster = data["facts"]["cluster"]
    assert [(r["rank"], r["state"], r["node"]) for r in cluster["ranks"]] == [
        (0, "reported", nodes[0]),
        (1, "missing", nodes[1]),
    ]
    assert data["summary"]["top"] == "cluster.missing-rank"
    missing = next(f for f in data["findings"] if f["id"] == "cluster.missing-rank")
    assert [nodes[1]] in [e["observed"] for e in missing["evidence"]]
    assert data["facts"]["microtests"]["rendezvous"]["status"] == "timed_out"


@_NEEDS
def test_a_rank_whose_rank_0_never_starts_says_so_in_one_line(tmp_path):
    mark, port = uuid.uuid4().hex[:8], _free_port()
    args = ["--join-timeout", "2", "--timeout", "40", "--out", str(tmp_path / "report.json")]
    proc = _srun_rank(1, [f"z{mark}a", f"z{mark}b"], 1, port, mark, args, tmp_path / "rank1.log")
    wall = _run_all([proc], mark, limit=30)
    _no_orphans(mark)
    assert proc.returncode == 1 and wall < 30  # the join deadline ended it, not the hard one
    lines = [line for line in (tmp_path / "rank1.log").read_text().splitlines() if line.startswith("diagnose")]
    assert lines == [lines[0]] and lines[0].startswith(f"diagnose cluster: rank 1 at 'start': store 127.0.0.1:{port}:")
    assert not (tmp_path / "report.json").exists()  # only rank 0 writes the report


@_NEEDS
def test_a_hung_rank_is_named_where_it_stopped_and_killed_by_its_own_watchdog(tmp_path):
    mark, port = uuid.uuid4().hex[:8], _free_port()
    nodes = [f"h{mark}a", f"h{mark}b"]
    args = [
        "--join-timeout",
        "15",
        "--timeout",
        "20",
        "--op-timeout",
        "2",
        "--max-size",
        "4KB",
        "--out",
        str(tmp_path / "report.json"),
    ]
    fault = {"DIAGNOSE_CLUSTER_TESTING": "1", "DIAGNOSE_CLUSTER_FAULT": "1:barrier"}
    procs = [_srun_rank(r, nodes, 1, port, mark, args, tmp_path / f"rank{r}.log", **fault) for r in (0, 1)]
    wall = _run_all(procs, mark, limit=40)
    _no_orphans(mark)
    # the deadlines leave a loaded machine time to import torch in both ranks before rank 1 joins
    # (at 8 s it once came late and was reported missing rather than silent at its barrier)
    assert wall < 28
    assert procs[1].returncode == 1  # the hung rank ended by its watchdog at the deadline

    data = json.loads((tmp_path / "report.json").read_text())
    ranks = data["facts"]["cluster"]["ranks"]
    assert (ranks[1]["state"], ranks[1]["step"]) == ("silent", "barrier")
    barrier = data["facts"]["microtests"]["barrier"]
    assert barrier["status"] in ("timed_out", "failed") and barrier["measurements"]["missing_ranks"] == "1"
    assert "cluster.missing-rank" in [f["id"] for f in data["findings"]]


@_NEEDS
def test_a_report_still_being_written_at_the_deadline_is_finished_not_cut(tmp_path):
    """Rank 0's main thread writes the report past the deadline: the watchdog waits for it instead
    of writing a second report over it and ending the process under it (an empty file)."""
    mark, port = uuid.uuid4().hex[:8], _free_port()
    nodes = [f"h{mark}a", f"h{mark}b"]
    out = tmp_path / "report.json"
    args = ["--join-timeout", "8", "--timeout", "12", "--op-timeout", "2", "--max-size", "4KB", "--out", str(out)]
    fault = {"DIAGNOSE_CLUSTER_TESTING": "1", "DIAGNOSE_CLUSTER_FAULT": "0:write"}
    procs = [_srun_rank(r, nodes, 1, port, mark, args, tmp_path / f"rank{r}.log", **fault) for r in (0, 1)]
    _run_all(procs, mark, limit=40)
    _no_orphans(mark)
    data = json.loads(out.read_text())
    assert len(data["facts"]["cluster"]["ranks"]) == 2
    assert "deadline passed; reporting what rank 0 has" not in (tmp_path / "rank0.log").read_text()


@pytest.fixture
def slow_host():
    """A network namespace behind a veth pair limited to 40 Mbit/s: a second address, a slow link (far below
    loopback even on a loaded machine, where loopback itself slows)."""
    tag = uuid.uuid4().hex[:6]
    ns, outside, inside = f"dg{tag}", f"dg{tag}o", f"dg{tag}i"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside],
        ["ip", "link", "set", inside, "netns", ns],
        ["ip", "addr", "add", "10.213.7.1/24", "dev", outside],
        ["ip", "link", "set", outside, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", "10.213.7.2/24", "dev", inside],
        ["ip", "netns", "exec", ns, "ip", "link", "set", inside, "up"],
        [
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            inside,
            "root",
            "tbf",
            "rate",
            "40mbit",
            "burst",
            "64kb",
            "latency",
            "100ms",
        ],
    ]
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            pytest.skip(f"no network namespaces here: {tool} (iproute2) is not installed")
    try:
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            if done.returncode:
                pytest.skip(f"no network namespaces here: {' '.join(argv[:3])}: {done.stderr.strip()}")
        yield ns, outside, inside
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)  # takes the veth pair with it


@_NEEDS
def test_a_node_behind_a_slow_link_is_named(tmp_path, slow_host):
    ns, outside, inside = slow_host
    mark, port = uuid.uuid4().hex[:8], _free_port()
    nodes = [f"s{mark}{i}" for i in range(3)]
    args = ["--join-timeout", "40", "--timeout", "50", "--max-size", "256KB", "--out", str(tmp_path / "report.json")]
    procs = []
    for rank in range(3):
        # gloo must talk over the veth pair; the third "node" lives behind the limited end
        env = {"MASTER_ADDR": "10.213.7.1", "GLOO_SOCKET_IFNAME": inside if rank == 2 else outside}
        prefix = ("ip", "netns", "exec", ns) if rank == 2 else ()
        procs.append(_srun_rank(rank, nodes, 1, port, mark, args, tmp_path / f"rank{rank}.log", prefix, **env))
    _run_all(procs, mark, limit=60)
    _no_orphans(mark)

    data = json.loads((tmp_path / "report.json").read_text())
    cluster = data["facts"]["cluster"]
    speeds = {n["name"]: n["inter_gbps"] for n in cluster["nodes"]}
    # the rule's own measure: under SLOW_NODE_FRACTION of the median of all nodes
    measured = [(name, gbps) for name, gbps in speeds.items() if gbps is not None]
    assert slow_nodes(measured) == [nodes[2]], speeds
    assert "cluster.slow-node" in [f["id"] for f in data["findings"]]
    slow = next(f for f in data["findings"] if f["id"] == "cluster.slow-node")
    assert [nodes[2]] in [e["observed"] for e in slow["evidence"]]
