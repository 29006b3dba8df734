"""README's two set-up commands stay true: CI runs the test one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    section = ROOT.joinpath("README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_exactly_two_setup_commands():
    run, test = readme_commands()
    assert run.endswith(".venv/bin/diagnose") and "torch==2.13.0" in run
    assert "pytest" in test and "torch==2.13.0" in test


def test_ci_runs_readme_test_command():
    assert readme_commands()[1] in ROOT.joinpath(".ci", "run").read_text().splitlines()


def test_no_unpinned_torch_anywhere():
    for command in readme_commands() + ROOT.joinpath(".ci", "run").read_text().splitlines():
        assert not re.search(r"\btorch(?![=\w-])", command.replace("torch==2.13.0", "")), command
