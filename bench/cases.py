"""The yardstick of offline diagnosis: real bug reports through the real CLI.

Every case of ``../shared/cases/`` and ``tests/cases/`` (one YAML file each: ``source``,
``title``, ``cause``, ``established_by``, ``env_report``, ``log``) is fed to

    python -m diagnose --offline --report ENV --log LOG --json

with ENV the ``env_report`` and LOG the ``title`` line followed by the ``log``, the issue
as posted. Printed per case: the rank of the expected cause among the findings (``-``
when it is not a finding), then the share ranked first, the share in the top 3 and the
crashes (an exit code other than 0/1, no JSON, or a timeout).

``TOP3_FLOOR`` is the ratchet: ``tests/test_cases.py`` fails when the top-3 share falls
below it, and README quotes it. Raise it when the KB gets better; never lower it.

    python bench/cases.py            # the table and the shares
    python bench/cases.py -k nccl    # only cases whose file name contains "nccl"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SHARED_CASES = ROOT.parent / "shared" / "cases"
OWN_CASES = ROOT / "tests" / "cases"
CASE_DIRS = (SHARED_CASES, OWN_CASES)
FIELDS = ("source", "title", "cause", "established_by", "env_report", "log")

# The share of cases whose cause ranks in the top 3, as last measured; README quotes it.
TOP3_FLOOR = 0.84
TIMEOUT_S = 120


class CaseError(ValueError):
    """A case file that does not have the documented shape; the message names the file."""


@dataclass(frozen=True)
class Case:
    path: Path
    source: str
    title: str
    cause: str
    env_report: str
    log: str

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class Result:
    case: Case
    rank: int | None  # 1-based position of the expected cause among the findings
    top: str | None  # the first-ranked finding
    crash: str | None  # why the run did not give a report


def load_case(path: Path) -> Case:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CaseError(f"{path}: cannot read case: {exc}") from None
    if not isinstance(data, dict):
        raise CaseError(f"{path}: a case is a mapping with {', '.join(FIELDS)}")
    missing = [f for f in FIELDS if f not in data]
    unknown = sorted(set(data) - set(FIELDS))
    if missing or unknown:
        raise CaseError(f"{path}: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}")
    for f in FIELDS:
        if not isinstance(data[f], str):
            raise CaseError(f"{path}: {f} must be text")
    return Case(path, data["source"], data["title"], data["cause"], data["env_report"], data["log"])


def case_paths(dirs: tuple[Path, ...] = CASE_DIRS) -> list[Path]:
    return [p for d in dirs if d.is_dir() for p in sorted(d.glob("*.yaml"))]


def run_case(case: Case, timeout: float = TIMEOUT_S) -> Result:
    with tempfile.TemporaryDirectory(prefix="diagnose-case-") as tmp:
        env = Path(tmp) / "env.txt"
        log = Path(tmp) / "log.txt"
        env.write_text(case.env_report, encoding="utf-8")
        log.write_text(case.title + "\n" + case.log, encoding="utf-8")
        argv = [sys.executable, "-m", "diagnose", "--offline", "--report", str(env), "--log", str(log), "--json"]
        try:
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(case, None, None, f"timed out after {timeout:g}s")
    if proc.returncode not in (0, 1):
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        return Result(case, None, None, f"exit {proc.returncode}: {last}")
    try:
        findings = [f["id"] for f in json.loads(proc.stdout)["findings"]]
    except (ValueError, KeyError, TypeError) as exc:
        return Result(case, None, None, f"no JSON report: {exc}")
    rank = findings.index(case.cause) + 1 if case.cause in findings else None
    return Result(case, rank, findings[0] if findings else None, None)


def run_all(paths: list[Path], jobs: int = 2) -> list[Result]:
    cases = [load_case(p) for p in paths]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_case, cases))


def shares(results: list[Result]) -> tuple[float, float, int]:
    """(share ranked first, share in the top 3, crashes); crashes count as misses."""
    n = len(results) or 1
    first = sum(r.rank == 1 for r in results) / n
    top3 = sum(r.rank is not None and r.rank <= 3 for r in results) / n
    return first, top3, sum(r.crash is not None for r in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only cases whose file name contains this")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    paths = [p for p in case_paths() if args.k in p.name]
    try:
        results = run_all(paths, args.jobs)
    except CaseError as exc:
        print(f"cases: error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        rank = "crash" if r.crash else (str(r.rank) if r.rank else "-")
        where = "shared" if r.case.path.parent == SHARED_CASES else "own"
        detail = r.crash or f"top: {r.top or '(no finding)'}"
        print(f"{rank:>5}  {where:<6} {r.case.name:<58} {r.case.cause:<32} {detail}")
    first, top3, crashes = shares(results)
    print(f"\n{len(results)} cases: first {first:.0%}, top 3 {top3:.0%}, crashes {crashes} "
          f"(top-3 floor {TOP3_FLOOR:.0%})")
    return 0 if crashes == 0 and top3 >= TOP3_FLOOR else 1


if __name__ == "__main__":
    sys.exit(main())
