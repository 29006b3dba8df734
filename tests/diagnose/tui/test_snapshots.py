"""Golden screens of the results for a fixed snapshot (pytest-textual-snapshot).

They render the saved reports of tests/fixtures/tui/ (see conftest). A change that redraws them
on purpose: `pytest tests/diagnose/tui --snapshot-update`, then look at the SVGs in
__snapshots__/ before committing them.
"""

from __future__ import annotations

import pytest

from diagnose.tui import make_app


@pytest.fixture
def duplicate_gpu(saved_report):
    return saved_report("devices_duplicate-gpu")


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_results_screen(snap_compare, duplicate_gpu, size):
    assert snap_compare(make_app(report=duplicate_gpu), terminal_size=size)


def test_results_screen_second_cause_opened(snap_compare, duplicate_gpu):
    assert snap_compare(make_app(report=duplicate_gpu), press=["down", "enter"], terminal_size=(100, 30))


def test_results_screen_no_color(snap_compare, duplicate_gpu, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(make_app(report=duplicate_gpu), terminal_size=(80, 24))


def test_no_causes(snap_compare, saved_report):
    assert snap_compare(make_app(report=saved_report("healthy")), terminal_size=(80, 24))
