"""Reports for the TUI tests.

The pilot tests evaluate the shared snapshot fixtures against a fixed list of shipped rule
files (not all of kb/, so a new rule elsewhere does not change what they navigate). The golden
screens render saved reports (tests/fixtures/tui/*.report.json, written by
`diagnose --json --from tests/fixtures/snapshots/NAME.json`), so editing a rule's wording does
not redraw them: they change only when the TUI or the Report model does.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from diagnose.engine import evaluate
from diagnose.kb import KB, load_rule_file, shipped_kb_dir
from diagnose.report import Report
from probes.snapshot import load_snapshot

FIXTURES = Path(__file__).parents[2] / "fixtures"
SNAPSHOTS = FIXTURES / "snapshots"
PINNED_RULES = (
    "ddp/checkpoint-on-gpu0",
    "devices/cuda-visible-devices",
    "devices/duplicate-gpu",
    "devices/hook-device-mismatch",
    "env/mixed-gpu-models",
    "nccl/p2p-broken",
    "nccl/shm-too-small",
    "startup/staggered-init-hang",
    "sync/barrier-divergence",
)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` pilot tests on a fresh event loop, without an asyncio plugin."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True


@pytest.fixture(scope="session")
def kb() -> KB:
    root = shipped_kb_dir()
    return KB(rules=[load_rule_file(root / f"{name}.yaml", root) for name in PINNED_RULES], sources=[root])


@pytest.fixture(scope="session")
def report_for(kb):
    def make(name: str) -> Report:
        return evaluate(load_snapshot(SNAPSHOTS / f"{name}.json"), kb)

    return make


@pytest.fixture(scope="session")
def duplicate_gpu(report_for) -> Report:
    return report_for("devices_duplicate-gpu")


@pytest.fixture(scope="session")
def saved_report():
    def load(name: str) -> Report:
        return Report.model_validate_json((FIXTURES / "tui" / f"{name}.report.json").read_text(encoding="utf-8"))

    return load
