"""Start the ranks of one micro-test, watch them against a hard deadline, leave nothing behind.

Like torchrun's agent, the first rank to fail ends the run: the others get a short grace to
report their own error, then the whole tree is killed. Descendants are tracked while they
live (a rank may start its own processes: Lightning's spawn launcher does), and each rank
leads its own process group, so a grandchild orphaned by a dead rank is still found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_POLL_S = 0.05
# Walking the process table costs milliseconds: on a small machine, done at every poll it
# would take CPU from the very ranks being measured.
_LOOK_S = 0.5
_REAP_S = 5.0
_TAIL_BYTES = 4000


@dataclass
class Launch:
    key: int | str  # the rank it runs, or "launcher" for one that starts the ranks itself
    argv: list[str]
    env: dict[str, str]


@dataclass
class Exit:
    returncode: int | None
    killed: str | None = None  # why the watchdog killed it, when it did

    def describe(self) -> str:
        if self.killed:
            return f"killed by the watchdog {self.killed}"
        if self.returncode is None:
            return "still running"
        if self.returncode < 0:
            return f"signal {signal_name(-self.returncode)}"
        return f"exit {self.returncode}"

    @property
    def signalled(self) -> bool:
        return not self.killed and self.returncode is not None and self.returncode < 0


@dataclass
class Watched:
    exits: dict[int | str, Exit]
    deadline_hit: bool
    failed_first: list[int | str]  # keys that failed in the first poll that saw a failure
    elapsed_s: float
    output: dict[int | str, str] = field(default_factory=dict)  # tail of each one's output


def who(key: int | str) -> str:
    return f"rank {key}" if isinstance(key, int) else str(key)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _own_group() -> dict:
    """Popen options that make each rank lead a process group of its own.

    A group, not a session: Linux schedules each session as one unit (autogroup), and two
    ranks in sessions of their own answer each other's messages several times slower on a
    busy machine, which would show as bandwidth the job does not lack.
    """
    if os.name != "posix":
        return {}
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"start_new_session": True}  # 3.10 has no safe way to set only the group


def _spawn(launch: Launch, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            launch.argv,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            **_own_group(),
        )


def _descendants(roots: list[int]) -> list[psutil.Process]:
    """Every live descendant of ``roots``, from one pass over the process table."""
    children: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc)
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def _group_members(groups: list[int]) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(proc.pid) in groups:
                members.append(proc)
    return members


def kill_tree(procs: list[psutil.Process], groups: list[int]) -> None:
    """SIGKILL every process given and every member of the given process groups; wait for them."""
    procs = list({p.pid: p for p in [*procs, *(_group_members(groups) if groups else [])]}.values())
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()
    psutil.wait_procs(procs, timeout=_REAP_S)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def supervise(
    launches: list[Launch], workdir: Path, timeout_s: float, grace_s: float = 1.0
) -> Watched:
    """Run ``launches`` at once; return when all ended, or after killing them all."""
    start = time.monotonic()
    deadline = start + timeout_s
    popens: dict[int | str, subprocess.Popen] = {}
    tracked: dict[int, psutil.Process] = {}
    exits: dict[int | str, Exit] = {}
    failed_first: list[int | str] = []
    failed_at: float | None = None
    deadline_hit = False
    logs = {launch.key: workdir / f"{launch.key}.log" for launch in launches}
    try:
        for launch in launches:
            popen = _spawn(launch, logs[launch.key])
            popens[launch.key] = popen
            with contextlib.suppress(psutil.NoSuchProcess):
                tracked[popen.pid] = psutil.Process(popen.pid)
        next_look = 0.0
        while True:
            if time.monotonic() >= next_look:
                for child in _descendants([pid for pid, p in tracked.items() if p.is_running()]):
                    tracked.setdefault(child.pid, child)
                next_look = time.monotonic() + _LOOK_S
            newly_failed = []
            for key, popen in popens.items():
                if key not in exits and (rc := popen.poll()) is not None:
                    exits[key] = Exit(rc)
                    if rc != 0:
                        newly_failed.append(key)
            if newly_failed and failed_at is None:
                failed_first, failed_at = newly_failed, time.monotonic()
            now = time.monotonic()
            if len(exits) == len(popens):
                break
            why = None
            if now >= deadline:
                why, deadline_hit = f"at the {timeout_s:g} s deadline", True
            elif failed_at is not None and now >= failed_at + grace_s:
                why = f"after {who(failed_first[0])} failed"
            if why:
                for key in popens:
                    exits.setdefault(key, Exit(None, killed=why))
                break
            time.sleep(_POLL_S)
    finally:
        groups = [p.pid for p in popens.values()] if os.name == "posix" else []
        kill_tree(list(tracked.values()), groups)
        for key, popen in popens.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=_REAP_S)
            exits.setdefault(key, Exit(popen.returncode, killed="when the run was interrupted"))
    return Watched(
        exits=exits,
        deadline_hit=deadline_hit,
        failed_first=failed_first,
        elapsed_s=time.monotonic() - start,
        output={key: _tail(path) for key, path in logs.items()},
    )
