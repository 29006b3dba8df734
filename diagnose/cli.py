"""The command line contract, in one place.

stdout carries only the document asked for (report, snapshot, schema, listing); anything
else is one plain line on stderr, ``diagnose: error: ...``. Exit codes are ``Exit``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from enum import IntEnum
from pathlib import Path
from typing import NoReturn, Sequence


class Exit(IntEnum):
    OK = 0
    """Nothing at error severity was found."""
    FINDINGS = 1
    """At least one finding at error severity (or a check such as `kb test` failed)."""
    USAGE = 2
    """Bad usage or bad input: a malformed rule file, snapshot, log or option."""
    INTERNAL = 3
    """The tool itself failed."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


MICROTEST_CHOICES = "all, none, or a comma list of: rendezvous, barrier, all_reduce, placement, duplicate_gpu, lightning_fit"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text!r}")
    return value


def _input_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evidence")
    group.add_argument("--from", dest="snapshot", metavar="SNAPSHOT", help="diagnose a saved facts snapshot (JSON)")
    group.add_argument("--report", action="append", default=[], metavar="FILE", help="a pasted environment report (collect_env, Lightning bug report, accelerate env, ds_report, nvidia-smi); repeatable")
    group.add_argument("--log", action="append", default=[], metavar="FILE", help="a log or traceback, '-' for stdin (also a pipe or <(...)); repeatable")
    group.add_argument("--offline", action="store_true", help="no live probes (implied by --from, --report and --log)")
    tests = parser.add_argument_group("micro-tests (live only)")
    tests.add_argument("--microtests", default=None, metavar="LIST", help=f"{MICROTEST_CHOICES} (default: all live, none offline)")
    tests.add_argument("--nproc", type=positive_int, metavar="N", help="ranks per micro-test (default: one per GPU, 2 on CPU)")
    tests.add_argument("--backend", choices=["nccl", "gloo"], help="force the process-group backend")
    tests.add_argument("--timeout", type=positive_seconds, default=60.0, metavar="S", help="deadline per micro-test in seconds (default 60)")
    tests.add_argument("--strategy", default="ddp", choices=["ddp", "ddp_spawn", "fsdp", "deepspeed"], help="strategy of the Lightning fit test")


def kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", action="append", default=[], metavar="DIR", help="an extra rule folder, next to the shipped one; repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="diagnose",
        description="Diagnose multi-GPU / distributed training failures (PyTorch, Lightning). "
        "With no options at a terminal it opens the interactive view of this machine's diagnosis.",
        epilog="Other commands: diagnose facts | run -- CMD | cluster | kb {lint,list,show,test,docs,new,paths} | schema. "
        "Exit codes: 0 no error finding, 1 an error finding, 2 bad usage or input, 3 internal failure.",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the JSON report (same as --format json)")
    out.add_argument("--format", choices=["text", "json", "markdown"], help="output format (default: the interactive view at a terminal, else text)")
    _input_options(parser)
    kb_option(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return parser


def _version() -> str:
    from diagnose import __version__

    return __version__


# --- gathering facts --------------------------------------------------------------------------


def _is_offline(args: argparse.Namespace) -> bool:
    return bool(args.offline or args.snapshot or args.report or args.log)


def _microtest_names(spec: str | None, offline: bool) -> list[str] | None:
    """None = all; [] = none."""
    from probes.microtests import TEST_NAMES

    if spec is None:
        return [] if offline else None
    if spec == "all":
        return None
    if spec == "none":
        return []
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in TEST_NAMES]
    if unknown:
        raise UsageError(f"--microtests: unknown test {unknown[0]!r} ({MICROTEST_CHOICES})")
    return names


# A pasted environment report is a few KB; a log given as a report is refused, not parsed.
MAX_REPORT_BYTES = 4 << 20
# A job's output piped into --log may pause for long; a FIFO nobody opened never starts.
LOG_PAUSE_SECONDS = 600.0


def _read_text(path: str, what: str) -> str:
    from probes.untrusted import InputError, decode_text, display_name, read_bytes

    try:
        data = read_bytes(path, limit=MAX_REPORT_BYTES)
        return decode_text(data, display_name(path), what)
    except InputError as exc:
        message = str(exc).replace(": cannot read:", f": cannot read {what}:", 1)
        hint = f" (a {what}; give a log with --log)" if "MiB" in message else ""
        raise UsageError(message + hint) from None


def _log_source(path: str) -> object:
    """A regular file by its path (the reader's fast path); stdin, pipes, FIFOs and devices
    as a stream with a deadline for the first data."""
    import stat

    from probes.untrusted import InputError, open_stream

    try:
        if path not in ("-", "/dev/stdin") and stat.S_ISREG(os.stat(path).st_mode):
            return Path(path)
        return open_stream(path, limit=1 << 40, later_idle=LOG_PAUSE_SECONDS)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read log: {exc.strerror or exc}") from None
    except InputError as exc:
        raise UsageError(str(exc).replace(": cannot read:", ": cannot read log:", 1)) from None


