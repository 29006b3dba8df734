"""``diagnose run [options] -- CMD ARGS...``: the options, and the run from start to report."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from diagnose.contract import Exit, Parser, UsageError, chosen_format, format_options, kb_option
from diagnose.run.facts import run_facts
from diagnose.run.jobenv import job_env
from diagnose.run.summary import summary_lines
from diagnose.run.supervise import DEFAULT_GRACE_S, supervise
from probes.proc import become_subreaper

DEFAULT_HANG_AFTER_S = 300.0


def build_run_parser() -> Parser:
    parser = Parser(
        prog="diagnose run",
        usage="%(prog)s [options] -- CMD ARGS...",
        description="Run a training command under supervision: pass its output through, detect a hang, "
        "take every rank's stack, end the job and diagnose it.",
        epilog="Exit status: the job's own when it ends by itself, 1 on a hang, 2 bad usage, 3 internal failure.",
    )
    parser.add_argument(
        "--hang-after",
        type=float,
        default=DEFAULT_HANG_AFTER_S,
        metavar="S",
        help=f"seconds without progress before the job counts as hung (default {DEFAULT_HANG_AFTER_S:g})",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help=f"seconds between TERM and KILL when ending a hung job (default {DEFAULT_GRACE_S:g})",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave a hung job running after taking its stacks (its output is no longer copied once diagnose exits)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="where the log, report and dumps go (default ./diagnose-run-TIMESTAMP)"
    )
    parser.add_argument(
        "--no-debug-env", action="store_true", help="do not turn on the Flight Recorder and TORCH_NCCL_DESYNC_DEBUG"
    )
    format_options(parser, "the interactive view at a terminal, else text")
    kb_option(parser)
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" not in argv:
        build_run_parser().parse_known_args(argv)  # --help, and option errors, come first
        raise UsageError("give the command after `--`: diagnose run [options] -- CMD ARGS...")
    cut = argv.index("--")
    if cut == len(argv) - 1:
        raise UsageError("no command after `--`")
    return argv[:cut], argv[cut + 1 :]


def _seconds(option: str, value: float, *, zero: bool) -> None:
    """A number of seconds must be finite and positive (or zero where that means "at once"):
    nan compares false with everything, so an unchecked one silently turns every test off."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise UsageError(
            f"{option} must be a finite number of seconds, {'0 or more' if zero else 'more than 0'} (got {value:g})"
        )


def live_facts():
    """This machine's torch, GPUs and packages (env and launcher come from a rank's own
    environment once the job is over)."""
    from probes.collect import collect

    return collect()


def cmd_run(argv: Sequence[str]) -> int:
    options, command = split_command(argv)
    args = build_run_parser().parse_args(options)
    requested = chosen_format(args)
    fmt = requested or "text"
    _seconds("--hang-after", args.hang_after, zero=False)
    _seconds("--grace", args.grace, zero=True)
    from diagnose.engine import evaluate
    from diagnose.kb import load_kb
    from diagnose.render import render
    from probes.snapshot import dump_snapshot

    kb = load_kb(args.kb)  # a broken rule stops us before the job starts, not after it hangs
    out = Path(args.out or f"diagnose-run-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out}: cannot create: {exc.strerror or exc}") from None
    env, fr_dir = job_env(os.environ, out.resolve(), debug_env=not args.no_debug_env, die_with_us=not args.keep)
    # a document on stdout must stay parseable: then the job's stdout joins its stderr
    job_stdout = sys.stdout.buffer if fmt == "text" else sys.stderr.buffer
    become_subreaper()
    result = supervise(
        command,
        out=out,
        hang_after=args.hang_after,
        keep=args.keep,
        grace=args.grace,
        env=env,
        fr_dir=fr_dir,
        stdout=job_stdout,
        live=live_facts,
    )
    facts = run_facts(command, result)
    report = evaluate(facts, kb)
    (out / "facts.json").write_text(dump_snapshot(facts) + "\n", encoding="utf-8")
    (out / "report.json").write_text(render(report, "json"), encoding="utf-8")
    for line in summary_lines(result, facts, out):
        print(f"diagnose run: {line}", file=sys.stderr, flush=True)
    if requested is None and sys.stdout.isatty() and sys.stdin.isatty():
        from diagnose.tui import make_app

        make_app(report=report).run()
    else:
        color = fmt == "text" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        sys.stdout.write(render(report, fmt, color=color))
        sys.stdout.flush()
    return result.exit_code if result.exit_code is not None else int(Exit.FINDINGS)
