"""The TUI driven by Textual's pilot: the run screen, navigating causes, copy, export, filter, quit."""

from __future__ import annotations

import argparse
import threading

import pytest
from textual.geometry import Region
from textual.widgets import TabbedContent, Tabs

from diagnose.cli import build_parser
from diagnose.contract import UsageError
from diagnose.render import render
from diagnose.tui import make_app
from diagnose.tui.app import planned_steps
from diagnose.tui.help import HelpScreen
from diagnose.tui.results import EXPORTS, ResultsScreen
from diagnose.tui.run_screen import RunScreen
from diagnose.tui.widgets import CauseDetail, CauseList, FixView, OutcomeList
from probes.facts import ProbeError, Skipped
from probes.snapshot import SnapshotError, load_snapshot

from .conftest import FIXTURES, SNAPSHOTS

SIZE = (80, 24)


def drawn(widget) -> str:
    """The text a widget draws, all of it (not only what is scrolled into view)."""
    return "\n".join(strip.text for strip in widget.render_lines(Region(0, 0, widget.size.width, widget.size.height)))


def detail_text(app) -> str:
    return "\n".join(drawn(s) for s in app.screen.query_one(CauseDetail).query("Static"))


async def test_opens_on_first_cause_and_navigates(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        causes = app.screen.query_one(CauseList)
        detail = app.screen.query_one(CauseDetail)
        assert isinstance(app.screen, ResultsScreen) and causes.has_focus
        assert [causes.get_option_at_index(i).id for i in range(causes.option_count)] == [
            f.id for f in duplicate_gpu.findings
        ]
        assert detail.finding.id == duplicate_gpu.findings[0].id

        await pilot.press("down")
        await pilot.pause()
        second = duplicate_gpu.findings[1]
        assert detail.finding.id == second.id and detail.rank == 2
        assert " ".join(second.explain.split()) in " ".join(detail_text(app).split())

        await pilot.press("enter")  # open: focus moves into the detail to scroll it
        await pilot.pause()
        assert detail.has_focus


async def test_click_selects_a_cause(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        causes = app.screen.query_one(CauseList)
        last = len(duplicate_gpu.findings) - 1
        # each finding is one row at 80 columns except a wrapped title; click the last row drawn
        await pilot.click(CauseList, offset=(10, causes.virtual_size.height - 1))
        await pilot.pause()
        assert app.screen.query_one(CauseDetail).finding.id == duplicate_gpu.findings[last].id


async def test_copy_first_fix_then_focused_fix(duplicate_gpu):
    fixes = duplicate_gpu.findings[0].fixes
    assert len(fixes) >= 2
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("c")
        assert app.clipboard == fixes[0].snippet
        views = list(app.screen.query(FixView))
        views[1].focus()
        await pilot.press("c")
        assert app.clipboard == fixes[1].snippet


@pytest.mark.parametrize("key, fmt", [("j", "json"), ("m", "markdown")])
async def test_export_writes_the_report_into_cwd(duplicate_gpu, tmp_path, monkeypatch, key, fmt):
    monkeypatch.chdir(tmp_path)
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press(key)
        await pilot.pause()
        written = tmp_path / EXPORTS[fmt]
        assert written.read_text(encoding="utf-8") == render(duplicate_gpu, fmt)
        assert any(str(written) in n.message for n in app._notifications)


async def test_export_failure_is_a_notification_not_a_crash(duplicate_gpu, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / EXPORTS["json"]).mkdir()  # a folder where the file should go
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("j")
        await pilot.pause()
        assert app.is_running
        assert [n.severity for n in app._notifications] == ["error"]


async def test_filter_narrows_causes_and_rule_lists(duplicate_gpu):
    target = duplicate_gpu.findings[-1]
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("slash", *target.id)
        await pilot.pause()
        causes = app.screen.query_one(CauseList)
        assert causes.option_count == 1 and causes.get_option_at_index(0).id == target.id
        assert app.screen.query_one(CauseDetail).finding.id == target.id
        assert all(o.needle == target.id for o in app.screen.query(OutcomeList))

        await pilot.press("escape")
        await pilot.pause()
        assert causes.option_count == len(duplicate_gpu.findings) and causes.has_focus


async def test_filter_with_no_match_clears_the_detail(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("slash", *"zzz-no-such-rule")
        await pilot.pause()
        assert app.screen.query_one(CauseList).option_count == 0
        assert app.screen.query_one(CauseDetail).finding is None


async def test_tabs_show_outcomes_probe_errors_and_facts(kb, tmp_path):
    from diagnose.engine import evaluate

    facts = load_snapshot(SNAPSHOTS / "devices_hook-device-mismatch.json")
    facts.errors.append(ProbeError(probe="gpus", message="nvml: driver not loaded"))
    facts.skipped.append(Skipped(what="micro-tests", reason="not requested (--microtests none)"))
    report = evaluate(facts, kb)
    assert report.ruled_out, "the fixture should rule some pinned rules out"
    app = make_app(report=report)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        ruled = app.screen.query_one("#ruled-out OutcomeList", OutcomeList)
        shown = drawn(ruled.query_one("Static"))
        assert ruled.display and all(o.id in shown for o in report.ruled_out)

        await pilot.press("5")
        await pilot.pause()
        probes = drawn(app.screen.query_one("#probes Static"))
        assert "nvml: driver not loaded" in probes and "not requested" in probes

        await pilot.press("6")
        await pilot.pause()
        tree = app.screen.query_one("#facts-tree")
        sections = [str(node.label) for node in tree.root.children]
        assert {"host", "packages", "torch", "gpus", "launcher", "log"} <= set(sections)
        gpus = next(node for node in tree.root.children if str(node.label) == "gpus")
        assert any(str(n.label).startswith("visible_duplicates (derived)") for n in gpus.children)


async def test_a_cluster_report_has_a_tab_with_every_node(kb):
    from diagnose.engine import evaluate

    facts = load_snapshot(FIXTURES / "cluster" / "two-nodes-torch-differs.json")
    app = make_app(report=evaluate(facts, kb))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        app.screen.query_one(TabbedContent).active = "nodes"
        await pilot.pause()
        shown = drawn(app.screen.query_one("#cluster"))
        node0, node1 = shown.index("Node node0"), shown.index("Node node1")
        assert "differs between nodes" in shown[node1:node0] and "rank 3" in shown[node0:]


async def test_a_single_machine_report_has_no_nodes_tab(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.screen.query("#nodes")


async def test_no_causes_says_so_and_copy_has_nothing(report_for):
    report = report_for("healthy")
    assert not report.findings
    app = make_app(report=report)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "No likely cause found" in drawn(app.screen.query_one("#no-causes"))
        await pilot.press("c")
        await pilot.pause()
        assert app.clipboard == "" and [n.severity for n in app._notifications] == ["warning"]


async def test_help_opens_and_closes(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ResultsScreen)


async def test_quit(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_fixed_report_has_nothing_to_rerun(duplicate_gpu):
    app = make_app(report=duplicate_gpu)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, ResultsScreen)
        assert [n.severity for n in app._notifications] == ["warning"]


def test_no_color_is_honoured(duplicate_gpu, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert make_app(report=duplicate_gpu).no_color
    monkeypatch.delenv("NO_COLOR")
    assert not make_app(report=duplicate_gpu).no_color


# --- gathering in the worker ------------------------------------------------------------------


class Gate:
    """A gather that reports a step, then waits until the test lets it finish."""

    def __init__(self, facts=None, error: BaseException | None = None):
        self.facts, self.error = facts, error
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, progress):
        self.calls += 1
        progress("host", "running", None)
        progress("host", "passed", "linux")
        progress("torch", "running", None)
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        progress("torch", "skipped", "not installed")
        return self.facts


def results_shown(app) -> bool:
    """The results screen is up and mounted to its tabs (quitting mid-mount trips Textual)."""
    return isinstance(app.screen, ResultsScreen) and any(tabs.active for tabs in app.screen.query(Tabs))


async def wait_for(pilot, condition, tries: int = 100):
    for _ in range(tries):
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not reached")


async def test_run_screen_shows_live_steps_then_results(kb):
    gate = Gate(load_snapshot(SNAPSHOTS / "devices_duplicate-gpu.json"))
    app = make_app(gather=gate, kb=kb, steps=["torch", "host", "gpus"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot, lambda: isinstance(app.screen, RunScreen) and app.screen._started.keys() >= {"host", "torch"}
        )
        screen = app.screen
        table = screen.query_one("#steps")
        assert str(table.get_cell("host", "state")) == "✓ passed"
        assert str(table.get_cell("torch", "state")) == "▶ running"
        assert str(table.get_cell("gpus", "state")) == "· pending"
        assert screen.query_one("#overall").progress == 1 and screen.query_one("#overall").total == 4

        gate.release.set()
        await wait_for(pilot, lambda: results_shown(app))
        assert app.report.summary.top == "devices.duplicate-gpu"
        await wait_for(pilot, lambda: app.screen.query_one(CauseDetail).finding is not None)
        assert app.screen.query_one(CauseDetail).finding.id == "devices.duplicate-gpu"


async def test_unplanned_step_gets_a_row(kb):
    gate = Gate(load_snapshot(SNAPSHOTS / "healthy.json"))
    app = make_app(gather=gate, kb=kb, steps=["gpus"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and "torch" in app.screen._started)
        table = app.screen.query_one("#steps")
        assert [str(table.get_cell_at((i, 1))) for i in range(table.row_count)] == ["gpus", "rules", "host", "torch"]
        gate.release.set()
        await wait_for(pilot, lambda: results_shown(app))


async def test_rerun_gathers_again(kb):
    gate = Gate(load_snapshot(SNAPSHOTS / "healthy.json"))
    gate.release.set()
    app = make_app(gather=gate, kb=kb, steps=[])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: results_shown(app))
        first = app.report
        await pilot.press("r")
        await wait_for(pilot, lambda: results_shown(app) and app.report is not first)
        assert gate.calls == 2


async def test_gather_error_closes_the_app_and_is_kept(kb):
    error = SnapshotError("facts.json:1:1: invalid JSON: Expecting value")
    gate = Gate(error=error)
    gate.release.set()
    app = make_app(gather=gate, kb=kb)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: not app.is_running)
    assert app.error is error and app.report is None


def test_make_app_needs_a_report_or_a_way_to_gather():
    with pytest.raises(ValueError):
        make_app()


# --- what the run screen plans from the command line ------------------------------------------


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_planned_steps():
    from probes.collect import STEPS

    assert planned_steps(args("--from", "x.json")) == ["snapshot"]
    assert planned_steps(args("--log", "train.log")) == ["evidence"]
    assert planned_steps(args("--microtests", "none")) == list(STEPS)
    assert planned_steps(args("--microtests", "barrier,all_reduce")) == [*STEPS, "barrier", "all_reduce"]
    everything = planned_steps(args())
    assert everything[: len(STEPS)] == list(STEPS) and "lightning_fit" in everything
    with pytest.raises(UsageError):
        planned_steps(args("--microtests", "nope"))


async def test_quit_during_a_run_ends_its_child_processes(kb):
    import subprocess
    import time

    import psutil

    started = threading.Event()

    def gather(progress):
        # like the micro-tests: one child process after another, each with a long deadline
        for step in ("rendezvous", "barrier", "all_reduce"):
            progress(step, "running", None)
            started.set()
            subprocess.run(["sleep", "30"], timeout=60, check=False)
            progress(step, "failed", "ended")
        return load_snapshot(SNAPSHOTS / "healthy.json")

    app = make_app(gather=gather, kb=kb, steps=["rendezvous", "barrier", "all_reduce"])
    t0 = time.monotonic()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: started.is_set() and psutil.Process().children())
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, tries=200)
    while app.running and time.monotonic() - t0 < 20:  # the gather thread ends on its own
        time.sleep(0.1)
    assert not app.running and app.report is None
    assert not psutil.Process().children(recursive=True)


async def test_probes_tab_lists_the_micro_tests(report_for):
    app = make_app(report=report_for("cpu-machine-live"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        text = drawn(app.screen.query_one("#microtests"))
        assert "rendezvous" in text and "all_reduce" in text and "busbw up to" in text
