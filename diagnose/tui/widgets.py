"""The pieces of the results screen; each renders a part of the Report and decides nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import OptionList, Static, Tree
from textual.widgets.option_list import Option

from diagnose.render import SEVERITY_STYLE, _value, machine_summary
from diagnose.report import EvidenceItem, Finding, RenderedFix, Report, RuleOutcome
from probes.facts import Cluster, Facts, ProbeError, Skipped

# fired or not: a mark and a word, so the table reads the same without colour
EVIDENCE_MARK = {
    "fired": ("✓", "fired", "green"),
    "not_fired": ("·", "no", "dim"),
    "unknown": ("?", "unknown", "yellow"),
}
MAX_TREE_ITEMS = 100


def severity_text(severity: str) -> Text:
    return Text(f"{severity:<8}", style=SEVERITY_STYLE.get(severity, ""))


def shorten(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class MachineHeader(Static):
    """The tool, the verdict counts and the machine at a glance, wrapped to the width."""

    def __init__(self, report: Report) -> None:
        super().__init__(id="machine")
        self.report = report

    def render(self) -> Text:
        s = self.report.summary
        text = Text.assemble(
            (f"lightning-diagnose {self.report.tool.get('version', '')}", "bold"),
            "  ",
            (f"{s.errors} error(s)", SEVERITY_STYLE["error"] if s.errors else "dim"),
            ", ",
            (f"{s.warnings} warning(s)", SEVERITY_STYLE["warning"] if s.warnings else "dim"),
            ", ",
            (f"{s.infos} info", "dim"),
            (f" from {s.rules} rules", "dim"),
            "\n",
        )
        for i, (label, value) in enumerate(machine_summary(self.report)):
            text.append(" · " if i else "", style="dim")
            text.append(f"{label} ", style="dim")
            text.append(value)
        return text


def matches(needle: str, *fields: str) -> bool:
    return not needle or needle.lower() in " ".join(fields).lower()


def cause_row(rank: int, finding: Finding) -> Table:
    """Rank, severity and confidence in fixed columns; a long title wraps under itself."""
    row = Table.grid(padding=(0, 1))
    row.add_column(no_wrap=True)
    row.add_column(ratio=1)
    row.add_row(
        Text.assemble(
            (f"{rank:>2}.", "bold"), " ", severity_text(finding.severity), (f"{finding.confidence:<6}", "dim")
        ),
        finding.title,
    )
    return row


class CauseList(OptionList):
    """The ranked findings; the option id is the rule id, the rank stays the engine's."""

    def show(self, findings: Sequence[Finding], needle: str = "") -> int:
        """Show the findings that match; returns how many."""
        highlighted = self.highlighted_option.id if self.highlighted_option else None
        options = [
            Option(cause_row(rank, f), id=f.id)
            for rank, f in enumerate(findings, 1)
            if matches(needle, f.id, f.title, f.severity, f.confidence)
        ]
        self.set_options(options)
        ids = [o.id for o in options]
        if ids:
            self.highlighted = ids.index(highlighted) if highlighted in ids else 0
        return len(ids)


def evidence_table(items: Iterable[EvidenceItem]) -> Table:
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False, header_style="bold")
    table.add_column("", no_wrap=True, width=9)
    table.add_column("evidence", ratio=3)
    table.add_column("observed", ratio=2)
    table.add_column("expected", ratio=2)
    for item in items:
        mark, word, style = EVIDENCE_MARK[item.state]
        what = item.label or (item.what if item.kind == "fact" else f"{item.kind}: {item.what}")
        table.add_row(
            Text(f"{mark} {word}", style=style), shorten(what, 60), _value(item.observed), shorten(item.expected, 40)
        )
        for line in item.lines:
            table.add_row("", Text(shorten(line, 120), style="dim"), "", "")
    return table


class FixView(Static, can_focus=True):
    """One fix; focus it (Tab or click) and press c to copy its snippet."""

    def __init__(self, fix: RenderedFix, number: int, count: int) -> None:
        super().__init__(classes="fix")
        self.fix = fix
        self.number, self.count = number, count

    def render(self) -> Group:
        title = Text.assemble(
            (f"Fix {self.number}/{self.count}: ", "bold"), self.fix.title, (f"  [{self.fix.kind}]", "dim")
        )
        code = Syntax(
            self.fix.snippet.rstrip(), self.fix.language, theme="ansi_dark", word_wrap=True, background_color="default"
        )
        return Group(title, code)


class CauseDetail(VerticalScroll):
    """The selected finding: why, the evidence checked, the fixes to paste, the references."""

    finding: reactive[Finding | None] = reactive(None, recompose=True)
    rank: int = 0

    def compose(self) -> ComposeResult:
        f = self.finding
        if f is None:
            yield Static("Select a cause to see why it ranks and how to fix it.", classes="hint")
            return
        yield Static(
            Text.assemble(
                (f"{self.rank}. {f.title}\n", "bold"),
                (f.severity, SEVERITY_STYLE[f.severity]),
                f" · {f.confidence} confidence · score {f.score:g} · ",
                (f.id, "dim"),
            ),
            classes="title",
        )
        yield Static(f.explain, classes="explain", markup=False)
        if f.gate:
            yield Static("Applies when", classes="heading")
            yield Static(evidence_table(f.gate))
        yield Static("Evidence", classes="heading")
        yield Static(evidence_table(f.evidence))
        if f.fixes:
            yield Static("Fixes  (Tab to a fix, c copies it)", classes="heading")
            for number, fix in enumerate(f.fixes, 1):
                yield FixView(fix, number, len(f.fixes))
        if f.references:
            yield Static("References", classes="heading")
            yield Static(
                Text("\n").join(Text(ref, style=f"link {ref}" if "://" in ref else "") for ref in f.references)
            )


