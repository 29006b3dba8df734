"""The one way probes start a command: an argv list, a deadline, and nothing left behind.

Probes take a ``Runner`` argument so tests can hand them canned results instead of
starting real processes. ``run`` is the real one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import psutil

# After a kill, how long to wait for the pipes to drain; a grandchild that escaped the
# process tree can hold them open forever.
_DRAIN_S = 2.0


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int | None  # None when it never ran or was killed on timeout
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    error: str | None = None  # why it could not start ("not found: nvidia-smi")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], timeout: float) -> Result: ...


def kill_tree(pid: int) -> None:
    """Kill ``pid``, every descendant, and its process group (which catches re-parented ones)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    if hasattr(os, "killpg"):  # POSIX; on Windows the psutil walk above is all there is
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    # A killed grandchild stays a zombie until its new parent reaps it, and not every
    # container's pid 1 does; a zombie holds no memory, GPU or port, so it counts as gone.
    deadline = time.monotonic() + _DRAIN_S
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)


def _alive(proc: psutil.Process) -> bool:
    try:
        proc.wait(timeout=0)  # reaps it when it is our own child
        return False
    except psutil.TimeoutExpired:
        pass
    except psutil.NoSuchProcess:
        return False
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run(argv: Sequence[str], timeout: float) -> Result:
    """Run ``argv`` (never through a shell) for at most ``timeout`` seconds.

    On timeout the whole tree is killed and whatever it printed so far is returned, so a
    child that reports in stages still tells how far it got.
    """
    argv = tuple(argv)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            # its own session, so the group kill in kill_tree reaches every descendant
            start_new_session=True,
        )
    except OSError as exc:
        reason = f"not found: {argv[0]}" if isinstance(exc, FileNotFoundError) else str(exc)
        return Result(argv, None, "", "", time.monotonic() - start, error=reason)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Result(argv, proc.returncode, out, err, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        try:
            out, err = proc.communicate(timeout=_DRAIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = "", ""
        return Result(argv, None, out or "", err or "", time.monotonic() - start, timed_out=True)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
