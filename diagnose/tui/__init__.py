"""The interactive view: `diagnose` at a terminal.

A thin view over the same Report that ``--json`` prints: facts are gathered in a Textual
worker thread that posts typed messages back, the engine ranks them, and the screens only
render the result. Only the commands import this package, and only at a terminal, so
``import diagnose`` never pays for Textual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from diagnose.kb import KB
    from diagnose.tui.app import DiagnoseApp

__all__ = ["make_app", "run_tui"]


def run_tui(args: argparse.Namespace, kb: KB) -> int:
    from diagnose.tui.app import run_tui as run

    return run(args, kb)


def make_app(**kwargs: Any) -> DiagnoseApp:
    from diagnose.tui.app import make_app as make

    return make(**kwargs)
