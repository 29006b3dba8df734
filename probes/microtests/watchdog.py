"""Start ranks, watch them against a hard deadline, leave nothing behind.

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
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from probes.proc import REAP_S, descendants, kill_tree, own_group

POLL_S = 0.05
# Walking the process table costs milliseconds: on a small machine, done at every poll it
# would take CPU from the very ranks being measured.
_LOOK_S = 0.5
_TAIL_BYTES = 4000


@dataclass
class Launch:
    key: int | str  # the rank it runs, or "launcher" for one that starts the ranks itself
    argv: list[str]
    env: dict[str, str]


@dataclass
class Ended:
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
    exits: dict[int | str, Ended]
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


def _spawn(launch: Launch, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            launch.argv,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            **own_group(),
        )


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


class Watchdog:
    """Processes started together, tracked with their descendants, and all killed on close.

    The caller polls and decides when to stop (a deadline, a failure); whatever it decides,
    closing kills every process still alive and reaps it, so nothing outlives the ``with``.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.start = time.monotonic()
        self.ended_at: float | None = None
        self.popens: dict[int | str, subprocess.Popen] = {}
        self.exits: dict[int | str, Ended] = {}
        self.failed_first: list[int | str] = []  # keys that failed in the first poll that saw one
        self._failed_at: float | None = None
        self._tracked: dict[int, psutil.Process] = {}
        self._logs: dict[int | str, Path] = {}
        self._adopted: list[int | str] = []
        self._reported: dict[int | str, int] = {}
        self._next_look = 0.0

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def launch(self, launch: Launch) -> None:
        log = self._logs[launch.key] = self.workdir / f"{launch.key}.log"
        popen = self.popens[launch.key] = _spawn(launch, log)
        with contextlib.suppress(psutil.NoSuchProcess):
            self._tracked[popen.pid] = psutil.Process(popen.pid)

    def adopt(self, key: int | str, log: Path) -> None:
        """Watch a process another one started (a forked rank): its parent reports its exit
        through ``exited``; the descendant scan and the group kill reach it like any other."""
        self._adopted.append(key)
        self._logs[key] = log

    def exited(self, key: int | str, returncode: int) -> None:
        if key not in self.exits:
            self._reported[key] = returncode

    def poll(self) -> None:
        """Note new descendants (now and then) and every exit since the last poll."""
        if time.monotonic() >= self._next_look:
            running = [pid for pid, p in self._tracked.items() if p.is_running()]
            for child in descendants(running):
                self._tracked.setdefault(child.pid, child)
            self._next_look = time.monotonic() + _LOOK_S
        newly_failed = []
        ended = {key: popen.poll() for key, popen in self.popens.items() if key not in self.exits}
        ended.update(self._reported)
        self._reported.clear()
        for key, rc in ended.items():
            if rc is not None:
                self.exits[key] = Ended(rc)
                if rc != 0:
                    newly_failed.append(key)
        if newly_failed and self._failed_at is None:
            self.failed_first, self._failed_at = newly_failed, time.monotonic()

    @property
    def ended(self) -> bool:
        return len(self.exits) == len(self.popens) + len(self._adopted)

    def grace_over(self, grace_s: float) -> bool:
        """A process failed at least ``grace_s`` ago: the others had their time to report."""
        return self._failed_at is not None and time.monotonic() >= self._failed_at + grace_s

    def stop(self, why: str) -> None:
        """Mark every process still running as killed for ``why``; ``close`` kills them."""
        for key in [*self.popens, *self._adopted]:
            self.exits.setdefault(key, Ended(None, killed=why))

    def close(self) -> None:
        if self.ended_at is not None:
            return
        groups = [p.pid for p in self.popens.values()] if os.name == "posix" else []
        kill_tree(list(self._tracked.values()), groups)
        for key, popen in self.popens.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=REAP_S)
            self.exits.setdefault(key, Ended(popen.returncode, killed="when the run was interrupted"))
        for key in self._adopted:
            self.exits.setdefault(key, Ended(None, killed="when the run was interrupted"))
        self.ended_at = time.monotonic()

    def tail(self, key: int | str) -> str:
        """The end of what one process printed so far."""
        return _tail(self._logs[key])

    def watched(self, deadline_hit: bool, since: float | None = None) -> Watched:
        """What became of the processes, once closed; elapsed from ``since`` (default: start)."""
        assert self.ended_at is not None, "close the watchdog first"
        return Watched(
            exits=dict(self.exits),
            deadline_hit=deadline_hit,
            failed_first=list(self.failed_first),
            elapsed_s=self.ended_at - (self.start if since is None else since),
            output={key: self.tail(key) for key in self._logs},
        )


def run_launches(launches: list[Launch], workdir: Path, timeout_s: float, grace_s: float = 1.0) -> Watched:
    """Run ``launches`` at once; return when all ended, or after killing them all."""
    deadline_hit = False
    with Watchdog(workdir) as dog:
        for launch in launches:
            dog.launch(launch)
        deadline = dog.start + timeout_s
        while True:
            dog.poll()
            if dog.ended:
                break
            if time.monotonic() >= deadline:
                deadline_hit = True
                dog.stop(f"at the {timeout_s:g} s deadline")
                break
            if dog.grace_over(grace_s):
                dog.stop(f"after {who(dog.failed_first[0])} failed")
                break
            time.sleep(POLL_S)
    return dog.watched(deadline_hit)
