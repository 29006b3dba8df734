"""The Facts of a supervised run: its log, the hang's stacks, the machine and a rank's environment."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from diagnose.run.result import RunResult
from probes.facts import Hang
from probes.hang import first_failure

LAST_LINE_BYTES = 4096
LIVE_SECTIONS = ("host", "packages", "torch", "gpus", "driver", "env", "launcher")


def run_facts(command: Sequence[str], result: RunResult):
    from probes import env as env_probe
    from probes import launcher as launcher_probe
    from probes.facts import Facts, ProbeError
    from probes.log import LogError, log_from_text, read_log

    facts = Facts(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        inputs=[f"run:{shlex.join(command)[:200]}", f"log:{result.log_path}"],
    )
    if result.log_path is not None:
        with open(result.log_path, "rb") as f:
            try:
                facts.log = read_log(_Prefix(f, result.log_bytes), str(result.log_path))
            except LogError as exc:  # a job that printed binary data: the stacks still stand
                facts.errors.append(ProbeError(probe="log", message=str(exc)))
    if isinstance(result.live, Facts):
        facts.inputs.append("live")
        for section in LIVE_SECTIONS:
            setattr(facts, section, getattr(result.live, section))
        facts.errors.extend(result.live.errors)
    elif isinstance(result.live, Exception):
        facts.errors.append(ProbeError(probe="live", message=f"{type(result.live).__name__}: {result.live}"))
    if result.rank_env is not None:
        facts.launcher = launcher_probe.probe(result.rank_env)
        facts.env = env_probe.probe(result.rank_env)
    hang = result.hang if result.hang is not None else Hang(source="hang", detected=False)
    if result.log_path is not None:
        hang.last_output = _last_line(result.log_path, result.log_bytes)
    if result.outcome == "crashed" and result.log_path is not None:
        facts.hang = hang
        with open(result.log_path, encoding="utf-8", errors="replace") as f:
            hang.first_failure = first_failure(f, first_failing_rank(facts), log_from_text)
    hang.outcome = result.outcome
    hang.exit_code = result.exit_code if result.outcome != "hung" else None
    hang.idle_s = result.idle_s
    facts.hang = hang
    return facts


def _last_line(path: Path, limit: int) -> str | None:
    """The last non-empty line among the first ``limit`` bytes of the log."""
    with open(path, "rb") as f:
        f.seek(max(0, limit - LAST_LINE_BYTES))
        tail = f.read(min(limit, LAST_LINE_BYTES)).decode("utf-8", errors="replace")
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


class _Prefix:
    """The first ``limit`` bytes of a file, read in blocks: a multi-GB log stays out of memory."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self.f, self.left = f, limit

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        return data


def first_failing_rank(facts) -> int | None:
    signatures = facts.log.signatures or []
    for sig in signatures:
        if sig.id == "child_failed" and sig.data.get("first_failing_rank", "").isdigit():
            return int(sig.data["first_failing_rank"])
    ranked = sorted((s.line, s.rank) for s in signatures if s.rank is not None and s.id == "python_exception")
    return ranked[0][1] if ranked else None
