"""probes.proc on real processes: TERM first, KILL after the grace, the whole tree, reaped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from probes.proc import end, end_tree, kill_tree, own_group

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups and signals are POSIX")


def _start(code: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A Python child that writes 'ready' once its handlers are set and ``code`` has run."""
    ready = tmp_path / "ready"
    body = (
        textwrap.dedent(code)
        + f"\nopen({str(ready)!r}, 'w').write('ready')\nimport time\nwhile True: time.sleep(0.1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", body], **own_group())
    while not ready.exists():
        assert proc.poll() is None, "the child died before it was ready"
    return proc, ready


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _on_term(note: Path, then: str) -> str:
    return f"import signal, sys\ndef on_term(*_):\n    open({str(note)!r}, 'w').write('TERM')\n    {then}\nsignal.signal(signal.SIGTERM, on_term)"


def test_a_process_that_honours_term_ends_by_it_within_the_grace(tmp_path):
    note = tmp_path / "note"
    proc, _ = _start(_on_term(note, "sys.exit(7)"), tmp_path)
    assert end_tree(proc.pid, grace=30.0) == []
    assert note.read_text() == "TERM" and _gone(proc.pid)


def test_a_process_that_ignores_term_is_killed_after_the_grace(tmp_path):
    note = tmp_path / "note"
    proc, _ = _start(_on_term(note, "pass"), tmp_path)
    assert end_tree(proc.pid, grace=0.3) == []
    assert note.read_text() == "TERM" and _gone(proc.pid)


def test_a_grandchild_in_a_session_of_its_own_goes_with_the_tree(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
    """
    proc, _ = _start(code, tmp_path)
    grandchild = int(pid_file.read_text())
    assert end_tree(proc.pid, grace=0.3) == []
    proc.wait(timeout=5)
    assert _gone(grandchild)


def test_kill_tree_takes_a_pid_or_the_processes_with_their_groups(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    note = tmp_path / "note"
    first, _ = _start(_on_term(note, "sys.exit(7)"), tmp_path / "a")
    second, _ = _start(_on_term(note, "sys.exit(7)"), tmp_path / "b")
    kill_tree(first.pid)
    kill_tree([psutil.Process(second.pid)], [second.pid])
    assert _gone(first.pid) and _gone(second.pid)
    assert not note.exists()  # KILL at once: no TERM to handle


def test_ending_nothing_is_nothing():
    assert end([], grace=1.0) == []
