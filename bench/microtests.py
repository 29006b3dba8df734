"""Benchmark: the micro-tests against their floors, each measured in the same run.

    python bench/microtests.py [--rounds N] [--nproc N] [--backend gloo|nccl]
                               [--nccl-tests DIR] [--diagnosis-rounds N]

1. all_reduce bandwidth. Each round runs, in alternating order, the harness's all_reduce test
   (``run_microtests``, gloo on CPU, or NCCL with one rank per GPU) and a bare loop: N plain
   processes of this script that init a process group and time in-place ``all_reduce`` over the
   same sizes and iteration counts. Both are reduced the same way (time averaged over ranks,
   busbw = bytes / time * 2 (n-1) / n; with one rank busbw is 0 by definition, so algbw =
   bytes / time is compared instead). Prints, per size, the median of each and the median of the
   per-round ratios (each round's pair ran back to back, so a busy machine weighs on both
   alike); the target is a harness/bare ratio of at least 0.95. With ``--nccl-tests DIR`` (a
   build of NVIDIA's nccl-tests), each round also runs its ``all_reduce_perf`` over the same
   sizes on the same GPUs, in-place, one process driving them, and its column is added.
2. The whole live diagnosis against the bare torchrun floor. Each round runs, in alternating
   order, ``diagnose --json --nproc N`` (every probe and every micro-test, as a user runs it)
   and ``torchrun --nproc-per-node N`` of a script that imports torch, forms a gloo group, does
   one all_reduce and a barrier: the least any check of N real ranks can cost. Prints the
   medians, their ratio and the median of the per-round ratios; the target is a diagnosis at
   most 2x the floor by both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from probes.microtests import TEST_NAMES, run_microtests  # noqa: E402
from probes.microtests.checks import SIZES, iterations, size_label  # noqa: E402
from probes.microtests.judge import bandwidth  # noqa: E402
from probes.microtests.runner import free_port  # noqa: E402
from probes.proc import kill_tree  # noqa: E402

TARGET = 0.95
DIAGNOSIS_TARGET = 2.0
BARE_TIMEOUT_S = 120
# What one torchrun rank of the floor does: the least a check of real ranks can do.
FLOOR_SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
dist.barrier()
dist.destroy_process_group()
"""


