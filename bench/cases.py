"""The yardstick of offline diagnosis: real bug reports, diagnosed as the offline CLI does.

Every case of ``../shared/cases/`` and ``tests/cases/`` goes through ``diagnose.cases`` (the
offline diagnosis of ``diagnose --offline --report ENV --log LOG``, in this process). Printed
per case: the rank of the expected cause among the findings (``-`` when it is not a finding)
and the first finding with its confidence; then the share ranked first, the share in the top
3 and the crashes; then the calibration: of the first findings shown at each confidence, how
many named the case's cause. ``tests/test_cases.py`` holds floors under the top-3 share and
the share of "high" that is right.

    python bench/cases.py            # the tables and the shares
    python bench/cases.py -k nccl    # only cases whose file name contains "nccl"
    python bench/cases.py --blind DIR --batch 2026-11-27-n --note "..."

``--blind`` scores a folder of new cases before any rule changes for them: it writes
``bench/batches/BATCH.txt`` (each case's blind rank and first finding, with the commit scored
at) and appends the batch's line to ``bench/history.csv``. Move the cases into ``tests/cases/``
only afterwards; the record names them there.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnose.cases import CaseError, calibration, case_paths, run_cases, shares  # noqa: E402
from diagnose.kb import KBError, load_kb  # noqa: E402

SHARED_CASES = ROOT.parent / "shared" / "cases"
OWN_CASES = ROOT / "tests" / "cases"
HISTORY = ROOT / "bench" / "history.csv"
BATCHES = ROOT / "bench" / "batches"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CaseError(f"git {args[0]}: {exc}") from None


def _commit() -> str:
    done = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--", "kb", "probes", "diagnose").stdout.strip()
    if done.returncode or dirty:
        raise CaseError("score a blind batch at a clean commit: kb/, probes/ or diagnose/ has uncommitted changes")
    return done.stdout.strip()


def blind(folder: Path, batch: str, note: str) -> int:
    """Score a new batch and record it (bench/batches/BATCH.txt, a line of bench/history.csv)."""
    record = BATCHES / f"{batch}.txt"
    if record.exists():
        raise CaseError(f"{record}: batch {batch} is already recorded; a batch is scored blind once")
    paths = case_paths([folder])
    if not paths:
        raise CaseError(f"{folder}: no case files (*.yaml)")
    commit = _commit()
    results = run_cases(paths, load_kb())
    first, top3, crashes = shares(results)
    causes = len({r.case.cause for r in results})
    lines = [
        f"# Batch {batch}: real reports scored blind at {commit[:7]} (before any rule change for them).",
        "# Columns: case file, expected cause, blind rank of the expected cause (- = not a finding), top finding.",
        "",
    ]
    for r in results:
        rank = "crash" if r.crash else (str(r.rank) if r.rank else "-")
        top = f"{r.top.id} ({r.top.confidence})" if r.top else "(no finding)"
        lines.append(f"tests/cases/{r.case.path.name}\t{r.case.cause}\t{rank}\t{top}")
    summary = f"{len(results)} cases, {causes} causes: blind top1 {first:.2f}, top3 {top3:.2f}, crashes {crashes}"
    record.write_text("\n".join([*lines, "", summary, ""]), encoding="utf-8")
    with HISTORY.open("a", newline="", encoding="utf-8") as out:
        row = [datetime.date.today().isoformat(), batch, len(results), f"{first:.2f}", f"{top3:.2f}", commit, note]
        csv.writer(out, lineterminator="\n").writerow(row)
    print("\n".join(lines[3:]))
    print(f"\n{summary}\nrecorded: {record.relative_to(ROOT)}, {HISTORY.relative_to(ROOT)}")
    return 1 if crashes else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only cases whose file name contains this")
    parser.add_argument("--blind", type=Path, metavar="DIR", help="score this folder of new cases and record it")
    parser.add_argument("--batch", help="the new batch's name (with --blind), e.g. 2026-11-27-n")
    parser.add_argument("--note", default="", help="what the batch is (with --blind), for bench/history.csv")
    args = parser.parse_args(argv)
    if args.blind:
        if not args.batch:
            parser.error("--blind needs --batch NAME")
        try:
            return blind(args.blind, args.batch, args.note)
        except (CaseError, KBError) as exc:
            print(f"cases: error: {exc}", file=sys.stderr)
            return 2
    paths = [p for p in case_paths((SHARED_CASES, OWN_CASES)) if args.k in p.name]
    start = time.perf_counter()
    try:
        results = run_cases(paths, load_kb())
    except (CaseError, KBError) as exc:
        print(f"cases: error: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    for r in results:
        rank = "crash" if r.crash else (str(r.rank) if r.rank else "-")
        where = "shared" if r.case.path.parent == SHARED_CASES else "own"
        detail = r.crash or (f"top: {r.top.id} ({r.top.confidence})" if r.top else "top: (no finding)")
        print(f"{rank:>5}  {where:<6} {r.case.name:<58} {r.case.cause:<32} {detail}")
    first, top3, crashes = shares(results)
    print(f"\n{len(results)} cases in {seconds:.1f} s: first {first:.0%}, top 3 {top3:.0%}, crashes {crashes}")
    print("\nconfidence of the first finding   shown   its case's cause   share")
    for row in calibration(results):
        share = f"{row.share:.0%}" if row.share is not None else "-"
        print(f"{row.confidence:<33} {row.shown:>5}   {row.right:>16}   {share:>5}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
