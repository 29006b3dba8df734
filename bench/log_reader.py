"""Benchmark: probes.log.read_log over a generated 1 GB log, beside grep on the same file.

    python bench/log_reader.py [--size-mb 1024] [--keep]

Writes a log of about SIZE MB to a temporary file, as a 16-rank torchrun job run with
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL writes it: every collective's NCCL INFO line
(the bulk of such logs), a communicator set-up burst of every NCCL INFO kind (bootstrap,
plugins, channels and their transports, trees, environment, Init COMPLETE) every 40,000
lines, progress bars, metrics, checkpoints, Python warnings, and in the middle a few real
errors (a CUDA OOM traceback, an NCCL WARN, a watchdog timeout), then torchrun's failure
summary. It then reads the file in a child process with the shipped rules' log literals as
``keep`` (what ``diagnose --log`` does), and in the same run times ``grep -c`` of a literal
on the same file. Printed: MB/s of both and their ratio, the child's peak resident memory
beside that of a process that only imports the reader, and what the reader found. The file
is deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RANKS = 16
ROUTINE = [  # (weight, template)
    (
        40,
        "node{n}:{pid}:{tid} [{lr}] NCCL INFO AllReduce: opCount {op:x} sendbuff 0x7f{a:08x} recvbuff 0x7f{a:08x} "
        "count {count} datatype 7 op 0 root 0 comm 0x55{c:06x} [nranks={ranks}] stream 0x56{c:06x}",
    ),
    (
        8,
        "node{n}:{pid}:{tid} [{lr}] NCCL INFO Broadcast: opCount {op:x} sendbuff 0x7f{a:08x} recvbuff 0x7f{a:08x} "
        "count {count} datatype 0 op 0 root 0 comm 0x55{c:06x} [nranks={ranks}] stream 0x56{c:06x}",
    ),
    (20, "[default{lr}]:Epoch {e}:  {p}%|{bar}| {s}/20000 [12:{mm}<1:02:11,  5.31it/s, loss={loss:.4f}, v_num=3]"),
    (15, "[default{lr}]:{{'loss': {loss:.4f}, 'grad_norm': 1.41, 'learning_rate': 2.04e-06, 'epoch': {e}.{p}}}"),
    (
        5,
        "[default{lr}]:Epoch {e}, global step {s}: 'val_loss' reached {loss:.5f} (best {loss:.5f}), saving model to "
        "'/ckpt/epoch={e}-step={s}.ckpt' as top 3",
    ),
    (2, "[default{lr}]:  0%|          | 0/125 [00:00<?, ?it/s]\x1b[A"),
]
WARNING = [
    "[default{lr}]:/opt/conda/lib/python3.11/site-packages/lightning/pytorch/trainer/connectors/data_connector.py:424: "
    "PossibleUserWarning: The 'val_dataloader' does not have many workers which may be a bottleneck.",
    "[default{lr}]:  warnings.warn(",
]
INIT = [
    "node{n}:{pid}:{pid} [{lr}] NCCL INFO Bootstrap : Using eth0:10.1.0.{n}<0>",
    "node{n}:{pid}:{pid} [{lr}] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: "
    "cannot open shared object file: No such file or directory",
    "node{n}:{pid}:{pid} [{lr}] NCCL INFO NET/Plugin : No plugin found, using internal implementation",
    "node{n}:{pid}:{pid} [{lr}] NCCL INFO cudaDriverVersion 12040",
    "NCCL version 2.21.5+cuda12.4",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Failed to open libibverbs.so[.1]",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO NET/Socket : Using [0]eth0:10.1.0.{n}<0>",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Using non-device net plugin version 0",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Using network Socket",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO comm 0x55{c:06x} rank {r} nranks {ranks} cudaDev {lr} nvmlDev {lr} "
    "busId {bus}000 commId 0x{c:x} - Init START",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Setting affinity for GPU {lr} to ffff,ffffffff",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO NVLS multicast support is not available on dev {lr}",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO comm 0x55{c:06x} rank {r} nRanks {ranks} nNodes 2 localRanks 8 "
    "localRank {lr} MNNVL 0",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Trees [0] {r1}/-1/-1->{r}->{r0} [1] {r1}/-1/-1->{r}->{r0}",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO P2P Chunksize set to 524288",
    *[
        f"node{{n}}:{{pid}}:{{tid}} [{{lr}}] NCCL INFO Channel {ch:02d}/0 : {{r}}[{{lr}}] -> {{r1}}[{{lr1}}] via P2P/CUMEM/read"
        for ch in range(8)
    ],
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Channel 00/0 : {r}[{lr}] -> {rn}[{lr}] [send] via NET/Socket/0",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Connected all rings",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Connected all trees",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO 8 coll channels, 8 collnet channels, 0 nvls channels, 8 p2p channels, "
    "8 p2p channels per peer",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO TUNER/Plugin: Plugin load returned 2 : libnccl-tuner.so: cannot open shared "
    "object file: No such file or directory : when loading libnccl-tuner.so",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO ncclCommInitRank comm 0x55{c:06x} rank {r} nranks {ranks} cudaDev {lr} "
    "nvmlDev {lr} busId {bus}000 commId 0x{c:x} - Init COMPLETE",
    "node{n}:{pid}:{tid} [{lr}] NCCL INFO Init timings: rank {r} nranks {ranks} total 0.52 (kernels 0.11, alloc 0.01, "
    "bootstrap 0.05, allgathers 0.01, topo 0.20, graphs 0.01, connections 0.12, rest 0.01)",
]
INCIDENT = [
    "[rank{r}]:Traceback (most recent call last):",
    '[rank{r}]:  File "/work/train.py", line 88, in <module>',
    "[rank{r}]:    trainer.fit(model)",
    "[rank{r}]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU {lr} has a total capacity "
    "of 79.15 GiB of which 3.06 MiB is free.",
    "node{n}:{pid}:{tid} [{lr}] NCCL WARN Cuda failure 'out of memory'",
    "[rank{r}]:[E1122 17:00:{mm}.000 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 "
    "milliseconds before timing out.",
]
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_17:00:00
  host      : node1
  rank      : 11 (local_rank: 3)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""
INIT_EVERY = 40_000
WARNING_EVERY = 5_000
GREP_LITERAL = "NCCL WARN"


def _fields(rng: random.Random, lines: int, r: int) -> dict:
    s = lines % 20000
    return {
        "r": r,
        "lr": r % 8,
        "n": r // 8,
        "pid": 1000 + r,
        "tid": 2000 + r,
        "ranks": RANKS,
        "r0": (r - 1) % RANKS,
        "r1": (r + 1) % RANKS,
        "lr1": (r + 1) % 8,
        "rn": (r + 8) % RANKS,
        "bus": f"{0x1B + r % 8 * 16:x}",
        "c": 0x1000 + lines // INIT_EVERY,
        "op": lines // RANKS,
        "a": rng.getrandbits(32),
        "count": rng.choice((1, 4096, 1 << 20)),
        "e": lines // 1_000_000,
        "p": s * 100 // 20000,
        "bar": "█" * (s % 10),
        "s": s,
        "mm": 10 + s % 50,
        "loss": rng.random(),
    }


def write_log(path: Path, size_mb: int, seed: int = 0) -> int:
    """Write about size_mb MB of log lines; returns the number of lines."""
    rng = random.Random(seed)
    weights = [w for w, _ in ROUTINE]
    routine = [t for _, t in ROUTINE]
    target = size_mb * 1024 * 1024
    written = lines = 0
    middle = target // 2
    incident_done = False
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            block = []
            while len(block) < 20_000:
                if lines % INIT_EVERY == 0:
                    for r in range(RANKS):
                        block.extend(t.format(**_fields(rng, lines, r)) for t in INIT)
                if lines % WARNING_EVERY == 0:
                    r = rng.randrange(RANKS)
                    block.extend(t.format(**_fields(rng, lines, r)) for t in WARNING)
                if not incident_done and written >= middle:
                    block.extend(t.format(**_fields(rng, lines, 5)) for t in INCIDENT)
                    incident_done = True
                template = rng.choices(routine, weights)[0]
                block.append(template.format(**_fields(rng, lines, rng.randrange(RANKS))))
                lines += 1
            text = "\n".join(block) + "\n"
            lines += len(block) - 20_000
            f.write(text)
            written += len(text.encode("utf-8"))
        f.write(SUMMARY)
    return sum(1 for _ in open(path, "rb"))


def read_child(path: str, keep_file: str) -> None:
    """Run in the child: read the log and print what was found as JSON."""
    from probes.log import read_log

    keep = json.loads(Path(keep_file).read_text())
    start = time.perf_counter()
    log = read_log(path, Path(path).name, keep)
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "lines_read": log.lines_read,
                "lines_kept": len(log.lines or []),
                "signatures": len(log.signatures or []),
                "signature_ids": log.signature_ids,
                "failing_ranks": log.failing_ranks,
            }
        )
    )


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


def grep_seconds(path: Path) -> tuple[float, str]:
    """Wall time of ``grep -c LITERAL FILE`` (the file already in the page cache) and its count."""
    grep = shutil.which("grep")
    if grep is None:
        raise SystemExit("log_reader: grep is not on PATH")
    start = time.perf_counter()
    out = subprocess.run([grep, "-c", GREP_LITERAL, str(path)], capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    parser.add_argument("--read", nargs=2, help=argparse.SUPPRESS)  # child mode: LOG KEEP_JSON
    args = parser.parse_args(argv)
    if args.read:
        read_child(*args.read)
        return 0
    from diagnose.kb import load_kb

    fd, name = tempfile.mkstemp(prefix="diagnose-bench-", suffix=".log", dir="/tmp")
    os.close(fd)
    path = Path(name)
    keep_file = path.with_suffix(".keep.json")
    try:
        keep_file.write_text(json.dumps(sorted(load_kb().log_literals)))
        start = time.perf_counter()
        lines = write_log(path, args.size_mb)
        size_mb = path.stat().st_size / 1e6
        print(f"wrote {size_mb:,.0f} MB, {lines:,} lines in {time.perf_counter() - start:.1f}s: {path}")
        grep_s, grep_count = grep_seconds(path)
        baseline, _ = peak_rss_mib_of([sys.executable, "-c", "import probes.log as l; l._matcher(frozenset())"])
        peak, out = peak_rss_mib_of(
            [sys.executable, str(Path(__file__).resolve()), "--read", str(path), str(keep_file)]
        )
        grep_s2, _ = grep_seconds(path)
        grep_s = min(grep_s, grep_s2)
        result = json.loads(out)
        reader_rate, grep_rate = size_mb / result["seconds"], size_mb / grep_s
        print(f"reader:  {result['lines_read']:,} lines in {result['seconds']:.2f}s: {reader_rate:,.0f} MB/s")
        print(
            f"grep -c '{GREP_LITERAL}': {grep_count} lines in {grep_s:.2f}s: {grep_rate:,.0f} MB/s "
            f"(the reader takes {grep_rate / reader_rate:.1f}x grep's time)"
        )
        print(f"peak memory: {peak:,.0f} MiB (a process that only imports the reader: {baseline:,.0f} MiB)")
        print(
            f"kept {result['lines_kept']:,} lines and {result['signatures']:,} signatures: "
            f"{', '.join(result['signature_ids'])}; failing ranks {result['failing_ranks']}"
        )
    finally:
        keep_file.unlink(missing_ok=True)
        if not args.keep:
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
