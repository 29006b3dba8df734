"""The bodies of the collective micro-tests, as each rank runs them (torch imported inside).

Each writes its steps to the rank's channel before entering them, so a rank that hangs is
known by the last step it entered. A wrong result is recorded and the rank carries on: the
ranks must issue the same collectives in the same order, or the check itself would hang.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

from probes.microtests.channel import Channel

# The all_reduce sweep: 1 KiB to 64 MiB by factors of 4, float32, like nccl-tests' -b/-e/-f.
SIZES = tuple(1024 * 4**k for k in range(9))
# Time left for a rank to report its own error before the watchdog's deadline.
_REPORT_MARGIN_S = 1.5


def size_label(size: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def iterations(size: int) -> tuple[int, int]:
    """(warm-up, timed) iterations for one size: fewer for large ones, to keep CPU runs short."""
    timed = max(3, min(20, (64 << 20) // size))
    return 2, timed


@dataclass
class Context:
    test: str
    rank: int | None
    world_size: int
    device: str
    backend: str
    port: int
    deadline: float
    out: str
    channel: Channel
    fault: str | None = None
    strategy: str = "ddp"
    mode: str = "distinct"

    def remaining(self) -> timedelta:
        """Timeout for a blocking call: what is left before the deadline, less time to report."""
        return timedelta(seconds=max(1.0, self.deadline - time.time() - _REPORT_MARGIN_S))

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _init(ctx: Context) -> float:
    """Bring the default process group up the way a job does; return the seconds it took."""
    ctx.channel.step("import torch")
    import torch
    import torch.distributed as dist

    if ctx.cuda:
        torch.cuda.set_device(torch.device(ctx.device))
    ctx.channel.step("init_process_group")
    start = time.perf_counter()
    dist.init_process_group(
        ctx.backend,
        init_method=f"tcp://127.0.0.1:{ctx.port}",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=ctx.remaining(),
    )
    took = time.perf_counter() - start
    ctx.channel.step("process group up")
    if ctx.fault == "kill":
        from probes.proc import die_now

        die_now()
    return took


def _sync(ctx: Context) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()


def _barrier(ctx: Context) -> None:
    import torch.distributed as dist

    if ctx.backend == "nccl":
        dist.barrier(device_ids=[torch_device_index(ctx)])
    else:
        dist.barrier()


def torch_device_index(ctx: Context) -> int:
    return int(ctx.device.split(":")[1])


def _finish() -> None:
    import torch.distributed as dist

    dist.destroy_process_group()


def _first_collective(ctx: Context) -> float:
    import torch
    import torch.distributed as dist

    ctx.channel.step("first all_reduce")
    start = time.perf_counter()
    ones = torch.ones(1, device=ctx.device)
    dist.all_reduce(ones)
    got = ones.item()
    took = time.perf_counter() - start
    if got != ctx.world_size:
        ctx.channel.check_failed(f"rank {ctx.rank}: sum of ones over {ctx.world_size} ranks gave {got}")
    return took


def rendezvous(ctx: Context) -> None:
    init_s = _init(ctx)
    first_s = _first_collective(ctx)
    ctx.channel.measure(init_s=round(init_s, 4), first_collective_s=round(first_s, 4))
    ctx.channel.step("destroy_process_group")
    _finish()


def barrier(ctx: Context) -> None:
    import torch.distributed as dist

    _init(ctx)
    # monitored_barrier names the ranks that never arrive, but only gloo implements it:
    # under NCCL it runs on a gloo side group, then the NCCL barrier proper follows.
    side = dist.new_group(backend="gloo") if ctx.backend != "gloo" else None
    if ctx.fault == "skip_barrier":
        time.sleep(ctx.deadline - time.time() + 60)
    ctx.channel.step("barrier")
    start = time.perf_counter()
    dist.monitored_barrier(group=side, timeout=ctx.remaining(), wait_all_ranks=True)
    if ctx.backend == "nccl":
        ctx.channel.step("nccl barrier")
        _barrier(ctx)
        _sync(ctx)
    ctx.channel.measure(barrier_s=round(time.perf_counter() - start, 4))
    ctx.channel.step("destroy_process_group")
    _finish()


def all_reduce(ctx: Context) -> None:
    """Exact sums on every rank, then time per size: nccl-tests' in-place all_reduce, float32."""
    import torch
    import torch.distributed as dist

    _init(ctx)
    world = ctx.world_size
    contribution = ctx.rank + 1 + (1 if ctx.fault == "wrong_sum" else 0)
    for size in SIZES:
        label = size_label(size)
        ctx.channel.step(f"all_reduce {label}")
        count = size // 4
        # Small integers (element i holds i % 7): every partial sum is exact in float32, so
        # equality is the test. Built by repeating, not by a modulo over the whole buffer,
        # which at 64 MB costs more than the all_reduce it checks.
        pattern = torch.arange(7, dtype=torch.float32).repeat(-(-count // 7))[:count]
        buffer = (pattern + contribution).to(ctx.device)
        expected = pattern.mul_(world).add_(world * (world + 1) // 2).to(ctx.device)
        # The checked all_reduce is the first warm-up, so the harness reduces exactly as
        # often as a bare timing loop would.
        dist.all_reduce(buffer)
        if not torch.equal(buffer, expected):
            at = int((buffer != expected).nonzero()[0, 0])
            ctx.channel.check_failed(
                f"{label}: rank {ctx.rank} got {buffer[at].item()} at element {at}, expected {expected[at].item()}"
            )
        del expected, pattern
        # Zeros stay zeros: the timed loop reduces in place without overflowing.
        buffer.zero_()
        warmup, timed = iterations(size)
        for _ in range(warmup - 1):
            dist.all_reduce(buffer)
        _sync(ctx)
        _barrier(ctx)
        start = time.perf_counter()
        for _ in range(timed):
            dist.all_reduce(buffer)
        _sync(ctx)
        ctx.channel.measure(**{f"time_s_{label}": (time.perf_counter() - start) / timed})
        del buffer
    ctx.channel.step("destroy_process_group")
    _finish()


def placement(ctx: Context) -> None:
    """Each rank uses only its own device; rank 0 asks NVML who holds memory where."""
    import torch
    import torch.distributed as dist

    _init(ctx)
    ctx.channel.step("allocate")
    held = torch.ones(16 << 20, device=ctx.device)  # 64 MiB: plainly visible to NVML
    dist.all_reduce(held[:1])
    _sync(ctx)
    pids: list = [None] * ctx.world_size
    dist.all_gather_object(pids, (os.getpid(), torch_device_index(ctx)))
    ctx.channel.step("nvml")
    if ctx.rank == 0:
        ctx.channel.measure(**_placement_measurements(pids))
    _barrier(ctx)  # every rank holds its memory until rank 0 has looked
    del held
    ctx.channel.step("destroy_process_group")
    _finish()


def _placement_measurements(ranks: list[tuple[int, int]]) -> dict:
    import torch

    try:
        holders = _nvml_holders(torch.cuda.device_count())
    except Exception as exc:
        return {"nvml_error": f"{type(exc).__name__}: {exc}"}
    return placement_summary(ranks, holders)


def placement_summary(ranks: list[tuple[int, int]], holders: dict[int, set[int]]) -> dict:
    """From (pid, own device) per rank and the pids NVML sees per device: who is where."""
    rank_of = {pid: rank for rank, (pid, _) in enumerate(ranks)}
    if not any(pid in rank_of for pids in holders.values() for pid in pids):
        # NVML reports host pids; in a container with its own pid namespace none match.
        return {"nvml_pids_matched": False}

    def foreign_on(device: int) -> set[int]:
        return {rank_of[p] for p in holders[device] if p in rank_of and ranks[rank_of[p]][1] != device}

    foreign = sorted(set().union(*(foreign_on(device) for device in holders)))
    on_gpu0 = sorted(foreign_on(0)) if 0 in holders else []
    return {
        "nvml_pids_matched": True,
        "foreign_ranks_on_gpu0": len(on_gpu0),
        "gpu0_foreign_ranks": ",".join(map(str, on_gpu0)),
        "ranks_on_foreign_device": len(foreign),
        "foreign_device_ranks": ",".join(map(str, foreign)),
    }


def _nvml_holders(count: int) -> dict[int, set[int]]:
    """Visible CUDA device index -> pids holding memory on it, matched through the GPU UUID."""
    import pynvml
    import torch

    pynvml.nvmlInit()
    try:
        holders = {}
        for index in range(count):
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            holders[index] = {p.pid for p in procs}
        return holders
    finally:
        pynvml.nvmlShutdown()


def duplicate_gpu(ctx: Context) -> None:
    """Report the device this rank got; in shared mode, what NCCL says when two ranks share one."""
    import torch

    index = torch_device_index(ctx)
    ctx.channel.measure(device_index=index, device_uuid=str(torch.cuda.get_device_properties(index).uuid))
    _init(ctx)
    if ctx.mode != "shared":
        _first_collective(ctx)
        ctx.channel.step("destroy_process_group")
        _finish()
        return
    try:
        _first_collective(ctx)
    except Exception as exc:  # the observation this mode exists for, not a failure
        ctx.channel.measure(nccl_error=f"{type(exc).__name__}: {exc}"[:2000])
        ctx.channel.done()
        os._exit(0)  # tearing down the group NCCL refused can hang
    ctx.channel.measure(nccl_error=None)
    ctx.channel.step("destroy_process_group")
    _finish()
