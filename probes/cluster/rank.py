"""One rank's run: its node's facts (local rank 0), its device, the collectives in the job's
own process group, and its part of the protocol to the end, under a watchdog thread."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from probes.cluster.assemble import assemble
from probes.cluster.identity import Identity, expected_nodes, identity, node_key, planted_hang
from probes.cluster.options import WRITE_RESERVE_S, Clock, Options
from probes.cluster.store import ControlPlane
from probes.facts import Facts
from probes.microtests.checks import SIZES, iterations, size_label
from probes.microtests.errors import classify
from probes.microtests.judge import bandwidth

# Bytes moved per send/recv between rank 0 and each node's first rank.
_P2P_BYTES = 4 << 20
# how long one of rank 0's two report writers (main thread, watchdog) waits for the other
_REPORT_GRACE_S = 2 * WRITE_RESERVE_S
_P2P_ROUNDS = 5


class ClusterError(RuntimeError):
    """This rank could not take part: no store to reach or host, or no word from rank 0 in time."""


@dataclass
class _Result:
    """One micro-test as this rank saw it."""

    status: str = "passed"
    error: str | None = None
    duration_s: float | None = None
    measurements: dict[str, Any] = field(default_factory=dict)


class Rank:
    def __init__(self, me: Identity, options: Options, environ: Mapping[str, str]) -> None:
        self.me = me
        self.options = options
        self.environ = environ
        self.clock = Clock(time.monotonic(), options)
        self.plane = ControlPlane(me, self.clock)
        self.results: dict[str, _Result] = {}
        self.error: str | None = None
        self.step_name = "start"
        self.node_facts: Facts | None = None
        self.node_error: str | None = None
        self.device: dict[str, Any] = {}  # what this rank's device is
        self.tensors = "cpu"  # where the collectives' tensors live: the GPU under NCCL
        self.backend = options.backend
        self._node_thread: threading.Thread | None = None

    def step(self, name: str) -> None:
        self.step_name = name
        self.plane.set_step(name)
        if planted_hang(self.environ, self.me.rank) == name:
            threading.Event().wait()  # until the watchdog ends the process

    # node and device facts --------------------------------------------------------------

    def start_node_facts(self) -> None:
        if self.me.local_rank != 0:
            return

        def collect() -> None:
            from probes.collect import collect as collect_node

            try:
                self.node_facts = collect_node(
                    torch_timeout=min(self.options.torch_timeout, max(1.0, self.clock.left() / 2))
                )
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
        self.device = {
            "device": f"cuda:{index}",
            "device_name": props.name,
            "device_uuid": str(getattr(props, "uuid", "")) or None,
        }
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
            self.backend, store=dist.PrefixStore(self.plane.key("pg"), self.plane.store),
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
            result.measurements[f"time_s_{label}"] = self._timed(
                lambda buffer=buffer: dist.all_reduce(buffer), size, None
            )

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
        for rank in sorted(self.plane.roster):
            nodes.setdefault(node_key(self.plane.roster[rank]), []).append(rank)
        return nodes

    # results ----------------------------------------------------------------------------------

    def payload(self) -> dict:
        if self._node_thread is not None:
            self._node_thread.join(timeout=max(0.0, self.clock.left() - 2 * WRITE_RESERVE_S))
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


# rank 0's report writer: (facts, the deadline passed) -> the exit code every rank ends with
ReportWriter = Callable[[Facts, bool], int]


def run(options: Options, write_report: ReportWriter, *, environ: Mapping[str, str] | None = None) -> int:
    """This rank's part of the cluster diagnosis; returns the exit code, the same on every rank.

    Rank 0 hands the job's Facts to ``write_report`` and shares its return code through the store:
    under torchrun a node whose ranks exit 0 while another node's fail waits out the agents'
    exit barrier, so all ranks end alike. At the hard deadline the watchdog thread ends the
    process (rank 0 first reports what it has).
    """
    environ = dict(os.environ) if environ is None else environ
    me = identity(environ)
    rank = Rank(me, options, environ)
    layout = expected_nodes(me, environ)
    done = threading.Event()
    # rank 0 writes one report: the main thread's at the end, or the watchdog's at the deadline.
    # Whichever comes second waits for the first (the file is not written twice, and the process
    # does not end under a report being written), for at most _REPORT_GRACE_S.
    writer = threading.Lock()
    reported = threading.Event()
    main_code: list[int] = []

    def facts(store: Any) -> Facts:
        steps = rank.plane.steps_of_silent(store)
        return assemble(
            me,
            rank.plane.roster,
            dict(rank.plane.payloads),
            steps,
            layout,
            backend=rank.backend,
            microtests_run=options.microtests,
        )

    def watchdog() -> None:
        if done.wait(max(0.0, rank.clock.left())):
            return
        code = 1
        try:
            if me.rank == 0 and not writer.acquire(blocking=False):
                reported.wait(_REPORT_GRACE_S)  # the main thread is writing the full report
                code = main_code[0] if main_code else 1
            elif me.rank == 0:
                try:
                    store = rank.plane.fresh_client()
                except Exception:  # the store itself may be what hangs
                    store = None
                code = write_report(facts(store), True)
            else:
                sys.stderr.write(
                    f"diagnose cluster: rank {me.rank}: the deadline passed at '{rank.step_name}'; exiting\n"
                )
        finally:
            os._exit(code)

    threading.Thread(target=watchdog, name="diagnose-watchdog", daemon=True).start()
    try:
        rank.start_node_facts()
        rank.own_device()
        try:
            rank.plane.connect()
            rank.plane.announce()
            rank.step("join")
            rank.plane.join()
        except Exception as exc:  # the store is the one thing every rank needs
            where = f"{me.master_addr}:{me.master_port}"
            raise ClusterError(
                f"rank {me.rank} at '{rank.step_name}': store {where}: {str(exc).splitlines()[0][:300]}"
            ) from None
        if options.microtests and len(rank.plane.roster) == me.world_size:
            rank.run_tests()
        rank.step("done")
        rank.plane.post(rank.payload())
        if me.rank != 0:
            rank.step("waiting for rank 0's report")
            return rank.plane.await_verdict()
        rank.plane.gather()
        if not writer.acquire(blocking=False):  # the watchdog is reporting (the wait is below)
            return 1
        try:
            if planted_hang(environ, me.rank) == "write":  # test-only: a report slower than the deadline
                time.sleep(max(0.0, rank.clock.left()) + 1)
            code = write_report(facts(rank.plane.store), False)
            main_code.append(code)
        finally:
            reported.set()
        rank.plane.share_verdict(code)
        return code
    finally:
        done.set()
        if me.rank == 0 and not main_code and not writer.acquire(blocking=False):
            reported.wait(_REPORT_GRACE_S)  # the watchdog's report: never end the process under it
        _leave_group()


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # tearing down a broken group must not hide the report
            pass
