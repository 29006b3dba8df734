"""Facts for the options the user gave: a saved snapshot, pasted texts, or this machine.

Shared by the command line and the TUI, which both turn the same options into Facts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from diagnose.contract import UsageError, positive_int, positive_seconds

MICROTEST_CHOICES = (
    "all, none, or a comma list of: rendezvous, barrier, all_reduce, placement, duplicate_gpu, lightning_fit"
)
# A pasted environment report is a few KB; a log given as a report is refused, not parsed.
MAX_REPORT_BYTES = 4 << 20
# A job's output piped into --log may pause for long; a FIFO nobody opened never starts.
LOG_PAUSE_SECONDS = 600.0


def input_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evidence")
    group.add_argument("--from", dest="snapshot", metavar="SNAPSHOT", help="diagnose a saved facts snapshot (JSON)")
    group.add_argument(
        "--report",
        action="append",
        default=[],
        metavar="FILE",
        help="a pasted environment report (collect_env, Lightning bug report, accelerate env, ds_report, nvidia-smi); repeatable",
    )
    group.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="FILE",
        help="a log or traceback, '-' for stdin (also a pipe or <(...)); repeatable",
    )
    group.add_argument("--offline", action="store_true", help="no live probes (implied by --from, --report and --log)")
    tests = parser.add_argument_group("micro-tests (live only)")
    tests.add_argument(
        "--microtests", default=None, metavar="LIST", help=f"{MICROTEST_CHOICES} (default: all live, none offline)"
    )
    tests.add_argument(
        "--nproc", type=positive_int, metavar="N", help="ranks per micro-test (default: one per GPU, 2 on CPU)"
    )
    tests.add_argument("--backend", choices=["nccl", "gloo"], help="force the process-group backend")
    tests.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="deadline per micro-test in seconds (default 60)",
    )
    tests.add_argument(
        "--strategy",
        default="ddp",
        choices=["ddp", "ddp_spawn", "fsdp", "deepspeed"],
        help="strategy of the Lightning fit test",
    )


def is_offline(args: argparse.Namespace) -> bool:
    return bool(args.offline or args.snapshot or args.report or args.log)


def microtest_names(spec: str | None, offline: bool) -> list[str] | None:
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


def gather_facts(args: argparse.Namespace, progress=None, kb=None):
    # kb: the rule base already loaded for this run (loading it again costs a second parse)
    from probes.snapshot import load_snapshot

    offline = is_offline(args)
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

        return offline_facts(reports=reports, logs=logs, kb=kb or load_kb(getattr(args, "kb", None) or []))
    from diagnose.api import collect_facts

    return collect_facts(
        microtests=microtest_names(args.microtests, offline),
        nproc=args.nproc,
        backend=args.backend,
        timeout=args.timeout,
        strategy=args.strategy,
        progress=progress,
    )


def progress_printer():
    """One line per step on stderr: stdout stays the document."""

    def show(step: str, state: str, detail: str | None) -> None:
        if state != "running":
            print(f"  {state:<9} {step}" + (f": {detail}" if detail else ""), file=sys.stderr, flush=True)

    return show
