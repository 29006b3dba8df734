"""Reports for the TUI tests, from the shared snapshot fixtures.

The rule base is a fixed list of shipped rule files rather than all of kb/, so that adding a
rule elsewhere does not redraw every golden screen here; a change to one of these rules does,
and `pytest --snapshot-update` takes it.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from diagnose.engine import evaluate
from diagnose.kb import KB, load_rule_file, shipped_kb_dir
from diagnose.report import Report
from probes.facts import load_snapshot

SNAPSHOTS = Path(__file__).parents[2] / "fixtures" / "snapshots"
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
