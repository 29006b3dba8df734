"""Benchmark: the live probes against ``python -m torch.utils.collect_env``, in one run.

    python bench/probes.py [--rounds N] [--torch-timeout S]

Each round runs, in turn, ``python -m torch.utils.collect_env``, ``python -m diagnose facts``
and a bare ``python -c "import torch"`` (the floor both share), each as a fresh process, and
``collect()`` in this process with its parts timed: the in-process probes (the tool's own
time) and the torch child. Prints medians and the ratio diagnose facts / collect_env.
Target: at most 0.5.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from probes import runner  # noqa: E402
from probes.collect import collect  # noqa: E402

TARGET = 0.5
COMMANDS = {
    "collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    "diagnose facts": [sys.executable, "-m", "diagnose", "facts"],
    "import torch": [sys.executable, "-c", "import torch"],
}


def wall(argv: Sequence[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=300)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise SystemExit(f"bench/probes.py: {' '.join(argv[1:])} failed: {tail}")
    return elapsed


def in_process(torch_timeout: float) -> dict[str, float]:
    """collect() here, split into the torch child and the probes that run beside it."""
    child: list[float] = []
    started: dict[str, float] = {}
    own = 0.0

    def timed_run(argv: Sequence[str], timeout: float) -> runner.Result:
        result = runner.run(argv, timeout)
        child.append(result.duration_s)
        return result

    def progress(step: str, state: str, detail: str | None) -> None:
        nonlocal own
        now = time.perf_counter()
        if state == "running":
            started[step] = now
        elif step != "torch":
            own += now - started[step]

    start = time.perf_counter()
    collect(torch_timeout=torch_timeout, progress=progress, run=timed_run)
    return {"collect() in process": time.perf_counter() - start, "  torch child": child[0], "  own probes": own}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)

    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):  # interleaved, so a noisy moment hits every row alike
        for name, command in COMMANDS.items():
            samples.setdefault(name, []).append(wall(command))
        for name, seconds in in_process(args.torch_timeout).items():
            samples.setdefault(name, []).append(seconds)

    table = Table(
        title=f"live facts vs torch collect_env: {args.rounds} rounds, {sys.platform}, Python {sys.version.split()[0]}"
    )
    table.add_column("what")
    table.add_column("median s", justify="right")
    table.add_column("min s", justify="right")
    table.add_column("max s", justify="right")
    for name, values in samples.items():
        table.add_row(name, f"{statistics.median(values):.3f}", f"{min(values):.3f}", f"{max(values):.3f}")
    console = Console()
    console.print(table)
    ratio = statistics.median(samples["diagnose facts"]) / statistics.median(samples["collect_env"])
    verdict = "meets" if ratio <= TARGET else "misses"
    console.print(f"ratio diagnose facts / collect_env: {ratio:.2f} ({verdict} the target of {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
