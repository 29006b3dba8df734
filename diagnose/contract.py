"""The command line contract every command shares, in one leaf module.

stdout carries only the document asked for (report, snapshot, schema, listing); anything
else is one plain line on stderr, ``diagnose: error: ...``. Exit codes are ``Exit``. This
module imports nothing of diagnose or probes, so every command (``cli``, ``cluster``,
``kb``, ``run``, the TUI) can import it without importing each other.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from enum import IntEnum
from typing import Any, NoReturn


class Exit(IntEnum):
    OK = 0
    """Nothing at error severity was found."""
    FINDINGS = 1
    """At least one finding at error severity (or a check such as `kb test` failed)."""
    USAGE = 2
    """Bad usage or bad input: a malformed rule file, snapshot, log or option."""
    INTERNAL = 3
    """The tool itself failed."""
    INTERRUPTED = 130
    """Ended by SIGINT (ctrl-C), as a shell reports a job ended so."""
    TERMINATED = 143
    """Ended by SIGTERM."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def format_options(group: Any, default: str) -> None:
    """``--json`` and ``--format``, as every command that writes a report takes them."""
    group.add_argument("--json", action="store_true", help="print the JSON report (same as --format json)")
    group.add_argument("--format", choices=["text", "json", "markdown"], help=f"output format (default: {default})")


def chosen_format(args: argparse.Namespace) -> str | None:
    """The format ``--json``/``--format`` ask for, or None when neither is given."""
    if args.json and args.format not in (None, "json"):
        raise UsageError("--json and --format disagree")
    return "json" if args.json else args.format


def kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kb",
        action="append",
        default=[],
        metavar="DIR",
        help="an extra rule folder, next to the shipped one; repeatable",
    )


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


def emit(document: str) -> None:
    """The document on stdout. A reader that went away (``| head``) is not an error and
    does not change the exit code; the rest of the output is dropped."""
    try:
        sys.stdout.write(document)
        sys.stdout.flush()
    except BrokenPipeError:
        drop_stdout()


def drop_stdout() -> None:
    # Python flushes stdout again at exit; pointing it at /dev/null keeps that quiet
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
