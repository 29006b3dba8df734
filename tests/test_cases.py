"""The ratchet: real bug reports through the real CLI (bench/cases.py).

Fails on any crash, on a malformed case, and when the share of cases whose cause ranks in
the top 3 falls below ``TOP3_FLOOR`` (bench/cases.py, quoted in README). Raise the floor when
the KB improves; never lower it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _bench_cases():
    spec = importlib.util.spec_from_file_location("bench_cases", ROOT / "bench" / "cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


cases = _bench_cases()
PATHS = cases.case_paths()


def test_there_are_cases():
    assert any(p.parent == cases.OWN_CASES for p in PATHS), "tests/cases/ holds this repository's own cases"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_case_is_well_formed(path):
    case = cases.load_case(path)
    assert case.source.startswith("https://github.com/"), "cite the public thread"
    assert case.log.strip() or case.env_report.strip()
    causes_file = cases.SHARED_CASES.parent / "causes.yaml"
    if causes_file.is_file():
        assert case.cause in yaml.safe_load(causes_file.read_text()), f"{case.cause} is not in causes.yaml"


def test_cases_through_the_cli():
    results = cases.run_all(PATHS)
    crashes = [f"{r.case.name}: {r.crash}" for r in results if r.crash]
    assert crashes == []
    first, top3, _ = cases.shares(results)
    misses = [f"{r.case.name}: expected {r.case.cause}, top {r.top}" for r in results if not r.rank or r.rank > 3]
    assert top3 >= cases.TOP3_FLOOR, f"top-3 share {top3:.0%} < floor {cases.TOP3_FLOOR:.0%}: {misses}"
