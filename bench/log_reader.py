"""Benchmark: probes.log.read_log over a generated multi-GB-class log.

    python bench/log_reader.py [--size-mb 1024] [--keep]

Writes a training log of about SIZE MB to a temporary file (progress bars, rank-prefixed
warnings, NCCL INFO chatter, a traceback and a watchdog timeout every few hundred thousand
lines, a torchrun failure summary at the end), reads it in a child process and prints the
throughput (MB/s), the child's peak resident memory, and what the reader kept. The file is
deleted afterwards unless --keep. Constant memory means the peak stays flat as SIZE grows:
compare --size-mb 256 with 1024.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROUTINE = [
    "[default{r}]:Epoch {e}:  {p}%|{bar}| {s}/20000 [12:{mm}<1:02:11,  5.31it/s, loss={loss:.4f}, v_num=3]",
    "[default{r}]:{{'loss': {loss:.4f}, 'grad_norm': 1.41, 'learning_rate': 2.04e-06, 'epoch': 0.{e}}}",
    "node{r}:{pid}:{pid} [{r}] NCCL INFO Channel 0{c}/02 :    0   1   2   3",
    "node{r}:{pid}:{pid} [{r}] NCCL INFO Connected all rings",
    "[default{r}]:saving checkpoint to /ckpt/epoch={e}-step={s}.ckpt",
    "[default{r}]:  warnings.warn(  # the dataloader has few workers; consider raising num_workers",
]
INCIDENT = [
    "[rank{r}]:[W{mm}12 ProcessGroupNCCL.cpp:1168] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now",
    "[rank{r}]:Traceback (most recent call last):",
    '[rank{r}]:  File "/work/train.py", line 88, in <module>',
    "[rank{r}]:    trainer.fit(model)",
    "[rank{r}]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU {r} has a total capacity of 79.15 GiB of which 3.06 MiB is free.",
    "[rank{r}]:[E{mm}12 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.",
]
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_17:00:00
  host      : node3
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""


def write_log(path: Path, size_mb: int, seed: int = 0) -> int:
    """Write about size_mb MB of log lines; returns the number of lines."""
    rng = random.Random(seed)
    target = size_mb * 1024 * 1024
    written = lines = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            block = []
            for _ in range(20_000):
                lines += 1
                r, s = rng.randrange(8), lines % 20000
                incident = lines % 250_000
                template = INCIDENT[incident] if incident < len(INCIDENT) else rng.choice(ROUTINE)
                block.append(template.format(r=r, e=lines // 1_000_000, p=s * 100 // 20000, bar="#" * (s % 10),
                                             s=s, mm=10 + s % 50, loss=rng.random(), pid=1000 + r, c=s % 2))
            text = "\n".join(block) + "\n"
            f.write(text)
            written += len(text.encode("utf-8"))
        f.write(SUMMARY)
        lines += SUMMARY.count("\n")
    return lines


def read_child(path: str) -> None:
    """Run in the child: read the log and print what was found as JSON."""
    from probes.log import read_log

    start = time.perf_counter()
    log = read_log(path, Path(path).name)
    seconds = time.perf_counter() - start
    print(json.dumps({
        "seconds": seconds,
        "lines_read": log.lines_read,
        "lines_kept": len(log.lines or []),
        "signatures": len(log.signatures or []),
        "signature_ids": log.signature_ids,
        "failing_ranks": log.failing_ranks,
    }))


def peak_rss_mib_of(argv: list[str]) -> tuple[float, str]:
    """Run argv as a child; its peak RSS in MiB (ru_maxrss of the child) and its stdout."""
    code = (
        "import resource, subprocess, sys\n"
        f"p = subprocess.run({argv!r}, capture_output=True, text=True, timeout=3600)\n"
        "sys.stderr.write(p.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(p.stdout, end='')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3700, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    first, _, rest = out.stdout.partition("\n")
    return int(first) / 1024, rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    parser.add_argument("--read", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)
    if args.read:
        read_child(args.read)
        return 0
    fd, name = tempfile.mkstemp(prefix="diagnose-bench-", suffix=".log", dir="/tmp")
    os.close(fd)
    path = Path(name)
    try:
        start = time.perf_counter()
        lines = write_log(path, args.size_mb)
        size = path.stat().st_size
        print(f"wrote {size / 2**20:,.0f} MiB, {lines:,} lines in {time.perf_counter() - start:.1f}s: {path}")
        baseline, _ = peak_rss_mib_of([sys.executable, "-c", "import probes.log"])
        peak, out = peak_rss_mib_of([sys.executable, str(Path(__file__).resolve()), "--read", str(path)])
        result = json.loads(out)
        print(f"read {result['lines_read']:,} lines in {result['seconds']:.1f}s: "
              f"{size / 2**20 / result['seconds']:,.0f} MiB/s")
        print(f"peak memory: {peak:,.0f} MiB (a process that only imports probes.log: {baseline:,.0f} MiB)")
        print(f"kept {result['lines_kept']:,} lines and {result['signatures']:,} signatures: "
              f"{', '.join(result['signature_ids'])}; failing ranks {result['failing_ranks']}")
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
