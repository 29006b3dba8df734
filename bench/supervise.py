"""What `diagnose run` costs and how fast it answers, on real 2-rank gloo jobs.

1. Detection latency: the seed's hang (a barrier reached by rank 0 only) under
   ``diagnose run --hang-after H``. Measured from the job's last line of output (its last
   progress: both ranks are idle from then on) to the first line of the printed report.
   Target: under H + 5 s.
2. Overhead: the supervisor's own CPU time (user + system of the `diagnose run` process,
   not its children) while a healthy job prints a step every STEP_S seconds, measured from
   the job's first step to its last, so Python's and torch's start-up are not counted.
   Target: under 1% of one core.
3. The zoo (tests/zoo/): every job that hangs, under ``--hang-after H``: the same latency,
   and the cause named first. Target: under H + 5 s, the zoo's own cause.

    python bench/supervise.py                     # all three, H = 3 and 10 (the zoo at H = 3)
    python bench/supervise.py --hang-after 5 --steps 40 --zoo-only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "hang"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
REPORT_HEADER = "lightning-diagnose"


def _lines(stream, label: str, sink: list[tuple[float, str, str]]) -> None:
    for raw in iter(stream.readline, b""):
        sink.append((time.monotonic(), label, raw.decode("utf-8", errors="replace").rstrip("\n")))


def _start(
    options: list[str], script: str | list[str], env: dict[str, str], out: str, cwd: Path = ROOT
) -> tuple[subprocess.Popen, list]:
    job = [*TORCHRUN, str(FIXTURES / script)] if isinstance(script, str) else script
    argv = [sys.executable, "-m", "diagnose", "run", "--out", out, *options, "--", *job]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    lines: list[tuple[float, str, str]] = []
    readers = [
        threading.Thread(target=_lines, args=(s, n, lines), daemon=True)
        for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))
    ]
    for reader in readers:
        reader.start()
    proc.readers = readers  # type: ignore[attr-defined]
    return proc, lines


def detection(hang_after: float) -> float:
    """Seconds from the job's last output to the first line of the report."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, HANG_TIMEOUT_S="120")
        proc, lines = _start(["--hang-after", str(hang_after), "--grace", "5"], "barrier_rank0.py", env, out)
        proc.wait(timeout=hang_after * 3 + 120)
        for reader in proc.readers:  # type: ignore[attr-defined]
            reader.join(timeout=5)
    report = next(t for t, stream, text in lines if stream == "out" and text.startswith(REPORT_HEADER))
    job = [t for t, stream, text in lines if t < report and text.startswith("rank ")]
    return report - max(job)


def overhead(steps: int, step_s: float) -> tuple[float, float]:
    """(share of one core while the job runs, share including diagnose's own start-up)."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, STEPS=str(steps), STEP_S=str(step_s), HANG_TIMEOUT_S="120")
        start_wall = time.monotonic()
        proc, lines = _start(["--hang-after", "300"], "healthy.py", env, out)
        me = psutil.Process(proc.pid)
        first = last = None
        while proc.poll() is None:
            job = [text for _, _, text in lines if text.startswith("rank 0: step")]
            cpu = me.cpu_times()
            now = time.monotonic()
            if job and first is None:
                first = (now, cpu.user + cpu.system)
            if job and job[-1].startswith(f"rank 0: step {steps - 1}/"):
                last = (now, cpu.user + cpu.system)
                total = (now - start_wall, cpu.user + cpu.system)
                break
            time.sleep(0.05)
        proc.wait(timeout=120)
        if first is None or last is None:
            raise SystemExit("the healthy job did not run to its last step")
    steady = (last[1] - first[1]) / (last[0] - first[0])
    return steady, total[1] / total[0]


def zoo(hang_after: float) -> list[tuple[str, float, str, str]]:
    """(job, seconds from its last output to the report, the cause named first, the zoo's cause)
    for every job of the zoo that hangs."""
    sys.path.insert(0, str(ROOT))
    from tests.zoo.test_zoo import ZOO, free_port

    rows = []
    for job in (j for j in ZOO if j.outcome == "hung"):
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, HANG_TIMEOUT_S="120", PYTHONPATH=str(ROOT))
            # the jobs write where they run (checkpoints): there, not in the checkout
            proc, lines = _start(
                ["--hang-after", str(hang_after), "--grace", "2", "--format", "text"],
                job.argv(free_port()),
                env,
                str(Path(out) / "run"),
                cwd=Path(out),
            )
            proc.wait(timeout=hang_after * 3 + 180)
            for reader in proc.readers:  # type: ignore[attr-defined]
                reader.join(timeout=5)
            import json

            top = json.loads((Path(out) / "run" / "report.json").read_text())["summary"]["top"]
        report = next(t for t, stream, text in lines if stream == "out" and text.startswith(REPORT_HEADER))
        output = [t for t, _, text in lines if t < report and text.strip() and not text.startswith("diagnose run:")]
        rows.append((job.script, report - max(output), top or "-", job.cause or "-"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hang-after", type=float, action="append", help="repeatable (default 3 and 10)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--zoo-only", action="store_true", help="only the zoo's hangs")
    args = parser.parse_args()
    zoo_h = (args.hang_after or [3.0])[0]
    print(f"{'zoo job (hangs)':<36} {'last output -> report':>22}  {'target':>7}  named first")
    for script, took, top, cause in zoo(zoo_h):
        verdict = "ok" if took < zoo_h + 5 else "SLOW"
        named = "ok" if top == cause else f"WRONG (expected {cause})"
        print(f"{script:<36} {took:>21.2f}s  {zoo_h + 5:>6g}s {verdict}  {top} {named}")
    if args.zoo_only:
        return
    print(f"{'--hang-after':>12}  {'last output -> report':>22}  {'target':>8}")
    for hang_after in args.hang_after or [3.0, 10.0]:
        for _ in range(args.runs):
            took = detection(hang_after)
            verdict = "ok" if took < hang_after + 5 else "SLOW"
            print(f"{hang_after:>11g}s  {took:>21.2f}s  {hang_after + 5:>7g}s {verdict}")
    steady, with_startup = overhead(args.steps, args.step_s)
    print(
        f"supervisor CPU while a healthy job runs ({args.steps} steps of {args.step_s:g}s): "
        f"{steady * 100:.2f}% of a core (target < 1%); {with_startup * 100:.1f}% including its own start-up"
    )


if __name__ == "__main__":
    main()
