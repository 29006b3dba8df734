"""Real bug reports as a yardstick: load a case file, diagnose it offline, say where its cause ranks.

A case is one YAML file (``source``, ``title``, ``cause``, ``established_by``, ``env_report``,
``log``): one public thread whose cause was established. It is diagnosed as
``diagnose --offline --report ENV --log LOG`` would, in this process: ENV is the
``env_report`` and LOG the ``title`` line followed by the ``log``, the issue as posted. The
same code serves ``bench/cases.py`` (the table), ``tests/test_cases.py`` (one test per case
and the ratchets) and anyone holding their own folder of cases.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from diagnose.kb import KB

FIELDS = ("source", "title", "cause", "established_by", "env_report", "log")
CONFIDENCES = ("high", "medium", "low")


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
class Shown:
    """One finding as the report shows it."""

    id: str
    confidence: str


@dataclass(frozen=True)
class Result:
    case: Case
    findings: tuple[Shown, ...] = ()  # most likely first
    crash: str | None = None  # why the diagnosis gave no report

    @property
    def rank(self) -> int | None:
        """1-based position of the case's cause among the findings; None when it is not one."""
        ids = [f.id for f in self.findings]
        return ids.index(self.case.cause) + 1 if self.case.cause in ids else None

    @property
    def top(self) -> Shown | None:
        return self.findings[0] if self.findings else None


def load_case(path: Path) -> Case:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CaseError(f"{path}: cannot read case: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise CaseError(f"{path}: a case is a mapping with {', '.join(FIELDS)}")
    missing = [f for f in FIELDS if f not in data]
    unknown = sorted(set(data) - set(FIELDS))
    if missing or unknown:
        raise CaseError(f"{path}: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}")
    wrong = [f for f in FIELDS if not isinstance(data[f], str)]
    if wrong:
        raise CaseError(f"{path}: {wrong[0]} must be text")
    return Case(path, data["source"], data["title"], data["cause"], data["env_report"], data["log"])


def case_paths(dirs: Iterable[Path]) -> list[Path]:
    """The case files of each folder, sorted; a folder that does not exist holds none."""
    return [p for d in dirs if d.is_dir() for p in sorted(d.glob("*.yaml"))]


def run_case(case: Case, kb: KB) -> Result:
    """The case diagnosed offline against ``kb``; a failure of the tool is the result's crash."""
    from diagnose.api import offline_facts
    from diagnose.engine import evaluate

    reports = [("env_report", case.env_report)] if case.env_report else []
    logs = [("log", io.StringIO(case.title + "\n" + case.log))]
    try:
        report = evaluate(offline_facts(reports=reports, logs=logs, kb=kb), kb)
    except Exception as exc:  # the yardstick records a crash and goes on to the next case
        return Result(case, crash=f"{type(exc).__name__}: {exc}")
    return Result(case, tuple(Shown(f.id, f.confidence) for f in report.findings))


def run_cases(paths: Sequence[Path], kb: KB) -> list[Result]:
    """Every case of ``paths``; a malformed case file stops the run with its CaseError."""
    return [run_case(case, kb) for case in [load_case(p) for p in paths]]


def shares(results: Sequence[Result]) -> tuple[float, float, int]:
    """(share ranked first, share in the top 3, crashes); a crash counts as a miss."""
    n = len(results) or 1
    first = sum(r.rank == 1 for r in results) / n
    top3 = sum(r.rank is not None and r.rank <= 3 for r in results) / n
    return first, top3, sum(r.crash is not None for r in results)


@dataclass(frozen=True)
class Calibration:
    """Of the first-ranked findings shown at one confidence, how many named the case's cause."""

    confidence: str  # high, medium, low, or "all"
    shown: int
    right: int

    @property
    def share(self) -> float | None:
        return self.right / self.shown if self.shown else None


def calibration(results: Sequence[Result]) -> list[Calibration]:
    """One row per confidence, then all of them: how far a first finding's confidence can be trusted."""
    tops = [(r.top.confidence, r.rank == 1) for r in results if r.top is not None]
    rows = [
        Calibration(level, sum(c == level for c, _ in tops), sum(c == level and right for c, right in tops))
        for level in CONFIDENCES
    ]
    return [*rows, Calibration("all", len(tops), sum(right for _, right in tops))]
