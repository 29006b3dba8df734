"""The results screen: the machine, the ranked causes with their detail, and the rest of the Report."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, OptionList, Static, TabbedContent, TabPane, Tabs

from diagnose.render import microtest_rows
from diagnose.report import Report
from diagnose.tui.help import HelpScreen
from diagnose.tui.widgets import (
    CauseDetail,
    CauseList,
    FixView,
    MachineHeader,
    OutcomeList,
    cluster_view,
    facts_tree,
    microtest_table,
    probe_table,
)

TABS = ("causes", "possible", "not-checked", "ruled-out", "probes", "facts")
EXPORTS = {"json": "diagnose-report.json", "markdown": "diagnose-report.md"}


class ResultsScreen(Screen[None]):
    AUTO_FOCUS = None  # on_mount picks: the default would pick the hidden filter field
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [
        Binding("r", "rerun", "Re-run"),
        Binding("j", "export('json')", "Export JSON"),
        Binding("m", "export('markdown')", "Export MD"),
        Binding("slash", "filter", "Filter"),
        Binding("c", "copy_fix", "Copy fix"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "app.quit", "Quit"),
        Binding("escape", "back", "Back", show=False),
        *(Binding(str(n), f"tab('{tab}')", tab, show=False) for n, tab in enumerate(TABS, 1)),
    ]

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        r = self.report
        yield MachineHeader(r)
        yield Input(placeholder="filter by rule id, title or severity; Enter keeps it, Esc clears", id="filter")
        with TabbedContent(initial="causes"):
            with TabPane(f"Causes {len(r.findings)}", id="causes"):
                if r.findings:
                    with Container(id="causes-body"):
                        yield CauseList(id="cause-list")
                        yield CauseDetail(id="detail")
                else:
                    yield Static(
                        "No likely cause found: nothing in the rule base fired on these facts.\n"
                        "See the other tabs for what could not be checked and why.",
                        id="no-causes",
                    )
            with TabPane(f"Possible {len(r.possible)}", id="possible"):
                yield OutcomeList(r.possible, "No rule is left half-confirmed.")
            with TabPane(f"Not checked {len(r.not_checked)}", id="not-checked"):
                yield OutcomeList(r.not_checked, "Every rule could be checked.")
            with TabPane(f"Ruled out {len(r.ruled_out)}", id="ruled-out"):
                yield OutcomeList(r.ruled_out, "No rule was ruled out.")
            with TabPane(f"Probes {len(r.probe_errors) + len(r.skipped)}", id="probes"):
                with VerticalScroll():
                    yield Static(probe_table(r.probe_errors, r.skipped))
                    yield Static(microtest_table(microtest_rows(r)), id="microtests")
            if r.facts.cluster is not None:
                with TabPane(f"Nodes {len(r.facts.cluster.nodes)}", id="nodes"), VerticalScroll():
                    yield Static(cluster_view(r.facts.cluster), id="cluster")
            with TabPane("Facts", id="facts"):
                yield facts_tree(r.facts)
        yield Footer()

    def on_mount(self) -> None:
        if self.report.findings:
            causes = self.query_one(CauseList)
            causes.show(self.report.findings)
            causes.focus()
        else:
            self.query_one(Tabs).focus()

    # --- the causes list drives the detail pane ---------------------------------------------

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        detail = self.query_one(CauseDetail)
        rank, finding = next((i, f) for i, f in enumerate(self.report.findings, 1) if f.id == event.option.id)
        detail.rank = rank
        detail.finding = finding
        detail.scroll_home(animate=False)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.query_one(CauseDetail).focus()

    # --- actions ------------------------------------------------------------------------------

    def action_rerun(self) -> None:
        if self.app.can_rerun:
            self.app.start_run()
        else:
            self.notify("Opened on a fixed report: there is nothing to re-run.", severity="warning")

    def action_export(self, fmt: str) -> None:
        from diagnose.clusterview import render_cluster

        path = Path.cwd() / EXPORTS[fmt]
        try:
            path.write_text(render_cluster(self.report, fmt), encoding="utf-8")
        except OSError as exc:
            self.notify(f"Cannot write {path}: {exc.strerror or exc}", severity="error", timeout=8)
            return
        self.notify(f"Wrote {path}", title=f"Exported {fmt}", timeout=8)

    def action_copy_fix(self) -> None:
        focused = self.focused
        if isinstance(focused, FixView):
            view = focused
        else:
            views = list(self.query(FixView))
            if not views:
                self.notify("No fix to copy here: select a cause first.", severity="warning")
                return
            view = views[0]
        self.app.copy_to_clipboard(view.fix.snippet)
        self.notify(f"Copied fix {view.number}: {view.fix.title}", title="Clipboard")

    def action_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.display = True
        field.focus()

    def action_back(self) -> None:
        field = self.query_one("#filter", Input)
        if field.has_focus or field.display:
            field.value = ""
            field.display = False
        if self.report.findings and self.query_one(TabbedContent).active == "causes":
            self.query_one(CauseList).focus()

    def action_tab(self, tab: str) -> None:
        tabs = self.query_one(TabbedContent)
        # a focused widget in the pane being hidden would hand focus to its neighbour, and
        # TabbedContent switches back to whichever pane holds the focus
        self.set_focus(None)
        tabs.active = tab
        target = next((w for w in tabs.get_pane(tab).query("*") if w.can_focus), None)
        if target is not None:
            target.focus()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    # --- filtering ----------------------------------------------------------------------------

    def on_input_changed(self, event: Input.Changed) -> None:
        needle = event.value.strip()
        if self.report.findings and not self.query_one(CauseList).show(self.report.findings, needle):
            self.query_one(CauseDetail).finding = None
        for outcomes in self.query(OutcomeList):
            outcomes.needle = needle

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            event.input.display = False
        if self.report.findings:
            self.query_one(CauseList).focus()
