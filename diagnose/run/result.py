"""What one supervised run came to: the record the watcher fills and the Facts are built from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from probes.facts import Hang


@dataclass
class RunResult:
    outcome: str  # finished, crashed, hung, interrupted
    exit_code: int | None
    idle_s: float | None = None
    log_path: Path | None = None
    log_bytes: int = 0  # how much of the log to diagnose: up to the hang, not its teardown
    hang: Hang | None = None  # when hung
    rank_env: dict[str, str] | None = None  # the environment of one rank, for launcher facts
    notes: list[str] = field(default_factory=list)
    kept_pid: int | None = None  # a hung job left running by --keep
    live: object = None  # what ``supervise(live=...)`` gathered while the job ran (Facts, or the exception)
