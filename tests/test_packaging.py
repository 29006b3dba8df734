"""The built wheel carries the rule base: an installed diagnose works from any directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import pythonpath

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_kb_and_runs_elsewhere(tmp_path):
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # the build backend comes with the test extra: no index is needed (machines without one run the suite too)
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)]
    subprocess.run(build, check=True, timeout=300)
    wheel = next(wheels.glob("lightning_diagnose-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    code = "import sys, diagnose.kb as k; kb = k.load_kb(); print(k.shipped_kb_dir()); print(len(kb.rules))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": pythonpath(site), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    kb_dir, count = proc.stdout.split()
    assert kb_dir == str(site / "diagnose" / "kb") and int(count) >= 40
