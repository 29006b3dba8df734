"""The ``diagnose`` command: its options, its subcommands, and the exception -> exit code map.

The contract every command shares (``Exit``, ``UsageError``, ``emit``) is ``diagnose.contract``;
turning options into Facts is ``diagnose.gather``. Nothing imports this module but
``__main__`` and the ``diagnose`` script.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from diagnose.contract import Exit, Parser, UsageError, chosen_format, drop_stdout, emit, format_options, kb_option
from diagnose.gather import gather_facts, input_options, is_offline, progress_printer


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="diagnose",
        description="Diagnose multi-GPU / distributed training failures (PyTorch, Lightning). "
        "With no options at a terminal it opens the interactive view of this machine's diagnosis.",
        epilog="Other commands: diagnose facts | run -- CMD | cluster | kb {lint,list,show,test,docs,new,paths} | schema. "
        "Exit codes: 0 no error finding, 1 an error finding, 2 bad usage or input, 3 internal failure.",
    )
    out = parser.add_argument_group("output")
    format_options(out, "the interactive view at a terminal, else text")
    input_options(parser)
    kb_option(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def _version() -> str:
    from diagnose import __version__

    return __version__


# --- commands -----------------------------------------------------------------------------------


def cmd_diagnose(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    fmt = chosen_format(args)
    from diagnose.kb import load_kb

    kb = load_kb(args.kb)
    # Textual draws on stderr: with stderr redirected the view would be invisible
    if fmt is None and sys.stdout.isatty() and sys.stdin.isatty() and sys.stderr.isatty():
        from diagnose.tui import run_tui

        return run_tui(args, kb)
    progress = progress_printer() if (fmt in (None, "text") or sys.stderr.isatty()) and not is_offline(args) else None
    facts = gather_facts(args, progress, kb)
    from diagnose.clusterview import render_cluster
    from diagnose.engine import evaluate

    report = evaluate(facts, kb)
    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    emit(render_cluster(report, fmt or "text", color=color))
    return Exit.FINDINGS if report.has_error else Exit.OK


def cmd_facts(argv: Sequence[str]) -> int:
    parser = Parser(prog="diagnose facts", description="Collect facts and print them as a snapshot (JSON).")
    parser.add_argument("--out", metavar="FILE", help="write the snapshot to FILE instead of stdout")
    input_options(parser)
    args = parser.parse_args(argv)
    if args.microtests is None:
        args.microtests = "none"  # facts alone are quick; ask for tests explicitly
    facts = gather_facts(args, progress_printer() if sys.stderr.isatty() else None)
    from probes.redact import scrub
    from probes.snapshot import dump_snapshot, facts_from_dict

    # a snapshot is shared like a report: the same redaction before it leaves
    facts = facts_from_dict(scrub(facts.model_dump(mode="json", warnings=False)), "facts")
    text = dump_snapshot(facts) + "\n"
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{args.out}: cannot write: {exc.strerror or exc}") from None
    else:
        emit(text)
    return Exit.OK


def cmd_schema(argv: Sequence[str]) -> int:
    parser = Parser(prog="diagnose schema", description="Print the JSON Schema of the report (or of a facts snapshot).")
    parser.add_argument("--facts", action="store_true", help="the schema of a facts snapshot instead")
    args = parser.parse_args(argv)
    if args.facts:
        import json

        from probes.facts import Facts

        emit(json.dumps(Facts.model_json_schema(), indent=2, sort_keys=True) + "\n")
    else:
        from diagnose.report import report_json_schema

        emit(report_json_schema())
    return Exit.OK


def cmd_kb(argv: Sequence[str]) -> int:
    parser = Parser(prog="diagnose kb", description="Work with the rule base.")
    sub = parser.add_subparsers(dest="action", required=True, parser_class=Parser)
    for name, text in [
        ("lint", "load every rule and report every problem"),
        ("list", "list the rules"),
        ("test", "run every rule's examples"),
    ]:
        kb_option(sub.add_parser(name, help=text, description=text))
    show = sub.add_parser("show", help="show one rule", description="show one rule")
    show.add_argument("id")
    kb_option(show)
    docs = sub.add_parser("docs", help="generate docs/rules.md", description="generate the rule reference")
    docs.add_argument("--out", default="docs/rules.md", metavar="FILE")
    docs.add_argument("--check", action="store_true", help="exit 1 when FILE is not what would be generated")
    kb_option(docs)
    sub.add_parser(
        "paths", help="list the fact paths rules can use", description="list every fact path a rule can name"
    )
    new = sub.add_parser(
        "new", help="write a skeleton rule", description="write kb/AREA/NAME.yaml with both example kinds"
    )
    new.add_argument("id", metavar="AREA.NAME")
    new.add_argument("--dir", default="kb", help="the rule folder (default kb)")
    args = parser.parse_args(argv)
    from diagnose import kbcmd

    return getattr(kbcmd, args.action)(args)


def cmd_run(argv: Sequence[str]) -> int:
    from diagnose.run.command import cmd_run as run

    return run(argv)


def cmd_cluster(argv: Sequence[str]) -> int:
    from diagnose.cluster import cmd_cluster as run

    return run(argv)


COMMANDS = {"facts": cmd_facts, "kb": cmd_kb, "schema": cmd_schema, "run": cmd_run, "cluster": cmd_cluster}


def _tolerant_streams() -> None:
    """A terminal or file that is not UTF-8 (cp1252, a Windows redirect) gets '?' for what it
    cannot show, instead of a UnicodeEncodeError halfway through the report."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding not in ("utf8", "utf8sig") and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C, so every ``finally`` runs: the
    micro-tests' ranks are ended and their folders removed before the tool exits 143."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _tolerant_streams()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
    from diagnose.kb import KBError
    from probes.log import LogError
    from probes.snapshot import SnapshotError

    try:
        if argv and argv[0] in COMMANDS:
            return int(COMMANDS[argv[0]](argv[1:]))
        return int(cmd_diagnose(argv))
    except (UsageError, KBError, SnapshotError, LogError) as exc:
        print(f"diagnose: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        print("diagnose: error: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except _Terminated:
        print("diagnose: error: terminated", file=sys.stderr)
        return Exit.TERMINATED
    except BrokenPipeError:  # a write outside emit(): the document was not delivered whole
        drop_stdout()
        return Exit.INTERNAL
    except Exception as exc:  # the contract: never a traceback, always a line and exit 3
        if isinstance(exc, OSError) and exc.filename is not None:
            # a file or folder the user named: missing, read-only, a directory...
            print(f"diagnose: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
            return Exit.USAGE
        if os.environ.get("DIAGNOSE_DEBUG"):
            raise
        print(
            f"diagnose: internal error: {type(exc).__name__}: {exc} (set DIAGNOSE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return Exit.INTERNAL