def outcome_table(outcomes: Sequence[RuleOutcome], needle: str, empty: str) -> Table | Text:
    shown = [o for o in outcomes if matches(needle, o.id, o.title, o.severity, o.reason)]
    if not shown:
        return Text(empty if not outcomes else f"Nothing matches '{needle}'.", style="dim")
    table = Table(box=None, padding=(0, 1), expand=True, header_style="bold")
    table.add_column("rule", ratio=2)
    table.add_column("severity", no_wrap=True, width=8)
    table.add_column("why", ratio=3)
    for o in shown:
        why = Text(o.reason)
        if o.missing:
            why.append("\nneeds: " + ", ".join(shorten(m, 40) for m in o.missing), style="dim")
        table.add_row(Text.assemble((o.id, "bold"), "\n", o.title), severity_text(o.severity), why)
    return table


class OutcomeList(VerticalScroll):
    """Rules that are not findings (possible, not checked, ruled out), each with its reason."""

    needle: reactive[str] = reactive("")

    def __init__(self, outcomes: Sequence[RuleOutcome], empty: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outcomes, self.empty = outcomes, empty

    def compose(self) -> ComposeResult:
        yield Static(outcome_table(self.outcomes, self.needle, self.empty))

    def watch_needle(self) -> None:
        if self.is_mounted:
            self.query_one(Static).update(outcome_table(self.outcomes, self.needle, self.empty))


def probe_table(errors: Sequence[ProbeError], skipped: Sequence[Skipped]) -> Table | Text:
    if not errors and not skipped:
        return Text("Every probe ran; nothing was skipped.", style="dim")
    table = Table(box=None, padding=(0, 1), expand=True, header_style="bold")
    table.add_column("", no_wrap=True, width=8)
    table.add_column("what", ratio=1)
    table.add_column("message", ratio=3)
    for e in errors:
        table.add_row(Text("error", style=SEVERITY_STYLE["error"]), e.probe, e.message)
    for s in skipped:
        table.add_row(Text("skipped", style="yellow"), s.what, s.reason)
    return table


def microtest_table(rows: Sequence[tuple[str, str, str]]) -> Table | Text:
    """The micro-tests as render.microtest_rows gives them: test, status, detail."""
    if not rows:
        return Text("No micro-test ran (offline input, or --microtests none).", style="dim")
    table = Table(box=None, padding=(0, 1), expand=True, header_style="bold", title="micro-tests", title_justify="left")
    table.add_column("status", no_wrap=True, width=9)
    table.add_column("test", ratio=1)
    table.add_column("detail", ratio=3)
    for name, status, detail in rows:
        style = {"passed": "green", "skipped": "yellow"}.get(status, SEVERITY_STYLE["error"])
        table.add_row(Text(status, style=style), name, detail)
    return table


def cluster_view(cluster: Cluster) -> Group:
    """The job at a glance, then one table per node: the rows ``diagnose cluster`` prints."""
    from diagnose.clusterview import job_summary, node_rows, node_title

    def table(title: str, rows: list[tuple[str, str]]) -> Table:
        out = Table(
            box=None,
            padding=(0, 1),
            expand=True,
            show_header=False,
            title=title,
            title_justify="left",
            title_style="bold",
        )
        out.add_column("", no_wrap=True, style="bold")
        out.add_column("", ratio=1)
        for key, value in rows:
            out.add_row(key, value)
        return out

    return Group(
        table("Cluster", job_summary(cluster)),
        *(table(f"Node {node_title(n)}", node_rows(n, cluster)) for n in cluster.nodes),
    )


def _label(key: str, value: Any) -> Text:
    if value is None:
        return Text.assemble(f"{key}: ", ("unknown", "dim italic"))
    return Text.assemble(f"{key}: ", (str(value), "bold"))


def _add(node: Any, key: str, value: Any) -> None:
    if isinstance(value, dict) and value:
        branch = node.add(key)
        for k, v in value.items():
            _add(branch, str(k), v)
    elif isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        branch = node.add(f"{key} ({len(value)})")
        for i, v in enumerate(value[:MAX_TREE_ITEMS]):
            _add(branch, str(i), v)
        if len(value) > MAX_TREE_ITEMS:
            branch.add_leaf(Text(f"… {len(value) - MAX_TREE_ITEMS} more (export JSON for all)", style="dim"))
    elif isinstance(value, (dict, list)):
        node.add_leaf(_label(key, ", ".join(map(str, value)) if value else "(none)"))
    else:
        node.add_leaf(_label(key, value))


def facts_tree(facts: Facts) -> Tree:
    """Every section as a branch, with the derived values rules use next to the raw ones."""
    tree: Tree[None] = Tree("facts", id="facts-tree")
    tree.root.expand()
    data = facts.model_dump(mode="json")
    for key, value in data.items():
        section = getattr(facts, key)
        derived = getattr(type(section), "derived", ())
        if isinstance(value, dict) and derived:
            value = {**value, **{f"{name} (derived)": getattr(section, name) for name in derived}}
        _add(tree.root, key, value)
    return tree
