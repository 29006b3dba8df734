"""The Textual app: runs the gathering in a worker thread, then shows the Report.

The worker posts typed messages (a step's progress, the finished Report, or the failure)
back to the app; the screens never call probes or the engine themselves.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import App
from textual.message import Message

from diagnose.tui.results import ResultsScreen
from diagnose.tui.run_screen import RunScreen

if TYPE_CHECKING:
    from diagnose.kb import KB
    from diagnose.report import Report
    from probes.facts import Facts

Progress = Callable[[str, str, "str | None"], None]
Gather = Callable[[Progress], "Facts"]

RULES_STEP = "rules"


class StepUpdate(Message):
    """A probe, micro-test or the engine changed state (running, passed, failed, ...)."""

    def __init__(self, step: str, state: str, detail: str | None) -> None:
        super().__init__()
        self.step, self.state, self.detail = step, state, detail
        self.at = time.monotonic()


class ReportReady(Message):
    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report


class RunFailed(Message):
    """Gathering or evaluating raised: the app closes and ``run_tui`` re-raises it, so the
    CLI reports it as it would without the TUI (one line, exit 2 or 3)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


class DiagnoseApp(App[None]):
    CSS_PATH = "diagnose.tcss"
    TITLE = "lightning-diagnose"
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        *,
        report: Report | None = None,
        gather: Gather | None = None,
        kb: KB | None = None,
        steps: Sequence[str] = (),
    ) -> None:
        super().__init__()
        if report is None and (gather is None or kb is None):
            raise ValueError("give a report, or a gather callable and a kb")
        self.report = report
        self.error: BaseException | None = None
        self._gather = gather
        self._kb = kb
        self._steps = [*steps, RULES_STEP]
        # True from the start of a run until its thread returns (a cancelled Worker reports
        # finished at once, while its thread still runs)
        self._busy = False
        self._quitting = False

    @property
    def can_rerun(self) -> bool:
        return self._gather is not None

    def on_mount(self) -> None:
        if self.report is not None:
            self.push_screen(ResultsScreen(self.report))
        else:
            self.push_screen(RunScreen(self._steps))
            self._busy = True
            self._run()

    def start_run(self) -> None:
        """Re-run: gather and evaluate again, from the run screen."""
        self.switch_screen(RunScreen(self._steps))
        self._busy = True
        self._run()

    @property
    def running(self) -> bool:
        return self._busy

    async def action_quit(self) -> None:
        self._quitting = True
        if self.running:
            # The gatherer has no cancel; ending its child processes (probes, micro-test
            # ranks) makes each step fail fast, so the worker ends and nothing is left behind.
            self.notify("Stopping the running checks…")
            threading.Thread(target=_end_children_while, args=(lambda: self.running,), daemon=True).start()
        self.exit()

    @work(thread=True, exclusive=True, group="run", exit_on_error=False)
    def _run(self) -> None:
        from diagnose.engine import evaluate

        def progress(step: str, state: str, detail: str | None = None) -> None:
            self.post_message(StepUpdate(step, state, detail))

        try:
            facts = self._gather(progress)
            progress(RULES_STEP, "running")
            report = evaluate(facts, self._kb)
            progress(RULES_STEP, "passed", f"{len(report.findings)} likely cause(s) of {report.summary.rules} rules")
        except BaseException as exc:  # handed to run_tui, which re-raises it after the app closes
            self.post_message(RunFailed(exc))
            return
        finally:
            self._busy = False
        self.post_message(ReportReady(report))

    def on_step_update(self, message: StepUpdate) -> None:
        if isinstance(self.screen, RunScreen):
            self.screen.update_step(message.step, message.state, message.detail, message.at)

    # once the user has quit, a run cut short by it is neither a result nor an error
    def on_report_ready(self, message: ReportReady) -> None:
        if self._quitting:
            return
        self.report = message.report
        self.switch_screen(ResultsScreen(message.report))

    def on_run_failed(self, message: RunFailed) -> None:
        if self._quitting:
            return
        self.error = message.error
        self.exit()


def _end_children_while(running: Callable[[], bool], deadline_s: float = 30.0) -> None:
    """End this process's descendants (TERM, KILL a second later) until the run has ended."""
    import psutil

    from probes.proc import end

    me = psutil.Process()
    deadline = time.monotonic() + deadline_s
    while running() and time.monotonic() < deadline:
        end(me.children(recursive=True), grace=1.0)
        time.sleep(0.1)


def make_app(
    *,
    report: Report | None = None,
    gather: Gather | None = None,
    kb: KB | None = None,
    steps: Sequence[str] = (),
) -> DiagnoseApp:
    """The app as the CLI and the tests build it: a fixed report, or a way to gather facts."""
    return DiagnoseApp(report=report, gather=gather, kb=kb, steps=steps)


def planned_steps(args: argparse.Namespace) -> list[str]:
    """The rows the run screen starts with; steps it was not told about are added as they report."""
    from diagnose.gather import is_offline, microtest_names
    from probes.facts import MicroTests, Section

    if args.snapshot:
        return ["snapshot"]
    if is_offline(args):
        return ["evidence"]
    from probes.collect import STEPS

    tests = microtest_names(args.microtests, False)
    if tests is None:
        tests = [name for name in MicroTests.model_fields if name not in Section.model_fields]
    return [*STEPS, *tests]


def cli_gather(args: argparse.Namespace, steps: Sequence[str], kb: KB | None = None) -> Gather:
    """gather_facts for these args; reading saved evidence reports itself as one step."""
    from diagnose.gather import gather_facts, is_offline

    def gather(progress: Progress) -> Facts:
        if not is_offline(args):
            return gather_facts(args, progress, kb)
        step = steps[0]
        sources = [args.snapshot] if args.snapshot else [*args.report, *args.log]
        progress(step, "running", ", ".join(str(Path(s).name) for s in sources if s))
        facts = gather_facts(args, progress, kb)
        progress(step, "passed", ", ".join(facts.inputs) or None)
        return facts

    return gather


def run_tui(args: argparse.Namespace, kb: KB) -> int:
    """Show the diagnosis until the user quits; the exit code follows the CLI contract, for
    the last diagnosis shown (quitting during a re-run keeps the one before)."""
    from diagnose.contract import Exit

    steps = planned_steps(args)
    app = make_app(gather=cli_gather(args, steps, kb), kb=kb, steps=steps)
    app.run()
    if app.error is not None:
        raise app.error
    if app.return_code:  # Textual caught a crash and has already shown it
        return Exit.INTERNAL
    if app.report is None:
        raise KeyboardInterrupt  # quit before the diagnosis was ready
    return Exit.FINDINGS if app.report.has_error else Exit.OK
