"""The help screen: the keys, and what each tab of the results means."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# lightning-diagnose

The **Causes** tab ranks what most likely went wrong, from the evidence seen in these facts.
Pick a cause (arrows or mouse) to see why it ranks: the evidence each rule checked (fired,
not fired, or unknown because the fact could not be collected) and the fixes to paste.

| key | does |
|---|---|
| ↑ ↓, Enter | choose a cause, open its detail |
| Tab | move between the list, the detail and each fix |
| c | copy the focused fix (or the first) to the clipboard |
| 1 … 6 | switch tab: causes, possible, not checked, ruled out, probes, facts |
| / | filter causes and rules by id, title or severity (Esc clears) |
| j / m | write diagnose-report.json / .md into the current folder |
| r | gather the facts and diagnose again |
| q | quit: the exit code is 1 when a cause at error severity was found |

**Possible**: the rule's conditions hold here, but its evidence could not be checked.
**Not checked**: the facts it needs are unknown. **Ruled out**: a condition does not hold, or
none of its evidence was seen. **Probes**: what failed or was skipped while gathering, and the micro-tests.
**Facts**: every fact the diagnosis stands on; "unknown" is not the same as false.

Copying uses the terminal's clipboard (OSC 52); a terminal that does not support it copies
nothing, so export the markdown instead.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(HELP)
