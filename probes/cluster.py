"""The ``cluster`` section: one job's ranks across nodes, seen from inside the job.

``run(options)`` is called in every rank of a job that torchrun or srun started (one process
per GPU, like the training job). Each rank reads who it is from the launcher's variables, its
node's local rank 0 collects the node's facts (``probes.collect``), every rank notes its own
device, the micro-tests run in the job's own process group (so the real inter-node path
carries them), and rank 0 gathers it all into one ``Facts`` with ``Facts.cluster`` filled.

The control plane is the job's TCP store (torchrun's agent store, or one rank 0 hosts as
``env://`` would), not a collective: each rank writes when it arrives, every step it enters
and its results as keys, so rank 0 can always say who arrived where, even when a collective
hangs or a node never starts. Every wait has a deadline, and each rank runs its own watchdog
thread that ends the process at the hard deadline (rank 0 first hands what it has to
``on_expiry``, which writes the report).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from probes import launcher as launcher_probe
from probes.facts import Cluster, ClusterNode, ClusterRank, Facts, MicroTests, ProbeError, Skipped
from probes.microtests.channel import RankReport
from probes.microtests.checks import SIZES, iterations, size_label
from probes.microtests.errors import classify
from probes.microtests.judge import bandwidth, judge

PREFIX = "diagnose/"
_POLL_S = 0.05
# Rank 0 stops gathering this long before the hard deadline, to diagnose and write in time.
_WRITE_RESERVE_S = 3.0
# Bytes moved per send/recv between rank 0 and each node's first rank.
_P2P_BYTES = 4 << 20
_P2P_ROUNDS = 5


class LaunchError(ValueError):
    """The environment does not describe one rank of a launched job."""


class ClusterError(RuntimeError):
    """This rank could not take part: no store to reach or host, or no word from rank 0 in time."""


# --- who this rank is ---------------------------------------------------------------------------


@dataclass
class Identity:
    rank: int
    local_rank: int
    world_size: int
    node: str  # the node's name in the report
    hostname: str
    node_rank: int | None
    nnodes: int | None
    kind: str  # torchrun, slurm, ...
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun's agent hosts the store; every rank is a client


def node_name(environ: Mapping[str, str]) -> str:
    """DIAGNOSE_NODE_NAME (two "nodes" on one host in tests), SLURM's name, or the hostname."""
    return environ.get("DIAGNOSE_NODE_NAME") or environ.get("SLURMD_NODENAME") or socket.gethostname()


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list: ``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1."""
    names: list[str] = []
    for part in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        names.extend(_expand_one(part.strip()))
    return [n for n in names if n]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if not match:
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    out = []
    for piece in match.group(1).split(","):
        lo, _, hi = piece.partition("-")
        if hi and lo.isdigit() and hi.isdigit():
            numbers = [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
        else:
            numbers = [piece]
        out.extend(f"{head}{n}{rest}" for n in numbers for rest in _expand_one(tail))
    return out


def _slurm_counts(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for count, times in re.findall(r"(\d+)(?:\(x(\d+)\))?", text):
        counts.extend([int(count)] * int(times or 1))
    return counts


def identity(environ: Mapping[str, str]) -> Identity:
    found = launcher_probe.probe(environ)
    if found.rank is None or found.world_size is None:
        raise LaunchError(
            "no RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS) in the environment: "
            "run `diagnose cluster` under torchrun or srun, once per GPU"
        )
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not addr and environ.get("SLURM_JOB_NODELIST", environ.get("SLURM_NODELIST")):
        # as Lightning's SLURM environment does: the first node of the allocation hosts the store
        addr = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ["SLURM_NODELIST"])[0]
    if not port and environ.get("SLURM_JOB_ID", "").isdigit():
        port = str(15000 + int(environ["SLURM_JOB_ID"][-4:]))
    if not addr or not port or not port.isdigit():
        raise LaunchError("no MASTER_ADDR/MASTER_PORT and no SLURM allocation to derive them from")
    nnodes = found.nnodes
    if nnodes is None and environ.get("GROUP_WORLD_SIZE", "").isdigit():
        nnodes = int(environ["GROUP_WORLD_SIZE"])  # torchrun: one worker group per node
    return Identity(
        rank=found.rank,
        local_rank=found.local_rank if found.local_rank is not None else 0,
        world_size=found.world_size,
        node=node_name(environ),
        hostname=socket.gethostname(),
        node_rank=found.node_rank,
        nnodes=nnodes,
        kind=found.kind or "none",
        master_addr=addr,
        master_port=int(port),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def node_key(arrival: Mapping[str, Any]) -> int | str:
    """What tells nodes apart: the launcher's node rank (torchrun's GROUP_RANK, SLURM_NODEID),
    else the node's name. Two torchrun nodes on one host share a hostname, not a node rank."""
    node_rank = arrival.get("node_rank")
    return node_rank if isinstance(node_rank, int) else str(arrival.get("node"))


