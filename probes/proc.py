"""Process trees: how diagnose starts them and the one way it ends them.

Every process diagnose ends (a probe's command past its deadline, micro-test ranks, a
supervised training job, what a job left behind, the TUI's checks on quit) is ended here, by
one policy: TERM the process groups (a launcher passes the signal on to its workers) and each
known process outside them, wait up to a grace, then KILL the groups and every process still
there, the descendants psutil found included (a worker in a session of its own escapes the
group), and reap. A zombie whose parent is not us holds no memory, GPU or port: it counts as
gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence

import psutil

# After KILL, how long to wait for the processes to be gone; one in uninterruptible sleep (a
# hung NFS read, a GPU driver call) can take a while, and past this it is reported, not waited on.
REAP_S = 5.0
_REAP_POLL_S = 0.02
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def own_group() -> dict:
    """Popen options that make the child lead a process group of its own.

    A group, not a session: Linux schedules each session as one unit (autogroup), and two
    ranks in sessions of their own answer each other's messages several times slower on a
    busy machine, which would show as bandwidth the job does not lack.
    """
    if os.name != "posix":
        return {}
    if sys.version_info >= (3, 11):  # noqa: UP036 - requires-python still admits 3.10
        return {"process_group": 0}
    return {"start_new_session": True}  # 3.10 has no safe way to set only the group


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every descendant alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def descendants(roots: Iterable[int]) -> list[psutil.Process]:
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


def group_members(groups: Iterable[int]) -> list[psutil.Process]:
    wanted = set(groups)
    members = []
    if not wanted or not hasattr(os, "getpgid"):
        return members
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(proc.pid) in wanted:
                members.append(proc)
    return members


def end(
    procs: Iterable[psutil.Process], *, groups: Sequence[int] = (), grace: float = 0.0, reap_s: float = REAP_S
) -> list[psutil.Process]:
    """End ``procs`` and the members of ``groups``: TERM, up to ``grace`` seconds, KILL, reap.

    With ``grace`` 0 it goes straight to KILL. Returns the processes still alive afterwards.
    """
    found = {p.pid: p for p in [*procs, *group_members(groups)]}
    targets = list(found.values())
    if grace > 0:
        for group in groups:
            _signal_group(group, signal.SIGTERM)
        for proc in targets:
            if not _in_groups(proc, groups):
                with contextlib.suppress(psutil.Error):
                    proc.terminate()
        _reap(targets, grace)
    for group in groups:
        _signal_group(group, signal.SIGKILL)
    for proc in targets:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return _reap(targets, reap_s)


def kill_tree(target: int | Sequence[psutil.Process], groups: Sequence[int] = ()) -> None:
    """KILL at once: a pid with its descendants and its process group, or the processes given
    with the members of ``groups``; wait until they are gone."""
    if isinstance(target, int):
        end(tree(target), groups=[target, *groups] if hasattr(os, "killpg") else [])
    else:
        end(target, groups=groups)


def end_tree(pid: int, grace: float) -> list[psutil.Process]:
    """The process ``pid`` leads, its group and its descendants: TERM, KILL after ``grace``."""
    return end(tree(pid), groups=[pid] if hasattr(os, "killpg") else [], grace=grace)


def signal_group(pid: int, sig: int) -> bool:
    """Pass ``sig`` (a SIGINT the user typed) to the group ``pid`` leads; False when it is gone."""
    return _signal_group(pid, sig)


def become_subreaper() -> bool:
    """Make orphans of our children (double-forked daemons) our children instead of init's."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:
    """In a child before exec: the kernel KILLs it when its parent dies."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def die_now() -> None:
    """End this process at once, as the kernel's OOM killer would: no handler, no cleanup."""
    os.kill(os.getpid(), signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> bool:
    if not hasattr(os, "killpg"):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _in_groups(proc: psutil.Process, groups: Sequence[int]) -> bool:
    if not groups:
        return False
    try:
        return os.getpgid(proc.pid) in groups
    except (ProcessLookupError, OSError):
        return False


def _reap(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` for ``procs`` to be gone (reaping our own children); the live rest."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(_REAP_POLL_S)
        alive = [p for p in alive if _alive(p)]
    return alive


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


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