def gather_facts(args: argparse.Namespace, progress=None):
    from probes.facts import load_snapshot

    offline = _is_offline(args)
    if offline and args.microtests not in (None, "none"):
        raise UsageError("--microtests needs a live run; drop --from/--report/--log/--offline")
    if args.snapshot:
        if args.report or args.log:
            raise UsageError("--from takes a whole snapshot; give --report/--log without it")
        return load_snapshot(args.snapshot)
    if offline:
        from diagnose.api import offline_facts

        reports = [(p, _read_text(p, "report")) for p in args.report]
        logs = [("stdin" if p == "-" else p, _log_source(p)) for p in args.log]
        from diagnose.kb import load_kb

        return offline_facts(reports=reports, logs=logs, kb=load_kb(getattr(args, "kb", None) or []))
    from diagnose.api import collect_facts

    return collect_facts(
        microtests=_microtest_names(args.microtests, offline),
        nproc=args.nproc,
        backend=args.backend,
        timeout=args.timeout,
        strategy=args.strategy,
        progress=progress,
    )


def _progress_printer():
    """One line per step on stderr: stdout stays the document."""

    def show(step: str, state: str, detail: str | None) -> None:
        if state != "running":
            print(f"  {state:<9} {step}" + (f": {detail}" if detail else ""), file=sys.stderr, flush=True)

    return show


# --- commands -----------------------------------------------------------------------------------


def cmd_diagnose(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    fmt = "json" if args.json else args.format
    if args.json and args.format not in (None, "json"):
        raise UsageError("--json and --format disagree")
    from diagnose.kb import load_kb

    kb = load_kb(args.kb)
    # Textual draws on stderr: with stderr redirected the view would be invisible
    if fmt is None and sys.stdout.isatty() and sys.stdin.isatty() and sys.stderr.isatty():
        from diagnose.tui import run_tui

        return run_tui(args, kb)
    progress = _progress_printer() if (fmt in (None, "text") or sys.stderr.isatty()) and not _is_offline(args) else None
    facts = gather_facts(args, progress)
    from diagnose.engine import evaluate
    from diagnose.render import render

    report = evaluate(facts, kb)
    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    emit(render(report, fmt or "text", color=color))
    return Exit.FINDINGS if report.has_error else Exit.OK


def cmd_facts(argv: Sequence[str]) -> int:
    parser = Parser(prog="diagnose facts", description="Collect facts and print them as a snapshot (JSON).")
    parser.add_argument("--out", metavar="FILE", help="write the snapshot to FILE instead of stdout")
    _input_options(parser)
    args = parser.parse_args(argv)
    if args.microtests is None:
        args.microtests = "none"  # facts alone are quick; ask for tests explicitly
    facts = gather_facts(args, _progress_printer() if sys.stderr.isatty() else None)
    from probes.facts import dump_snapshot, facts_from_dict
    from probes.redact import scrub

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
    sub.add_parser("paths", help="list the fact paths rules can use", description="list every fact path a rule can name")
    new = sub.add_parser("new", help="write a skeleton rule", description="write kb/AREA/NAME.yaml with both example kinds")
    new.add_argument("id", metavar="AREA.NAME")
    new.add_argument("--dir", default="kb", help="the rule folder (default kb)")
    args = parser.parse_args(argv)
    from diagnose import kbcmd

    return getattr(kbcmd, args.action)(args)


def cmd_run(argv: Sequence[str]) -> int:
    from diagnose.supervise import cmd_run as run

    return run(argv)


def cmd_cluster(argv: Sequence[str]) -> int:
    from diagnose.cluster import cmd_cluster as run

    return run(argv)


COMMANDS = {"facts": cmd_facts, "kb": cmd_kb, "schema": cmd_schema, "run": cmd_run, "cluster": cmd_cluster}


def emit(document: str) -> None:
    """The document on stdout. A reader that went away (``| head``) is not an error and
    does not change the exit code; the rest of the output is dropped."""
    try:
        sys.stdout.write(document)
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()


def _drop_stdout() -> None:
    # Python flushes stdout again at exit; pointing it at /dev/null keeps that quiet
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def _tolerant_streams() -> None:
    """A terminal or file that is not UTF-8 (cp1252, a Windows redirect) gets '?' for what it
    cannot show, instead of a UnicodeEncodeError halfway through the report."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding not in ("utf8", "utf8sig") and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _tolerant_streams()
    from diagnose.kb import KBError
    from probes.facts import SnapshotError
    from probes.log import LogError

    try:
        if argv and argv[0] in COMMANDS:
            return int(COMMANDS[argv[0]](argv[1:]))
        return int(cmd_diagnose(argv))
    except (UsageError, KBError, SnapshotError, LogError) as exc:
        print(f"diagnose: error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        print("diagnose: error: interrupted", file=sys.stderr)
        return 130  # as a shell reports a job ended by SIGINT
    except BrokenPipeError:  # a write outside emit(): the document was not delivered whole
        _drop_stdout()
        return Exit.INTERNAL
    except Exception as exc:  # the contract: never a traceback, always a line and exit 3
        if isinstance(exc, OSError) and exc.filename is not None:
            # a file or folder the user named: missing, read-only, a directory...
            print(f"diagnose: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
            return Exit.USAGE
        if os.environ.get("DIAGNOSE_DEBUG"):
            raise
        print(f"diagnose: internal error: {type(exc).__name__}: {exc} (set DIAGNOSE_DEBUG=1 for the traceback)", file=sys.stderr)
        return Exit.INTERNAL