def expected_nodes(me: Identity, environ: Mapping[str, str]) -> dict[int, tuple[int | None, str | None]]:
    """rank -> (node rank, node name) as the launcher lays ranks out: names the ranks that never come.

    SLURM's default block distribution and torchrun both give each node a contiguous run of
    ranks. Best effort: a rank that arrives says where it really is.
    """
    counts = _slurm_counts(environ.get("SLURM_TASKS_PER_NODE", "")) if me.kind == "slurm" else []
    if not counts and environ.get("LOCAL_WORLD_SIZE", "").isdigit() and int(environ["LOCAL_WORLD_SIZE"]) > 0:
        per = int(environ["LOCAL_WORLD_SIZE"])
        counts = [per] * -(-me.world_size // per)
    hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")
    layout: dict[int, tuple[int | None, str | None]] = {}
    rank = 0
    for node_rank, count in enumerate(counts):
        for _ in range(count):
            layout[rank] = (node_rank, hosts[node_rank] if node_rank < len(hosts) else None)
            rank += 1
    return {r: layout.get(r, (None, None)) for r in range(me.world_size)}


def planted_hang(environ: Mapping[str, str], rank: int) -> str | None:
    """Test-only: the step at which this rank hangs, from ``DIAGNOSE_CLUSTER_FAULT=RANK:STEP``.

    Honoured only with ``DIAGNOSE_CLUSTER_TESTING=1`` too, so a stray setting cannot stall a
    real diagnosis.
    """
    if environ.get("DIAGNOSE_CLUSTER_TESTING") != "1":
        return None
    who, _, step = environ.get("DIAGNOSE_CLUSTER_FAULT", "").partition(":")
    return step if who == str(rank) and step else None


# --- options and deadlines ----------------------------------------------------------------------------


@dataclass
class Options:
    timeout: float = 180.0  # the whole run, per rank; the watchdog's hard deadline
    join_timeout: float = 60.0  # for every rank to arrive
    op_timeout: float = 60.0  # for one collective
    backend: str | None = None  # nccl where CUDA is available, else gloo
    max_bytes: int = SIZES[-1]  # largest all_reduce in the sweep
    microtests: bool = True
    torch_timeout: float = 30.0  # for the node's torch probe (a child process)


@dataclass
class _Clock:
    start: float
    options: Options

    def left(self) -> float:
        return self.start + self.options.timeout - time.monotonic()

    def join_left(self) -> float:
        return min(self.start + self.options.join_timeout - time.monotonic(), self.left() - _WRITE_RESERVE_S)

    def op_timeout(self) -> timedelta:
        return timedelta(seconds=max(1.0, min(self.options.op_timeout, self.left() - 2 * _WRITE_RESERVE_S)))


# --- one rank's run ------------------------------------------------------------------------------------


@dataclass
class _Result:
    """One micro-test as this rank saw it."""

    status: str = "passed"
    error: str | None = None
    duration_s: float | None = None
    measurements: dict[str, Any] = field(default_factory=dict)


class _Rank:
    def __init__(self, me: Identity, options: Options, environ: Mapping[str, str]) -> None:
        self.me = me
        self.options = options
        self.environ = environ
        self.clock = _Clock(time.monotonic(), options)
        self.store: Any = None
        self.roster: dict[int, dict] = {}  # rank -> its arrival (node, pid, ...)
        self.results: dict[str, _Result] = {}
        self.error: str | None = None
        self.step_name = "start"
        self.node_facts: Facts | None = None
        self.node_error: str | None = None
        self.device: dict[str, Any] = {}  # what this rank's device is
        self.tensors = "cpu"  # where the collectives' tensors live: the GPU under NCCL
        self.backend = options.backend
        self.payloads: dict[int, dict] = {}  # rank 0: what has arrived so far
        self._node_thread: threading.Thread | None = None

    # the control plane ----------------------------------------------------------------

    def key(self, *parts: Any) -> str:
        return PREFIX + "/".join(str(p) for p in parts)

    def connect(self) -> Any:
        import torch.distributed as dist

        host = self.me.rank == 0 and not self.me.agent_store
        return dist.TCPStore(
            self.me.master_addr,
            self.me.master_port,
            None,
            host,
            timeout=timedelta(seconds=max(1.0, self.clock.join_left())),
            wait_for_workers=False,
            multi_tenant=host,
        )

    def step(self, name: str) -> None:
        self.step_name = name
        if self.store is not None:
            self.store.set(self.key("step", self.me.rank), name)
        if planted_hang(self.environ, self.me.rank) == name:
            threading.Event().wait()  # until the watchdog ends the process

    def announce(self) -> None:
        arrival = {"node": self.me.node, "hostname": self.me.hostname, "node_rank": self.me.node_rank,
                   "local_rank": self.me.local_rank, "pid": os.getpid()}  # fmt: skip
        self.store.set(self.key("arrived", self.me.rank), json.dumps(arrival))

    def join(self) -> None:
        """Rank 0 waits for every rank, then publishes who came; the others read that."""
        self.step("join")
        if self.me.rank == 0:
            waiting = set(range(self.me.world_size))
            while True:  # at least one look, however late this rank itself started
                waiting -= {r for r in waiting if self.store.check([self.key("arrived", r)])}
                if not waiting or self.clock.join_left() <= 0:
                    break
                time.sleep(_POLL_S)
            came = [r for r in range(self.me.world_size) if r not in waiting]
            self.store.set(self.key("roster"), json.dumps({r: json.loads(self.store.get(self.key("arrived", r))) for r in came}))
        else:
            self.store.wait([self.key("roster")], timedelta(seconds=max(1.0, self.clock.join_left() + 2 * _WRITE_RESERVE_S)))
        self.roster = {int(r): v for r, v in json.loads(self.store.get(self.key("roster"))).items()}

    # node and device facts --------------------------------------------------------------

    def start_node_facts(self) -> None:
        if self.me.local_rank != 0:
            return

        def collect() -> None:
            from probes.collect import collect as collect_node

            try:
                self.node_facts = collect_node(torch_timeout=min(self.options.torch_timeout, max(1.0, self.clock.left() / 2)))
            except Exception as exc:  # a probe bug must not cost the run
                self.node_error = f"{type(exc).__name__}: {exc}"

        self._node_thread = threading.Thread(target=collect, name="diagnose-node-facts", daemon=True)
        self._node_thread.start()

    def own_device(self) -> None:
        import torch

        cuda = torch.cuda.is_available()
        if self.backend is None:
            self.backend = "nccl" if cuda and torch.distributed.is_nccl_available() else "gloo"
        if not cuda:
            self.device = {"device": "cpu"}
            return
        # one GPU per local rank, as a training job takes it; more ranks than GPUs share one
        index = self.me.local_rank % torch.cuda.device_count()
        props = torch.cuda.get_device_properties(index)
        torch.cuda.set_device(index)
        self.device = {"device": f"cuda:{index}", "device_name": props.name, "device_uuid": str(getattr(props, "uuid", "")) or None}
        if self.backend == "nccl":
            self.tensors = f"cuda:{index}"

    # the micro-tests in the job's own process group ----------------------------------------

    def run_tests(self) -> None:
        """Each test in turn; after a failure the ranks may be out of step, so the rest are skipped."""
        for name, body in (
            ("rendezvous", self._rendezvous),
            ("barrier", self._barrier),
            ("all_reduce", self._all_reduce),
            ("intra_node", self._intra_node),
            ("inter_node", self._inter_node),
        ):
            if self.error is not None:
                self.results[name] = _Result(status="skipped", error=f"after an earlier failure: {self.error}")
                continue
            result = self.results[name] = _Result()
            start = time.perf_counter()
            try:
                body(result)
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}".strip()[:2000]
                timed_out, named = classify(text)
                result.status, result.error = ("timed_out" if timed_out else "failed"), text
                if named:  # monitored_barrier says who never arrived
                    result.measurements["missing_ranks"] = named
                self.error = f"{name} at '{self.step_name}': {text.splitlines()[0][:300]}"
            result.duration_s = round(time.perf_counter() - start, 4)

    def _sync(self) -> None:
        import torch

        if self.tensors != "cpu":
            torch.cuda.synchronize()

    def _rendezvous(self, result: _Result) -> None:
        import torch
        import torch.distributed as dist

        self.step("init_process_group")
        start = time.perf_counter()
        # gloo raises at the timeout and the run goes on; NCCL's own watchdog would abort the
        # process instead, so under NCCL the hard deadline (rank 0 reports what it has) comes first
        timeout = self.clock.op_timeout() if self.backend != "nccl" else timedelta(seconds=self.clock.left() + 60)
        dist.init_process_group(
            self.backend, store=dist.PrefixStore(self.key("pg"), self.store),
            rank=self.me.rank, world_size=self.me.world_size, timeout=timeout,
        )  # fmt: skip
        result.measurements["init_s"] = round(time.perf_counter() - start, 4)
        self.step("first all_reduce")
        start = time.perf_counter()
        ones = torch.ones(1, device=self.tensors)
        dist.all_reduce(ones)
        result.measurements["first_collective_s"] = round(time.perf_counter() - start, 4)
        if ones.item() != self.me.world_size:
            result.status = "failed"
            result.error = f"rank {self.me.rank}: sum of ones over {self.me.world_size} ranks gave {ones.item()}"

    def _barrier(self, result: _Result) -> None:
        import torch.distributed as dist

        # monitored_barrier names the ranks that never arrive; only gloo implements it
        side = dist.new_group(backend="gloo") if self.backend != "gloo" else None
        self.step("barrier")
        start = time.perf_counter()
        dist.monitored_barrier(group=side, timeout=self.clock.op_timeout(), wait_all_ranks=True)
        if side is not None:
            dist.barrier()
            self._sync()
        result.measurements["barrier_s"] = round(time.perf_counter() - start, 4)

    def _all_reduce(self, result: _Result) -> None:
        """Exact sums, then time per size, as the single-machine micro-test does, across the job."""
        import torch
        import torch.distributed as dist

        world, dev = self.me.world_size, self.tensors
        result.measurements["correct"] = True
        for size in [s for s in SIZES if s <= self.options.max_bytes]:
            label = size_label(size)
            self.step(f"all_reduce {label}")
            count = size // 4
            # small integers: every partial sum is exact in float32, so equality is the test
            pattern = (torch.arange(count, dtype=torch.int32) % 7).to(torch.float32)
            data = (pattern + self.me.rank + 1).to(dev)
            dist.all_reduce(data)
            if not torch.equal(data, (pattern * world + world * (world + 1) // 2).to(dev)):
                result.status, result.measurements["correct"] = "failed", False
                result.error = f"{label}: rank {self.me.rank} got a wrong all_reduce sum"
            buffer = torch.zeros(count, device=dev)
            result.measurements[f"time_s_{label}"] = self._timed(lambda: dist.all_reduce(buffer), size, None)

    def _intra_node(self, result: _Result) -> None:
        import torch
        import torch.distributed as dist

        mine = self._nodes()[node_key({"node": self.me.node, "node_rank": self.me.node_rank})]
        if len(mine) < 2:
            return
        self.step("intra-node all_reduce")
        group = dist.new_group(mine, use_local_synchronization=True)
        size = self._p2p_size()
        buffer = torch.zeros(size // 4, device=self.tensors)
        seconds = self._timed(lambda: dist.all_reduce(buffer, group=group), size, group)
        result.measurements["busbw_gbps"] = round(bandwidth(size, seconds, len(mine))[1], 4)

    def _inter_node(self, result: _Result) -> None:
        """Rank 0 sends to and receives from each other node's first rank in turn: one figure per node."""
        import torch
        import torch.distributed as dist

        leaders = [ranks[0] for ranks in self._nodes().values() if 0 not in ranks]
        buffer = torch.zeros(self._p2p_size() // 4, device=self.tensors)
        for leader in leaders:
            if self.me.rank == 0:
                self.step(f"send/recv with rank {leader}")
                start = time.perf_counter()
                for _ in range(_P2P_ROUNDS):
                    dist.send(buffer, leader)
                    dist.recv(buffer, leader)
                self._sync()
                moved = 2 * _P2P_ROUNDS * buffer.numel() * 4
                result.measurements[f"gbps_rank{leader}"] = round(moved / (time.perf_counter() - start) / 1e9, 4)
            elif self.me.rank == leader:
                self.step("send/recv with rank 0")
                for _ in range(_P2P_ROUNDS):
                    dist.recv(buffer, 0)
                    dist.send(buffer, 0)
        self.step("final barrier")
        dist.barrier()

    def _p2p_size(self) -> int:
        return min(_P2P_BYTES, self.options.max_bytes)

    def _timed(self, op: Callable[[], Any], size: int, group: Any) -> float:
        """Seconds per call after a warm-up, the group lined up by a barrier first."""
        import torch.distributed as dist

        warmup, timed = iterations(size)
        for _ in range(warmup):
            op()
        self._sync()
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(timed):
            op()
        self._sync()
        return (time.perf_counter() - start) / timed

    def _nodes(self) -> dict[int | str, list[int]]:
        nodes: dict[int | str, list[int]] = {}
        for rank in sorted(self.roster):
            nodes.setdefault(node_key(self.roster[rank]), []).append(rank)
        return nodes

    # results ----------------------------------------------------------------------------------

    def payload(self) -> dict:
        if self._node_thread is not None:
            self._node_thread.join(timeout=max(0.0, self.clock.left() - 2 * _WRITE_RESERVE_S))
            if self._node_thread.is_alive():
                self.node_error = "the node's facts were not collected before the deadline"
        return {
            "rank": self.me.rank, "local_rank": self.me.local_rank, "node": self.me.node,
            "node_rank": self.me.node_rank, "hostname": self.me.hostname, "pid": os.getpid(),
            "device": self.device, "error": self.error, "step": self.step_name,
            "tests": {name: vars(r) for name, r in self.results.items()},
            "node_facts": self.node_facts.model_dump(mode="json") if self.node_facts is not None else None,
            "node_error": self.node_error,
        }  # fmt: skip

    def post(self) -> None:
        self.step("done")
        self.store.set(self.key("report", self.me.rank), json.dumps(self.payload()))

    def gather(self) -> None:
        """Rank 0: read the ranks' results as they come, until all are in or time is up."""
        waiting = set(self.roster) - set(self.payloads)
        while waiting and self.clock.left() > _WRITE_RESERVE_S:
            for rank in sorted(waiting):
                if self.store.check([self.key("report", rank)]):
                    self.payloads[rank] = json.loads(self.store.get(self.key("report", rank)))
            waiting = set(self.roster) - set(self.payloads)
            if waiting:
                time.sleep(_POLL_S)

    def share_verdict(self, code: int) -> None:
        """Rank 0: the exit code for all; wait (briefly) until every rank that came has read it."""
        self.store.set(self.key("exit"), str(code))
        others = len(self.roster) - 1
        until = time.monotonic() + min(_WRITE_RESERVE_S, max(0.0, self.clock.left()))
        while self.store.add(self.key("read"), 0) < others and time.monotonic() < until:
            time.sleep(_POLL_S)

    def await_verdict(self) -> int:
        self.step("waiting for rank 0's report")
        try:
            self.store.wait([self.key("exit")], timedelta(seconds=max(1.0, self.clock.left())))
            code = int(self.store.get(self.key("exit")))
            self.store.add(self.key("read"), 1)
        except Exception as exc:  # rank 0 gone: its report, if any, is all there is
            sys.stderr.write(f"diagnose cluster: rank {self.me.rank}: no word from rank 0 ({type(exc).__name__}); exiting\n")
            return 1
        return code

    def steps_of_silent(self, store: Any) -> dict[int, str]:
        if store is None:
            return {}
        steps = {}
        for rank in self.roster:
            if rank not in self.payloads and store.check([self.key("step", rank)]):
                steps[rank] = store.get(self.key("step", rank)).decode(errors="replace")
        return steps

    def fresh_client(self) -> Any:
        """A second store connection, for the watchdog while the main thread may hold the first."""
        import torch.distributed as dist

        return dist.TCPStore(self.me.master_addr, self.me.master_port, None, False, timeout=timedelta(seconds=2), wait_for_workers=False)


# --- rank 0 puts it together -----------------------------------------------------------------------


def assemble(
    me: Identity,
    roster: Mapping[int, dict],
    payloads: Mapping[int, dict],
    steps: Mapping[int, str],
    layout: Mapping[int, tuple[int | None, str | None]],
    *,
    backend: str | None,
    microtests_run: bool,
) -> Facts:
    """The job's Facts: rank 0's node in the usual sections, every node and rank in ``cluster``."""
    cluster = Cluster(source="live", world_size=me.world_size, nnodes=me.nnodes, backend=backend)
    where: dict[int, tuple[int | str, str, int | None]] = {}  # rank -> (node key, name, node rank)
    for rank in range(me.world_size):
        arrival = roster.get(rank) or {}
        node_rank, expected = layout.get(rank, (None, None))
        node_rank = arrival.get("node_rank", node_rank)
        name = arrival.get("node") or expected or (f"node {node_rank}" if node_rank is not None else "unknown node")
        where[rank] = (node_key({"node": name, "node_rank": node_rank}), name, node_rank)
    # the hostname is the label; where one host runs several nodes, their node ranks tell them apart
    keys_of: dict[str, set[int | str]] = {}
    for key, name, _ in where.values():
        keys_of.setdefault(name, set()).add(key)
    nodes: dict[int | str, ClusterNode] = {}
    for rank in range(me.world_size):
        arrival, payload = roster.get(rank), payloads.get(rank)
        key, name, node_rank = where[rank]
        if len(keys_of[name]) > 1 and node_rank is not None:
            name = f"{name} (node {node_rank})"
        node = nodes.setdefault(key, ClusterNode(name=name, node_rank=node_rank))
        node.ranks.append(rank)
        if arrival and node.hostname is None:
            node.hostname = arrival.get("hostname")
        state = "reported" if payload else "silent" if arrival else "missing"
        entry = ClusterRank(rank=rank, node=name, state=state, local_rank=(arrival or {}).get("local_rank"), pid=(arrival or {}).get("pid"))
        if payload:
            entry.step, entry.error = payload.get("step"), payload.get("error")
            entry.device, entry.device_name, entry.device_uuid = (payload["device"].get(k) for k in ("device", "device_name", "device_uuid"))
            _fill_node(node, payload)
        elif arrival:
            entry.step = steps.get(rank)
        cluster.ranks.append(entry)
    cluster.nodes = sorted(nodes.values(), key=lambda n: (n.node_rank is None, n.node_rank or 0, min(n.ranks)))
    _bandwidths(cluster, payloads)

    own = next((n for n in cluster.nodes if 0 in n.ranks), None)
    facts = Facts(inputs=["live", f"cluster:{len(cluster.nodes)} nodes, {me.world_size} ranks"], cluster=cluster)
    from datetime import datetime, timezone

    facts.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if own is not None and own.reported:
        for section in ("host", "packages", "env", "torch", "gpus", "driver", "launcher"):
            setattr(facts, section, getattr(own, section))
    for node in cluster.nodes:
        facts.errors.extend(ProbeError(probe=f"{node.name}: {e.probe}", message=e.message) for e in node.errors)
    facts.microtests = _microtests(me.world_size, roster, payloads, steps, backend) if microtests_run else MicroTests(source="live")
    if not microtests_run:
        facts.skipped.append(Skipped(what="cluster micro-tests", reason="not requested (--microtests none)"))
    elif len(roster) < me.world_size:
        facts.skipped.append(Skipped(what="cluster micro-tests", reason=f"{me.world_size - len(roster)} rank(s) never joined"))
    return facts


def _fill_node(node: ClusterNode, payload: dict) -> None:
    if payload.get("node_error"):
        node.errors.append(ProbeError(probe="node facts", message=payload["node_error"]))
    data = payload.get("node_facts")
    if not data or node.reported:
        return
    facts = Facts.model_validate(data)
    for section in ("host", "packages", "env", "torch", "gpus", "driver", "launcher"):
        setattr(node, section, getattr(facts, section))
    node.errors.extend(facts.errors)
    node.reported = True


def _bandwidths(cluster: Cluster, payloads: Mapping[int, dict]) -> None:
    inter = payloads.get(0, {}).get("tests", {}).get("inter_node", {}).get("measurements", {})
    for node in cluster.nodes:
        leader = min(node.ranks)
        intra = payloads.get(leader, {}).get("tests", {}).get("intra_node", {}).get("measurements", {})
        node.intra_busbw_gbps = intra.get("busbw_gbps")
        node.inter_gbps = inter.get(f"gbps_rank{leader}")


def _microtests(world: int, roster: Mapping[int, dict], payloads: Mapping[int, dict], steps: Mapping[int, str], backend: str | None) -> MicroTests:
    """The job's collectives, judged as the local micro-tests are (``probes.microtests.judge``)."""
    tests = MicroTests(source="microtest")
    missing = [r for r in range(world) if r not in roster]
    where = {r: "never joined" for r in missing}
    where.update({r: f"silent at '{steps.get(r, 'unknown')}'" for r in roster if r not in payloads})
    where.update({r: p.get("step", "?") for r, p in payloads.items()})
    states = {str(r): s for r, s in sorted(where.items())}
    if missing:
        test = judge("rendezvous", {r: RankReport() for r in range(world)}, status="timed_out",
                     error=f"rank(s) {', '.join(map(str, missing))} never joined the job",
                     nproc=world, backend=backend, duration_s=None, ranks=states)  # fmt: skip
        test.measurements.update(joined=len(roster), expected=world)
        tests.rendezvous = test
        return tests
    for name in ("rendezvous", "barrier", "all_reduce"):
        seen = {r: p["tests"][name] for r, p in payloads.items() if name in p.get("tests", {})}
        if not seen and not payloads:
            continue
        status, error = _verdict([t["status"] for t in seen.values()], seen, world)
        setattr(tests, name, judge(
            name, {r: _as_report(name, seen.get(r)) for r in range(world)}, status=status, error=error,
            nproc=world, backend=backend, ranks=states,
            duration_s=max((t["duration_s"] or 0 for t in seen.values()), default=None),
        ))  # fmt: skip
    return tests


def _verdict(statuses: list[str], seen: Mapping[int, dict], world: int) -> tuple[str, str | None]:
    """(status, error): the worst rank's status; a rank that never reported did not finish."""
    status = next((s for s in ("timed_out", "failed", "skipped") if s in statuses), "passed")
    if len(seen) < world and status == "passed":
        status = "timed_out"
    first = next((t for t in seen.values() if t.get("error")), None)
    return status, first["error"] if first else None


def _as_report(name: str, test: dict | None) -> RankReport:
    """One rank's result of one collective, as the judge reads a local rank's channel."""
    if test is None:
        return RankReport()
    measurements = dict(test.get("measurements") or {})
    wrong = measurements.get("correct") is False
    return RankReport(
        steps=[name] if test["status"] != "skipped" else [],
        measurements=measurements,
        checks_failed=[test.get("error") or "wrong result"] if wrong else [],
        error=test.get("error") if not wrong else None,
        missing=list(measurements.pop("missing_ranks", []) or []),
        done=test["status"] == "passed" or wrong,
    )


# --- the whole run, in one rank --------------------------------------------------------------------

# rank 0's report writer: (facts, the deadline passed) -> the exit code every rank ends with
Report = Callable[[Facts, bool], int]


def run(options: Options, report: Report, *, environ: Mapping[str, str] | None = None) -> int:
    """This rank's part of the cluster diagnosis; returns the exit code, the same on every rank.

    Rank 0 hands the job's Facts to ``report`` and shares its return code through the store:
    under torchrun a node whose ranks exit 0 while another node's fail waits out the agents'
    exit barrier, so all ranks end alike. At the hard deadline the watchdog thread ends the
    process (rank 0 first reports what it has).
    """
    environ = dict(os.environ) if environ is None else environ
    me = identity(environ)
    rank = _Rank(me, options, environ)
    layout = expected_nodes(me, environ)
    done = threading.Event()

    def facts(store: Any) -> Facts:
        steps = rank.steps_of_silent(store)
        return assemble(me, rank.roster, dict(rank.payloads), steps, layout, backend=rank.backend, microtests_run=options.microtests)

    def watchdog() -> None:
        if done.wait(max(0.0, rank.clock.left())):
            return
        code = 1
        try:
            if me.rank == 0:
                try:
                    store = rank.fresh_client()
                except Exception:  # the store itself may be what hangs
                    store = None
                code = report(facts(store), True)
            else:
                sys.stderr.write(f"diagnose cluster: rank {me.rank}: the deadline passed at '{rank.step_name}'; exiting\n")
        finally:
            os._exit(code)

    threading.Thread(target=watchdog, name="diagnose-watchdog", daemon=True).start()
    try:
        rank.start_node_facts()
        rank.own_device()
        try:
            rank.store = rank.connect()
            rank.announce()
            rank.join()
        except Exception as exc:  # the store is the one thing every rank needs
            where = f"{me.master_addr}:{me.master_port}"
            raise ClusterError(f"rank {me.rank} at '{rank.step_name}': store {where}: {str(exc).splitlines()[0][:300]}") from None
        if options.microtests and len(rank.roster) == me.world_size:
            rank.run_tests()
        rank.post()
        if me.rank != 0:
            return rank.await_verdict()
        rank.gather()
        code = report(facts(rank.store), False)
        rank.share_verdict(code)
        return code
    finally:
        done.set()
        _leave_group()


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # tearing down a broken group must not hide the report
            pass
