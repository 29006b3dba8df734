"""The watchdog on plain Python processes: deadlines, first failures, signals, orphans."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from probes.microtests.watchdog import Launch, run_launches, signal_name


def _python(key, code: str) -> Launch:
    return Launch(key, [sys.executable, "-c", textwrap.dedent(code)], {"PATH": "/usr/bin:/bin"})


def _spawner(pid_file: Path, then: str) -> str:
    """A process that starts a sleeping grandchild, writes its pid, then runs ``then``."""
    return f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        {then}
    """


def _sleepers() -> list[psutil.Process]:
    """Our descendants still running a test's ``time.sleep(60)``: none once the watchdog returns."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "time.sleep(60)" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_processes_that_finish_are_reported_with_their_exit_codes(tmp_path):
    watched = run_launches([_python(0, "pass"), _python(1, "print('hi')")], tmp_path, timeout_s=20)
    assert not watched.deadline_hit and watched.failed_first == []
    assert [watched.exits[k].describe() for k in (0, 1)] == ["exit 0", "exit 0"]
    assert "hi" in watched.output[1]


def test_deadline_kills_the_whole_tree_including_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    watched = run_launches([_python(0, _spawner(pid_file, "time.sleep(60)"))], tmp_path, timeout_s=1.5)
    assert watched.deadline_hit and watched.elapsed_s >= 1.5
    assert watched.exits[0].describe() == "killed by the watchdog at the 1.5 s deadline"
    assert _gone(int(pid_file.read_text())) and not _sleepers()


@pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")
def test_a_grandchild_orphaned_before_the_first_look_is_still_killed(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    watched = run_launches([_python(0, _spawner(pid_file, "sys.exit(0)"))], tmp_path, timeout_s=20)
    assert watched.exits[0].describe() == "exit 0"
    assert _gone(int(pid_file.read_text()))


def test_first_failure_ends_the_run_after_a_grace(tmp_path):
    watched = run_launches(
        [_python(0, "import sys; sys.exit(3)"), _python(1, "import time; time.sleep(60)")],
        tmp_path,
        timeout_s=30,
        grace_s=0.5,
    )
    assert not watched.deadline_hit
    assert watched.failed_first == [0]
    assert watched.exits[0].describe() == "exit 3"
    assert watched.exits[1].describe() == "killed by the watchdog after rank 0 failed"
    assert not _sleepers()  # rank 1 was ended and reaped, not left to its 60 s


def test_a_process_killed_by_a_signal_is_reported_with_it(tmp_path):
    watched = run_launches(
        [_python(0, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")],
        tmp_path,
        timeout_s=20,
    )
    assert watched.exits[0].signalled
    assert watched.exits[0].describe() == "signal SIGKILL"


def test_signal_names():
    assert signal_name(9) == "SIGKILL"
    assert signal_name(250) == "signal 250"
