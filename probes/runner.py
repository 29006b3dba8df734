"""The one way probes start a command: an argv list, a deadline, and nothing left behind.

Probes take a ``Runner`` argument so tests can hand them canned results instead of
starting real processes. ``run`` is the real one.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from probes.proc import kill_tree

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
        except subprocess.TimeoutExpired:  # a grandchild that escaped the tree holds the pipes
            out, err = "", ""
        return Result(argv, None, out or "", err or "", time.monotonic() - start, timed_out=True)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
