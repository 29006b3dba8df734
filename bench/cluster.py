"""What a whole-job diagnosis costs: `diagnose cluster` on 2 nodes x 2 ranks against the
single-node `diagnose` in the same run, on this machine (two torchrun "nodes" on loopback, gloo).

Both are timed from launch to the report on disk/stdout and to the last process gone, with the
same all_reduce sweep (1 KB to --max-size). The single-node diagnosis runs the micro-tests
that have a cluster counterpart (rendezvous, barrier, all_reduce) on 2 ranks, then once more
with its default set (which adds lightning_fit).

    python bench/cluster.py                  # 3 repeats, sweep to 64MB
    python bench/cluster.py --repeat 1 --max-size 4MB
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS and not k.startswith(("SLURM", "TORCHELASTIC_"))
    }
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(max_size: str, nodes: int = 2, per_node: int = 2) -> tuple[float, dict]:
    """Seconds from launching every node's torchrun to the last one exiting; and the report."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        start = time.monotonic()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    str(nodes),
                    "--node-rank",
                    str(n),
                    "--nproc-per-node",
                    str(per_node),
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                    "-m",
                    "diagnose",
                    "cluster",
                    "--json",
                    "--out",
                    str(out),
                    "--max-size",
                    max_size,
                ],
                cwd=ROOT,
                env=_env(DIAGNOSE_NODE_NAME=f"node{n}"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for n in range(nodes)
        ]
        for proc in procs:
            proc.wait(timeout=600)
        wall = time.monotonic() - start
        return wall, json.loads(out.read_text())


def single(tests: str | None) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "diagnose", "--json", "--nproc", "2"] + (["--microtests", tests] if tests else [])
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    return time.monotonic() - start, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--max-size",
        default="64MB",
        help="largest all_reduce of the cluster sweep (default 64MB, as the single-node sweep)",
    )
    args = parser.parse_args()

    rows: dict[str, list[float]] = {
        "cluster 2 nodes x 2 ranks": [],
        "single node, same tests": [],
        "single node, default tests": [],
    }
    busbw: dict[str, list[float]] = {"cluster 2 nodes x 2 ranks": [], "single node, same tests": []}
    for _ in range(args.repeat):
        wall, report = cluster(args.max_size)
        rows["cluster 2 nodes x 2 ranks"].append(wall)
        busbw["cluster 2 nodes x 2 ranks"].append(
            report["facts"]["microtests"]["all_reduce"]["measurements"].get("busbw_gbps_max", 0.0)
        )
        wall, report = single("rendezvous,barrier,all_reduce")
        rows["single node, same tests"].append(wall)
        busbw["single node, same tests"].append(
            report["facts"]["microtests"]["all_reduce"]["measurements"].get("busbw_gbps_max", 0.0)
        )
        rows["single node, default tests"].append(single(None)[0])

    print(
        f"{os.cpu_count()} CPU cores, gloo over loopback, {args.repeat} repeat(s), all_reduce sweep to {args.max_size}"
    )
    print(f"{'diagnosis':<30} {'median s':>9} {'min s':>7} {'max s':>7} {'busbw max GB/s':>15}")
    for name, walls in rows.items():
        bw = f"{statistics.median(busbw[name]):.3f}" if name in busbw else "-"
        print(f"{name:<30} {statistics.median(walls):>9.2f} {min(walls):>7.2f} {max(walls):>7.2f} {bw:>15}")
    ratio = statistics.median(rows["cluster 2 nodes x 2 ranks"]) / statistics.median(rows["single node, same tests"])
    print(f"cluster / single node (same tests): {ratio:.2f}x")


if __name__ == "__main__":
    main()
