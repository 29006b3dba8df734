"""The run screen: every probe and micro-test with its live state, and the overall progress."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static
from textual.widgets.data_table import ColumnKey

# state -> (mark, style); the word is always shown too, so NO_COLOR loses nothing
STATES = {
    "pending": ("·", "dim"),
    "running": ("▶", "bold"),
    "passed": ("✓", "green"),
    "failed": ("✗", "bold red"),
    "timed_out": ("⏱", "bold red"),
    "error": ("✗", "bold red"),
    "skipped": ("–", "yellow"),
}
FINAL = set(STATES) - {"pending", "running"}


def state_cell(state: str) -> Text:
    mark, style = STATES.get(state, ("?", "bold"))
    return Text(f"{mark} {state.replace('_', ' ')}", style=style)


class RunScreen(Screen[None]):
    BINDINGS = [Binding("q", "app.quit", "Quit")]

    def __init__(self, steps: Sequence[str]) -> None:
        super().__init__()
        self._steps = list(steps)
        self._started: dict[str, float] = {}
        self._finished: set[str] = set()

    def compose(self) -> ComposeResult:
        with Vertical(id="run"):
            yield Static("[b]lightning-diagnose[/b]  gathering facts and running checks…", id="run-title")
            yield DataTable(id="steps", cursor_type="none", zebra_stripes=False)
            yield ProgressBar(total=len(self._steps), show_eta=False, id="overall")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#steps", DataTable)
        table.add_column("state", width=11, key="state")
        table.add_column("step", width=14, key="step")
        table.add_column("time", width=6, key="time")
        table.add_column("detail", width=20, key="detail")
        for step in self._steps:
            self._add_row(table, step)
        self.set_interval(0.25, self._tick)

    def on_resize(self) -> None:
        """The detail column takes what is left, so a long detail is cut, not scrolled."""
        table = self.query_one("#steps", DataTable)
        fixed = sum(c.get_render_width(table) for key, c in table.columns.items() if key != "detail")
        detail = table.columns[ColumnKey("detail")]
        detail.width = max(10, table.scrollable_content_region.width - fixed - 2 * table.cell_padding)
        table.refresh()

    def _add_row(self, table: DataTable, step: str) -> None:
        table.add_row(state_cell("pending"), step, "", "", key=step)

    def update_step(self, step: str, state: str, detail: str | None, at: float) -> None:
        table = self.query_one("#steps", DataTable)
        if step not in self._steps:
            self._steps.append(step)
            self._add_row(table, step)
            bar = self.query_one("#overall", ProgressBar)
            bar.update(total=len(self._steps))
        if state == "running":
            self._started.setdefault(step, at)
        elif state in FINAL and step not in self._finished:
            self._finished.add(step)
            self.query_one("#overall", ProgressBar).advance(1)
        table.update_cell(step, "state", state_cell(state))
        if step in self._started:
            table.update_cell(step, "time", self._elapsed(step, at))
        table.update_cell(step, "detail", Text(detail or "", no_wrap=True, overflow="ellipsis"))

    def _elapsed(self, step: str, now: float) -> str:
        return f"{now - self._started[step]:.1f}s"

    def _tick(self) -> None:
        """Running steps show their elapsed time as it grows."""
        table = self.query_one("#steps", DataTable)
        now = time.monotonic()
        for step in self._started:
            if step not in self._finished:
                table.update_cell(step, "time", self._elapsed(step, now))
