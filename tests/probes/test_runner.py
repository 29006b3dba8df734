"""probes.runner with real processes: deadlines, partial output, and no process left behind."""

from __future__ import annotations

import sys
import uuid

import psutil

from probes import runner


def leftovers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in (proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_runs_argv_without_a_shell() -> None:
    result = runner.run([sys.executable, "-c", "import sys; print(sys.argv[1])", "$(echo hi); ls"], 10)
    assert result.ok and result.stdout == "$(echo hi); ls\n"
    assert result.returncode == 0 and not result.timed_out


def test_failure_keeps_status_and_stderr() -> None:
    result = runner.run([sys.executable, "-c", "import sys; sys.exit('boom')"], 10)
    assert not result.ok and result.returncode == 1 and result.stderr == "boom\n"


def test_missing_program_is_a_reason_not_an_exception() -> None:
    result = runner.run(["no-such-program-for-diagnose"], 10)
    assert result.error == "not found: no-such-program-for-diagnose"
    assert result.returncode is None and not result.ok


def test_timeout_kills_the_tree_and_keeps_what_was_printed() -> None:
    marker = f"diagnose-test-{uuid.uuid4()}"
    # a child that prints, starts a grandchild, and a double-forked orphan, then hangs
    code = (
        "import os, subprocess, sys, time\n"
        f"m = {marker!r}\n"
        "print('got this far', flush=True)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', m])\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', m])\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    result = runner.run([sys.executable, "-c", code, marker], 1.5)
    assert result.timed_out and result.returncode is None and not result.ok
    assert result.stdout == "got this far\n"
    assert leftovers(marker) == []
