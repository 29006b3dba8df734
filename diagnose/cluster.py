"""``diagnose cluster``: the job's own program under torchrun or srun, one process per GPU.

Every rank takes part (``probes.cluster.rank.run``); rank 0 diagnoses the gathered Facts and writes
one report with a section per node. With ``--from`` it renders a saved cluster snapshot the
same way, offline.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from diagnose.clusterview import render_cluster
from diagnose.contract import Exit, Parser, UsageError, chosen_format, emit, format_options, kb_option
from probes.facts import Facts

_SIZE = re.compile(r"^(\d+)\s*([KMG]?)B?$", re.IGNORECASE)


def build_parser() -> Parser:
    parser = Parser(
        prog="diagnose cluster",
        description="Diagnose a whole multi-node job from inside it: run as the job's program, one "
        "process per GPU (torchrun --nnodes N --nproc-per-node G -m diagnose cluster, or "
        "srun python -m diagnose cluster). Rank 0 writes one report with a section per node.",
    )
    out = parser.add_argument_group("output (rank 0)")
    format_options(out, "text")
    out.add_argument("--out", metavar="FILE", help="write the report to FILE instead of stdout")
    out.add_argument(
        "--save-facts", metavar="FILE", help="also write the gathered facts snapshot, for `diagnose --from FILE` later"
    )
    run = parser.add_argument_group("the run (every rank)")
    run.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        metavar="S",
        help="hard deadline of the whole run in seconds (default 180)",
    )
    run.add_argument(
        "--join-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long rank 0 waits for every rank to join (default 60)",
    )
    run.add_argument(
        "--op-timeout", type=float, default=60.0, metavar="S", help="deadline of one collective (default 60)"
    )
    run.add_argument(
        "--backend", choices=["nccl", "gloo"], help="process-group backend (default: nccl with CUDA, else gloo)"
    )
    run.add_argument(
        "--microtests",
        choices=["all", "none"],
        default="all",
        help="run the collectives in the job's group (default all)",
    )
    run.add_argument(
        "--max-size", default="64MB", metavar="SIZE", help="largest all_reduce of the sweep, e.g. 4MB (default 64MB)"
    )
    parser.add_argument(
        "--from", dest="snapshot", metavar="SNAPSHOT", help="render a saved cluster snapshot instead (offline)"
    )
    kb_option(parser)
    return parser


def _bytes(text: str) -> int:
    match = _SIZE.match(text.strip())
    if not match:
        raise UsageError(f"--max-size: {text!r} is not a size such as 4MB or 1024")
    return int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]


def cmd_cluster(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    fmt = chosen_format(args) or "text"
    from diagnose.kb import load_kb

    if args.snapshot:
        from probes.snapshot import load_snapshot

        facts = load_snapshot(args.snapshot)
        if facts.cluster is None:
            raise UsageError(f"{args.snapshot}: not a cluster snapshot (no cluster section); use `diagnose --from`")
        return _write(facts, load_kb(args.kb), fmt, args)

    from probes.cluster.identity import LaunchError, identity
    from probes.cluster.options import Options

    for name in ("timeout", "join_timeout", "op_timeout"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')}: must be a positive number of seconds")
    options = Options(
        timeout=args.timeout,
        join_timeout=min(args.join_timeout, args.timeout),
        op_timeout=args.op_timeout,
        backend=args.backend,
        max_bytes=_bytes(args.max_size),
        microtests=args.microtests == "all",
    )
    try:
        me = identity(os.environ)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    from importlib.util import find_spec

    if find_spec("torch") is None:  # the ranks talk through torch.distributed
        raise UsageError(
            "diagnose cluster needs torch in this environment (pip install torch); "
            "`diagnose cluster --from FILE` reads a saved snapshot without it"
        )
    from probes.cluster.rank import ClusterError, run

    kb = load_kb(args.kb) if me.rank == 0 else None  # a broken rule base fails before anyone waits

    def write_report(facts: Facts, expired: bool) -> int:
        if expired:
            print(
                f"diagnose cluster: the {args.timeout:g} s deadline passed; reporting what rank 0 has",
                file=sys.stderr,
                flush=True,
            )
        return _write(facts, kb, fmt, args)

    try:
        return run(options, write_report)
    except ClusterError as exc:
        print(f"diagnose cluster: {exc}", file=sys.stderr, flush=True)
        return Exit.FINDINGS


def _write(facts: Facts, kb, fmt: str, args) -> int:
    from diagnose.engine import evaluate

    report = evaluate(facts, kb)
    text = render_cluster(report, fmt)
    if args.save_facts and not args.snapshot:
        from probes.redact import scrub
        from probes.snapshot import dump_snapshot, facts_from_dict

        safe = facts_from_dict(scrub(facts.model_dump(mode="json", warnings=False)), "facts")
        _write_file(args.save_facts, dump_snapshot(safe) + "\n")
    if args.out:
        _write_file(args.out, text)
    else:
        emit(text)
    return Exit.FINDINGS if report.has_error else Exit.OK


def _write_file(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror or exc}") from None