def bare_rank(rank: int, world: int, port: int, backend: str) -> None:
    """One rank of the bare loop: what a user would write to time all_reduce by hand."""
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    times = {}
    for size in SIZES:
        buffer = torch.zeros(size // 4, device=device)
        warmup, timed = iterations(size)
        for _ in range(warmup):
            dist.all_reduce(buffer)
        if device != "cpu":
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(timed):
            dist.all_reduce(buffer)
        if device != "cpu":
            torch.cuda.synchronize()
        times[size] = (time.perf_counter() - start) / timed
    dist.destroy_process_group()
    print(json.dumps(times))


def measure(size: int, seconds: float, world: int) -> float:
    """The compared bandwidth: busbw, or algbw where one rank makes busbw 0."""
    algbw, busbw = bandwidth(size, seconds, world)
    return busbw if world > 1 else algbw


def bare(world: int, backend: str) -> dict[int, float]:
    """Bandwidth per size of the bare loop, time averaged over ranks as the harness does."""
    port = free_port()
    argv = [sys.executable, __file__, "--bare-rank"]
    procs = [
        subprocess.Popen([*argv, str(r), str(world), str(port), backend], stdout=subprocess.PIPE, text=True)
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
    return {s: measure(s, statistics.mean(r[s] for r in per_rank), world) for s in SIZES}


def harness(world: int, backend: str) -> dict[int, float]:
    test = run_microtests(["all_reduce"], nproc=world, backend=backend, timeout=120).all_reduce
    if test.status != "passed":
        raise SystemExit(f"bench/microtests.py: the all_reduce micro-test {test.status}: {test.error or test.reason}")
    return {s: measure(s, test.measurements[f"time_us_{size_label(s)}"] / 1e6, world) for s in SIZES}


def nccl_tests(world: int, build: Path) -> dict[int, float]:
    """nccl-tests' all_reduce_perf over the same sizes and iteration counts, in-place column."""
    found: dict[int, float] = {}
    for size in SIZES:
        warmup, timed = iterations(size)
        argv = [str(build / "all_reduce_perf"), "-b", str(size), "-e", str(size), "-g", str(world)]
        out = subprocess.run(
            [*argv, "-w", str(warmup), "-n", str(timed), "-c", "0"],
            capture_output=True, text=True, timeout=BARE_TIMEOUT_S, check=True,
        ).stdout  # fmt: skip
        # a data row: size count type redop root, out-of-place time algbw busbw #wrong, in-place the same
        for line in out.splitlines():
            fields = line.split()
            if len(fields) >= 13 and fields[0] == str(size):
                found[size] = measure(size, float(fields[9]) / 1e6, world)
    if len(found) != len(SIZES):
        raise SystemExit(f"bench/microtests.py: all_reduce_perf printed no row for {sorted(set(SIZES) - set(found))}")
    return found


def wall(argv: list[str], what: str, ok: tuple[int, ...]) -> tuple[float, str]:
    """Seconds ``argv`` took as a fresh process, and its stdout; exit codes other than ``ok``
    stop the bench."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode not in ok:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"bench/microtests.py: {what} exited {done.returncode}: {tail}")
    return elapsed, done.stdout


def microtest_summary(report_json: str) -> str:
    """Each micro-test's status and duration from a JSON report; a failed one voids the timing."""
    tests = json.loads(report_json)["facts"]["microtests"]
    parts = []
    for name in TEST_NAMES:
        test = tests.get(name) or {}
        if test.get("status") not in ("passed", "skipped"):
            raise SystemExit(
                f"bench/microtests.py: diagnose --json: micro-test {name} {test.get('status')}: {test.get('error')}"
            )
        parts.append(f"{name} {test['status']}" + (f" {test['duration_s']:.1f} s" if test.get("duration_s") else ""))
    return ", ".join(parts)


def diagnosis_vs_floor(nproc: int, rounds: int, console: Console) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as work:
        script = Path(work) / "floor.py"
        script.write_text(FLOOR_SCRIPT)
        commands = {
            "torchrun floor": lambda: [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(nproc),
                "--master-port",
                str(free_port()),
                str(script),
            ],  # fmt: skip
            "diagnose --json": lambda: [
                sys.executable,
                "-m",
                "diagnose",
                "--json",
                "--nproc",
                str(nproc),
            ],  # fmt: skip
        }
        samples: dict[str, list[float]] = {name: [] for name in commands}
        last = ""
        for round_ in range(rounds):
            order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
            for name in order:
                # diagnose exits 1 when it has an error finding: a result, not a failure
                seconds, out = wall(commands[name](), name, (0, 1) if name == "diagnose --json" else (0,))
                samples[name].append(seconds)
                if name == "diagnose --json":
                    last = microtest_summary(out)
    table = Table(title=f"live diagnosis vs the bare torchrun floor, {nproc} ranks, {rounds} rounds")
    for column in ("what", "median s", "min s", "max s"):
        table.add_column(column, justify="right" if column != "what" else "left")
    for name, values in samples.items():
        table.add_row(name, *(f"{f(values):.2f}" for f in (statistics.median, min, max)))
    console.print(table)
    ratio = statistics.median(samples["diagnose --json"]) / statistics.median(samples["torchrun floor"])
    paired = statistics.median(
        d / f for d, f in zip(samples["diagnose --json"], samples["torchrun floor"], strict=True)
    )
    verdict = "meets" if max(ratio, paired) <= DIAGNOSIS_TARGET else "misses"
    console.print(
        f"diagnose --json / torchrun floor: {ratio:.2f}x of the medians, {paired:.2f}x median"
        f" paired ratio ({verdict} the target of at most {DIAGNOSIS_TARGET:g}x)"
    )
    console.print(f"last diagnosis's micro-tests: {last}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="all_reduce rounds; 0: skip")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--nccl-tests", type=Path, metavar="DIR", help="a build folder holding all_reduce_perf")
    parser.add_argument("--diagnosis-rounds", type=int, default=5, help="0: skip")
    parser.add_argument("--bare-rank", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_rank:
        rank, world, port, backend = args.bare_rank
        bare_rank(int(rank), int(world), int(port), backend)
        return
    console = Console()
    if args.rounds:
        bandwidth_vs_bare(args.nproc, args.rounds, console, args.backend, args.nccl_tests)
    if args.diagnosis_rounds:
        diagnosis_vs_floor(args.nproc, args.diagnosis_rounds, console)


def bandwidth_vs_bare(nproc: int, rounds: int, console: Console, backend: str, build: Path | None) -> None:
    measures = {"harness": lambda: harness(nproc, backend), "bare": lambda: bare(nproc, backend)}
    if build:
        measures["nccl-tests"] = lambda: nccl_tests(nproc, build)
    runs: dict[str, list[dict[int, float]]] = {name: [] for name in measures}
    for round_ in range(rounds):
        order = list(measures) if round_ % 2 == 0 else list(reversed(measures))
        for which in order:
            runs[which].append(measures[which]())

    def median(which: str, size: int) -> float:
        return statistics.median(r[size] for r in runs[which])

    def paired(size: int, floor: str = "bare") -> list[float]:
        """harness / floor within each round: the two ran back to back, under the same load."""
        return [h[size] / b[size] for h, b in zip(runs["harness"], runs[floor], strict=True)]

    metric = "busbw" if nproc > 1 else "algbw (one rank: busbw is 0)"
    ranks = f"{nproc} GPU rank(s)" if backend == "nccl" else f"{nproc} CPU ranks"
    table = Table(title=f"all_reduce {metric}, GB/s, {backend}, {ranks}, median of {rounds}")
    columns = ["size", "harness", "bare loop", "harness / bare (paired)"]
    if build:
        columns += ["nccl-tests", "harness / nccl-tests (paired)"]
    for column in columns:
        table.add_column(column, justify="right")
    for size in SIZES:
        row = [
            size_label(size),
            f"{median('harness', size):.4f}",
            f"{median('bare', size):.4f}",
            f"{statistics.median(paired(size)):.3f}",
        ]
        if build:
            row += [f"{median('nccl-tests', size):.4f}", f"{statistics.median(paired(size, 'nccl-tests')):.3f}"]
        table.add_row(*row)
    peak = max(median("harness", s) for s in SIZES) / max(median("bare", s) for s in SIZES)
    overall = statistics.median(r for s in SIZES for r in paired(s))
    large = statistics.median(r for s in SIZES if s >= 1 << 20 for r in paired(s))
    console.print(table)
    console.print(
        f"harness / bare: peak busbw {peak:.3f}, median paired ratio {overall:.3f} (all sizes),"
        f" {large:.3f} (1MB and up); target >= {TARGET}"
    )
    if build:
        versus = statistics.median(r for s in SIZES if s >= 1 << 20 for r in paired(s, "nccl-tests"))
        console.print(f"harness / nccl-tests all_reduce_perf: median paired ratio {versus:.3f} (1MB and up)")


if __name__ == "__main__":
    main()
