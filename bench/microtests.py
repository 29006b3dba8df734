"""Benchmark: the all_reduce micro-test against a bare torch.distributed loop, in one run.

    python bench/microtests.py [--rounds N] [--nproc N] [--suite-rounds N]

Each round runs, in alternating order, the harness's all_reduce test (``run_microtests``, gloo
on CPU) and a bare loop: N plain processes of this script that init a process group and time
in-place ``all_reduce`` over the same sizes and iteration counts. Both are reduced the same way
(time averaged over ranks, busbw = bytes / time * 2 (n-1) / n). Prints, per size, the median
busbw of each and the median of the per-round ratios (each round's pair ran back to back, so a
busy machine weighs on both alike); the target is a harness/bare ratio of at least 0.95. Then
times the full default suite (every test) on N CPU ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from probes.microtests import TEST_NAMES, run_microtests  # noqa: E402
from probes.microtests.checks import SIZES, iterations, size_label  # noqa: E402
from probes.microtests.runner import bandwidth, free_port  # noqa: E402
from probes.microtests.watchdog import kill_tree  # noqa: E402

TARGET = 0.95
BARE_TIMEOUT_S = 120


def bare_rank(rank: int, world: int, port: int) -> None:
    """One rank of the bare loop: what a user would write to time all_reduce by hand."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    times = {}
    for size in SIZES:
        buffer = torch.zeros(size // 4)
        warmup, timed = iterations(size)
        for _ in range(warmup):
            dist.all_reduce(buffer)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(timed):
            dist.all_reduce(buffer)
        times[size] = (time.perf_counter() - start) / timed
    dist.destroy_process_group()
    print(json.dumps(times))


def bare(world: int) -> dict[int, float]:
    """busbw per size of the bare loop, time averaged over ranks as the harness does."""
    port = free_port()
    argv = [sys.executable, __file__, "--bare-rank"]
    procs = [
        subprocess.Popen([*argv, str(r), str(world), str(port)], stdout=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=BARE_TIMEOUT_S)[0] for p in procs]
    finally:
        import psutil

        kill_tree([psutil.Process(p.pid) for p in procs if p.poll() is None], [])
    if any(p.returncode for p in procs):
        raise SystemExit("bench/microtests.py: the bare all_reduce loop failed")
    per_rank = [{int(k): v for k, v in json.loads(out).items()} for out in outputs]
    return {s: bandwidth(s, statistics.mean(r[s] for r in per_rank), world)[1] for s in SIZES}


def harness(world: int) -> dict[int, float]:
    test = run_microtests(["all_reduce"], nproc=world, backend="gloo", timeout=120).all_reduce
    if test.status != "passed":
        raise SystemExit(
            f"bench/microtests.py: the all_reduce micro-test {test.status}: {test.error}"
        )
    return {s: test.measurements[f"busbw_gbps_{size_label(s)}"] for s in SIZES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--suite-rounds", type=int, default=3, help="0: do not time the suite")
    parser.add_argument("--bare-rank", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_rank:
        bare_rank(*args.bare_rank)
        return

    runs: dict[str, list[dict[int, float]]] = {"harness": [], "bare": []}
    for round_ in range(args.rounds):
        order = ("harness", "bare") if round_ % 2 == 0 else ("bare", "harness")
        for which in order:
            runs[which].append((harness if which == "harness" else bare)(args.nproc))

    def median(which: str, size: int) -> float:
        return statistics.median(r[size] for r in runs[which])

    def paired(size: int) -> list[float]:
        """harness / bare within each round: the two ran back to back, under the same load."""
        return [h[size] / b[size] for h, b in zip(runs["harness"], runs["bare"], strict=True)]

    table = Table(
        title=f"all_reduce busbw (GB/s), gloo, {args.nproc} CPU ranks, median of {args.rounds}"
    )
    for column in ("size", "harness", "bare loop", "harness / bare (paired)"):
        table.add_column(column, justify="right")
    for size in SIZES:
        table.add_row(
            size_label(size),
            f"{median('harness', size):.4f}",
            f"{median('bare', size):.4f}",
            f"{statistics.median(paired(size)):.3f}",
        )
    peak = max(median("harness", s) for s in SIZES) / max(median("bare", s) for s in SIZES)
    overall = statistics.median(r for s in SIZES for r in paired(s))
    large = statistics.median(r for s in SIZES if s >= 1 << 20 for r in paired(s))
    console = Console()
    console.print(table)
    console.print(
        f"harness / bare: peak busbw {peak:.3f}, median paired ratio {overall:.3f} (all sizes),"
        f" {large:.3f} (1MB and up); target >= {TARGET}"
    )

    if args.suite_rounds:
        walls = []
        for _ in range(args.suite_rounds):
            start = time.perf_counter()
            result = run_microtests(nproc=args.nproc, backend="gloo")
            walls.append(time.perf_counter() - start)
        per_test = ", ".join(
            f"{name} {test.status} {test.duration_s or 0:.1f} s"
            for name in TEST_NAMES
            if (test := getattr(result, name)) is not None
        )
        console.print(
            f"full suite on {args.nproc} CPU ranks: median {statistics.median(walls):.1f} s"
            f" (min {min(walls):.1f}, max {max(walls):.1f}); last run: {per_test}"
        )


if __name__ == "__main__":
    main()
