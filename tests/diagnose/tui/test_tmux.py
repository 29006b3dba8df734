"""End to end: the real `diagnose` in a tmux pane (a terminal, so it opens the TUI).

It waits for the results screen, reads the pane, checks the ranked causes and footer keys,
quits with `q` and checks the exit code of the CLI contract. The tmux server runs on a
private socket and is killed afterwards, whatever happened.

`DIAGNOSE_WRITE_SCREEN=docs/tui-screen.txt` also writes the captured duplicate-gpu screen
there (the README's picture of the TUI).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnose.engine import evaluate
from diagnose.kb import load_kb
from probes.facts import load_snapshot

from .conftest import SNAPSHOTS

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")

FOOTER_KEYS = ["r Re-run", "j Export JSON", "m Export MD", "/ Filter", "c Copy fix", "? Help", "q Quit"]
WIDTH, HEIGHT = 100, 30


def diagnose_argv() -> list[str]:
    script = Path(sys.executable).with_name("diagnose")
    return [str(script)] if script.exists() else [sys.executable, "-m", "diagnose"]


class Pane:
    def __init__(self, tmp_path: Path):
        self.socket = f"diagnose-test-{os.getpid()}-{tmp_path.name}"

    def tmux(self, *args: str) -> str:
        # the pane inherits the server's environment; a COLUMNS/LINES left by the test run
        # would pin the app's idea of the terminal size
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        proc = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True, timeout=10, env=env
        )
        return proc.stdout

    def capture(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "tui")

    def wait_for_results(self, timeout: float = 60) -> str:
        """The results screen drawn at the pane's full size (the footer on its last row)."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.capture()
            lines = screen.splitlines()
            if "Causes" in screen and len(lines) == HEIGHT and "q Quit" in lines[-1]:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"no results screen after {timeout:g}s\n--- screen ---\n{screen}")

    def kill(self) -> None:
        self.tmux("kill-server")


@pytest.mark.parametrize(("snapshot", "exit_code"), [("devices_duplicate-gpu", 1), ("healthy", 0)])
def test_diagnose_in_a_terminal(tmp_path, snapshot, exit_code):
    path = SNAPSHOTS / f"{snapshot}.json"
    report = evaluate(load_snapshot(path), load_kb())
    assert report.has_error == bool(exit_code), "the fixture no longer means what this test expects"
    status = tmp_path / "status"
    command = f"{shlex.join([*diagnose_argv(), '--from', str(path)])}; echo $? > {shlex.quote(str(status))}"
    pane = Pane(tmp_path)
    try:
        pane.tmux(
            "new-session", "-d", "-s", "tui", "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(tmp_path),
            "-e", "TERM=xterm-256color", "sh", "-c", command,
        )
        screen = pane.wait_for_results()
        if report.findings:
            for rank, finding in enumerate(report.findings[:3], 1):
                assert f"{rank}. " in screen and finding.title[:30] in screen, screen
        else:
            assert "No likely cause found" in screen
        for key in FOOTER_KEYS:
            assert key in screen, f"footer key {key!r} missing:\n{screen}"
        if exit_code and os.environ.get("DIAGNOSE_WRITE_SCREEN"):
            Path(os.environ["DIAGNOSE_WRITE_SCREEN"]).write_text(screen.rstrip() + "\n", encoding="utf-8")

        pane.tmux("send-keys", "-t", "tui", "q")
        deadline = time.monotonic() + 20
        while not (status.exists() and status.read_text().endswith("\n")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status.exists(), "diagnose did not exit after q"
        assert int(status.read_text()) == exit_code
    finally:
        pane.kill()
