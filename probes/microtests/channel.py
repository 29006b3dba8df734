"""How a rank tells the parent what it did: one JSON-lines file per rank.

A file, not a pipe, because it survives the rank: when the watchdog kills a hung rank, the
steps it wrote before hanging are still there to say where it stopped. Each event is one
line written and flushed at once; a line torn by a kill is skipped on reading.

Events: ``{"step": name}`` (the rank is entering that step), ``{"measure": {...}}``,
``{"check_failed": text}`` (a wrong result; the rank carries on so collectives stay matched),
``{"error": text, "timeout": bool, "missing": [ranks]}`` (the exception that ended the rank)
and ``{"done": true}``.

The other way, before a group of ranks starts its steps: each process answers with what it
found (``answers/<index>.json``) and the parent replies with ``plan.json``. Both are written
whole and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLAN = "plan.json"


def channel_path(directory: str | Path, rank: int | str) -> Path:
    return Path(directory) / f"rank{rank}.jsonl"


def answer_path(directory: str | Path, index: int) -> Path:
    return Path(directory) / "answers" / f"{index}.json"


def exit_path(directory: str | Path, rank: int) -> Path:
    """Where rank 0 writes the exit status of a rank it forked (the parent cannot wait on it)."""
    return Path(directory) / "exits" / f"{rank}.json"


def write_whole(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value), encoding="utf-8")
    partial.replace(path)


def read_whole(path: Path) -> Any | None:
    """The JSON document at ``path``, or None while it is not there yet."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


class Channel:
    """The writing end, used inside a rank."""

    def __init__(self, directory: str | Path, rank: int | str) -> None:
        self._file = open(channel_path(directory, rank), "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, event: dict[str, Any]) -> None:
        event["t"] = time.time()
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def step(self, name: str) -> None:
        self._write({"step": name})

    def measure(self, **values: Any) -> None:
        self._write({"measure": values})

    def check_failed(self, text: str) -> None:
        self._write({"check_failed": text})

    def error(self, text: str, *, timeout: bool = False, missing: list[int] | None = None) -> None:
        self._write({"error": text, "timeout": timeout, "missing": missing or []})

    def done(self) -> None:
        self._write({"done": True})
        self._file.close()


@dataclass
class RankReport:
    """What one rank wrote, as the parent reads it after the rank has ended."""

    steps: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    checks_failed: list[str] = field(default_factory=list)
    error: str | None = None
    error_time: float | None = None
    timeout: bool = False
    missing: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def last_step(self) -> str:
        return self.steps[-1] if self.steps else "not started"


def read_report(directory: str | Path, rank: int | str) -> RankReport:
    report = RankReport()
    try:
        text = channel_path(directory, rank).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return report
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if "step" in event:
            report.steps.append(str(event["step"]))
        elif "measure" in event and isinstance(event["measure"], dict):
            report.measurements.update(event["measure"])
        elif "check_failed" in event:
            report.checks_failed.append(str(event["check_failed"]))
        elif "error" in event:
            report.error = str(event["error"])
            report.error_time = event.get("t")
            report.timeout = bool(event.get("timeout"))
            report.missing = [int(r) for r in event.get("missing") or []]
        elif event.get("done"):
            report.done = True
    return report
