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
from probes.snapshot import load_snapshot
from tests import pythonpath

from .conftest import SNAPSHOTS

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")

FOOTER_KEYS = ["r Re-run", "j Export JSON", "m Export MD", "/ Filter", "c Copy fix", "? Help", "q Quit"]
WIDTH, HEIGHT = 100, 30


def diagnose_argv() -> list[str]:
    script = Path(sys.executable).with_name("diagnose")
    if script.exists():
        return [str(script)]
    # not installed next to this interpreter: run the checkout itself (the pane starts elsewhere)
    return ["env", f"PYTHONPATH={pythonpath(Path(__file__).resolve().parents[3])}", sys.executable, "-m", "diagnose"]


class Pane:
    """`diagnose ARGS` in a detached tmux pane; its exit status lands in a file, and the pane
    stays open afterwards to show what it printed once the TUI was gone."""

    def __init__(self, tmp_path: Path):
        self.socket = f"diagnose-test-{os.getpid()}-{tmp_path.name}"
        self.status = tmp_path / "status"
        self.cwd = tmp_path

    def tmux(self, *args: str) -> str:
        # the pane inherits the server's environment; a COLUMNS/LINES left by the test run
        # would pin the app's idea of the terminal size
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        proc = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True, timeout=10, env=env
        )
        return proc.stdout

    def start(self, *args: str, stderr: Path | None = None) -> None:
        q = shlex.quote
        redirect = f" 2> {q(str(stderr))}" if stderr else ""
        command = f"{shlex.join([*diagnose_argv(), *args])}{redirect}; echo $? > {q(str(self.status))}; sleep 60"
        self.tmux(
            "new-session",
            "-d",
            "-s",
            "tui",
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            "-c",
            str(self.cwd),
            "-e",
            "TERM=xterm-256color",
            "sh",
            "-c",
            command,
        )

    def capture(self, *flags: str) -> str:
        return self.tmux("capture-pane", "-p", *flags, "-t", "tui")

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

    def wait_for_exit(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while not (self.status.exists() and self.status.read_text().endswith("\n")):
            assert time.monotonic() < deadline, f"diagnose did not exit\n--- screen ---\n{self.capture()}"
            time.sleep(0.1)
        return int(self.status.read_text())

    def kill(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def pane(tmp_path):
    pane = Pane(tmp_path)
    yield pane
    pane.kill()


@pytest.mark.parametrize(("snapshot", "exit_code"), [("devices_duplicate-gpu", 1), ("healthy", 0)])
def test_diagnose_in_a_terminal(pane, snapshot, exit_code):
    path = SNAPSHOTS / f"{snapshot}.json"
    report = evaluate(load_snapshot(path), load_kb())
    assert report.has_error == bool(exit_code), "the fixture no longer means what this test expects"
    pane.start("--from", str(path))
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
    assert pane.wait_for_exit() == exit_code
    assert pane.capture().strip() == "", "nothing is printed once the TUI closes"


def test_bad_snapshot_in_a_terminal_is_one_line_and_exit_2(pane, tmp_path):
    bad = tmp_path / "facts.json"
    bad.write_text("{not json")
    pane.start("--from", str(bad))
    assert pane.wait_for_exit() == 2
    [line] = pane.capture("-J").strip().splitlines()  # -J: one line however the pane wrapped it
    assert line.startswith(f"diagnose: error: {bad}:1:2: invalid JSON"), line


def test_stderr_redirected_prints_the_text_report(pane, tmp_path):
    """Textual draws on stderr, so with stderr in a file the TUI would be invisible."""
    pane.start("--from", str(SNAPSHOTS / "devices_duplicate-gpu.json"), stderr=tmp_path / "err")
    assert pane.wait_for_exit() == 1
    assert "possible but unconfirmed" in pane.capture("-J")  # the text report's last lines
