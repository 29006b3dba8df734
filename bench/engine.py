"""Benchmark: the whole KB against 10,000 varied snapshots, and how the cost grows with rules.

    python bench/engine.py [--snapshots N]

Prints time per snapshot and per rule for the shipped KB, then for the KB repeated 2x and 4x
(renamed copies) to show linear growth, for all snapshots and split into those with facts only
(a live run) and those with a log. Target: well under 1 ms per snapshot for the whole KB.
The engine evaluates a check that several rules share (one fact test, one log pattern) once
per snapshot, so renamed copies cost less than new rules would: the per-rule figure at 2x and
4x is what a KB that repeats its checks costs, a floor for one that does not.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from diagnose.engine import evaluate  # noqa: E402
from diagnose.kb import KB, load_kb  # noqa: E402
from diagnose.paths import lookup  # noqa: E402
from probes.facts import (  # noqa: E402
    Facts,
    Gpu,
    GpuProcess,
    Gpus,
    Hang,
    Log,
    LogLine,
    MicroTest,
    MicroTests,
    RankStack,
)

GPU_MODELS = [
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA GeForce RTX 3090",
    "NVIDIA GeForce RTX 4090",
    "Tesla V100-SXM2-16GB",
]
PACKAGES = {
    "torch": ["1.13.1", "2.1.2", "2.4.0", "2.6.0"],
    "lightning": ["2.0.9", "2.4.0", "2.5.1"],
    "deepspeed": ["0.9.5", "0.14.2"],
    "accelerate": ["0.21.0", "1.2.0"],
    "bitsandbytes": ["0.41.1"],
}
LOG_POOL = [
    "Epoch 0: 100%|██████████| 500/500 [01:10<00:00, loss=0.41]",
    "NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1727, unhandled system error",
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!",
    "[rank1]:[E ProcessGroupNCCL.cpp:563] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)",
    "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
]


def random_facts(rng: random.Random) -> Facts:
    count = rng.choice([0, 1, 2, 4, 8])
    devices = [
        Gpu(
            index=i,
            name=rng.choice(GPU_MODELS[:2]) if rng.random() < 0.8 else rng.choice(GPU_MODELS),
            processes=[GpuProcess(pid=100 + i)] * rng.choice([1, 1, 2]),
        )
        for i in range(count)
    ]
    facts = Facts(
        gpus=Gpus(
            count=count,
            devices=devices or None,
            visible=[str(rng.choice(range(max(count, 1)))) for _ in range(count)] or None,
        )
    )
    facts.packages.complete = True
    for name, versions in PACKAGES.items():
        if rng.random() < 0.7:
            facts.packages.values[name] = rng.choice(versions)
    facts.env.complete = True
    if rng.random() < 0.3:
        facts.env.values["NCCL_P2P_DISABLE"] = "1"
    facts.host.shm_total_bytes = rng.choice([64 * 2**20, 16 * 2**30])
    if rng.random() < 0.5:
        facts.log = Log(
            lines=[LogLine(no=i + 1, text=rng.choice(LOG_POOL)) for i in range(rng.randint(1, 40))], signatures=[]
        )
    if rng.random() < 0.5:
        facts.microtests = MicroTests(
            barrier=MicroTest(status=rng.choice(["passed", "timed_out"])),
            all_reduce=MicroTest(status="passed", measurements={"busbw_gbps_max": rng.uniform(1, 200)}),
        )
    if rng.random() < 0.2:
        facts.hang = Hang(
            detected=True,
            ranks=[RankStack(rank=r, waiting_in=rng.choice(["barrier", "all_reduce", "load"])) for r in range(2)],
        )
    return facts


def replicate(kb: KB, times: int) -> KB:
    rules = [r.model_copy(update={"id": f"{r.id}-{i}" if i else r.id}) for i in range(times) for r in kb.rules]
    return KB(rules=rules, sources=kb.sources)


def measure(kb: KB, snapshots: list[Facts]) -> float:
    evaluate(snapshots[0], kb)  # warm caches (compiled regexes, descriptions)
    start = time.perf_counter()
    for facts in snapshots:
        evaluate(facts, kb)
    return (time.perf_counter() - start) / len(snapshots)


def fact_paths(kb: KB) -> list[str]:
    """Every fact path the rules read (conditions, evidence, inside ``any``)."""

    def walk(checks) -> Iterator[str]:
        for check in checks:
            if getattr(check, "fact", None):
                yield check.fact
            yield from walk(getattr(check, "any", None) or ())

    return sorted({path for rule in kb.rules for path in walk([*rule.when, *rule.evidence])})


def facts_floor(kb: KB, snapshots: list[Facts]) -> float:
    """Seconds per snapshot to read every fact value the rules use (computed by the Facts
    model: the part of an evaluation that is not the engine's own), each path once."""
    paths = fact_paths(kb)
    start = time.perf_counter()
    for facts in snapshots:
        for path in paths:
            lookup(facts, path)
    return (time.perf_counter() - start) / len(snapshots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(1234)
    snapshots = [random_facts(rng) for _ in range(args.snapshots)]
    groups = {
        "all": snapshots,
        "facts only": [s for s in snapshots if s.log.lines is None],
        "with a log": [s for s in snapshots if s.log.lines is not None],
    }
    kb = load_kb()
    table = Table(title=f"engine: {args.snapshots} varied snapshots (half with a 1-40 line log)")
    for column in ("KB", "rules", "snapshots", "per snapshot", "per rule", "vs x1"):
        table.add_column(column, justify="right")
    for name, group in groups.items():
        base = None
        for times in (1, 2, 4):
            big = replicate(kb, times)
            per_snapshot = measure(big, group)
            base = base or per_snapshot
            table.add_row(
                f"shipped x{times}",
                str(len(big.rules)),
                name,
                f"{per_snapshot * 1e3:.3f} ms",
                f"{per_snapshot / len(big.rules) * 1e6:.1f} µs",
                f"{per_snapshot / base:.2f}",
            )
        table.add_section()
    Console().print(table)
    for name, group in groups.items():
        print(
            f"{name}: reading every fact value the rules use takes {facts_floor(kb, group) * 1e3:.3f} ms per snapshot "
            f"(computed by the Facts model; the engine asks only those its rules reach)"
        )
    print("copies share their checks' results with the originals (see the module docstring)")


if __name__ == "__main__":
    main()
