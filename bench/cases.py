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
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diagnose.cases import CaseError, calibration, case_paths, run_cases, shares  # noqa: E402
from diagnose.kb import load_kb  # noqa: E402

SHARED_CASES = ROOT.parent / "shared" / "cases"
OWN_CASES = ROOT / "tests" / "cases"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only cases whose file name contains this")
    args = parser.parse_args(argv)
    paths = [p for p in case_paths((SHARED_CASES, OWN_CASES)) if args.k in p.name]
    start = time.perf_counter()
    try:
        results = run_cases(paths, load_kb())
    except CaseError as exc:
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
