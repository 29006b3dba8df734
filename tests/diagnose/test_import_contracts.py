"""The layer contracts of pyproject.toml ([tool.importlinter]) hold, and a broken one fails.

import-linter reads the source (grimp parses it; nothing is imported), so the check is the
same with or without torch installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pythonpath

pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def _lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT], cwd=tree, env={"PYTHONPATH": pythonpath(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_contracts_hold():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("probes/runner.py", "import diagnose.engine", "probes never imports diagnose"),
        ("diagnose/engine.py", "import diagnose.cli", "nothing imports the command line"),
        ("diagnose/render.py", "import torch", "the core never imports"),
        ("diagnose/contract.py", "import diagnose.gather", "commands over option gathering"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    for part in ("diagnose", "probes"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "kb"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    result = _lint(tmp_path)
    assert result.returncode == 1
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout


def test_a_cycle_breaks_the_acyclic_contract(tmp_path):
    for part in ("diagnose", "probes"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__", "kb"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    errors = tmp_path / "probes/microtests/errors.py"  # a leaf today: importing the runner closes a loop
    errors.write_text(errors.read_text(encoding="utf-8") + "\nfrom probes.microtests import runner\n", encoding="utf-8")
    result = _lint(tmp_path)
    assert result.returncode == 1 and "no import cycles" in result.stdout.split("Broken contracts", 1)[-1], (
        result.stdout
    )
