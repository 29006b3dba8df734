"""Reproductions of the hostile-user report that no other test replays: a secret on the job's
command line under `diagnose run`, an 80 KB log line inside a snapshot, SIGTERM during the
micro-tests, and `kb new` given a capitalised id or a read-only folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes.facts import Facts, LogLine
from probes.snapshot import dump_snapshot
from tests import pythonpath

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("Hunter2Hunter", "0123456789abcdef0123456789abcdef01234567")


def diagnose(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath(ROOT), **(env or {})},
    )


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_diagnose_run_never_shows_the_jobs_secret_arguments(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "run"
    job = [
        sys.executable,
        "-c",
        "import sys; print('step 1'); sys.exit(1)",
        "--password",
        SECRETS[0],
        "--wandb-key",
        SECRETS[1],
    ]
    proc = diagnose("run", "--format", fmt, "--out", str(out), "--hang-after", "30", "--", *job, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the job failed; diagnose itself did not
    saved = {p.name: p.read_text(encoding="utf-8", errors="replace") for p in out.iterdir() if p.is_file()}
    assert {"facts.json", "report.json"} <= set(saved)
    for where, text in {"stdout": proc.stdout, "stderr": proc.stderr, **saved}.items():
        assert not [s for s in SECRETS if s in text], where
    assert "--password" in proc.stdout  # the command line is shown, its value redacted


def test_an_80_kb_log_line_in_a_snapshot_is_diagnosed(tmp_path: Path) -> None:
    facts = Facts()
    facts.log.sources = ["train.log"]
    facts.log.lines = [
        LogLine(no=1, text="RuntimeError: NCCL error " + "x" * 80_000),
        LogLine(no=2, text="CUDA out of memory. " + "7" * 4060),
    ]
    facts.log.signatures = []
    snapshot = tmp_path / "facts.json"
    snapshot.write_text(dump_snapshot(facts), encoding="utf-8")
    proc = diagnose("--from", str(snapshot), "--json", timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["facts"]["log"]["lines"]


def test_sigterm_during_the_microtests_removes_their_folders_and_exits_143(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": pythonpath(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "diagnose", "--json", "--microtests", "all_reduce"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("diagnose-microtest-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None:
            pytest.skip("the micro-tests finished before they could be interrupted")
        assert list(tmp_path.glob("diagnose-microtest-*")), "the micro-tests never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert err.strip(), "a message says why it stopped"
    assert list(tmp_path.glob("diagnose-microtest-*")) == []


def test_kb_new_with_a_capitalised_id_gives_a_rule_that_loads_or_one_line(tmp_path: Path) -> None:
    proc = diagnose("kb", "new", "Area.Name", "--dir", str(tmp_path), timeout=60)
    if proc.returncode == 0:
        lint = diagnose("kb", "lint", "--kb", str(tmp_path), timeout=60)
        assert lint.returncode == 0, lint.stderr
    else:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("where", ["missing/deeper", "/proc/version/kb"])
def test_kb_new_into_a_folder_it_cannot_write_is_one_line(tmp_path: Path, where: str) -> None:
    folder = tmp_path / where if not where.startswith("/") else Path(where)
    proc = diagnose("kb", "new", "area.name", "--dir", str(folder), timeout=60)
    if proc.returncode == 0:  # a missing folder is created: the rule it wrote must load
        assert diagnose("kb", "lint", "--kb", str(folder), timeout=60).returncode == 0
    else:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert str(folder) in proc.stderr
