"""``diagnose cluster``: the job's own program under torchrun or srun, one process per GPU.

Every rank takes part (``probes.cluster.run``); rank 0 diagnoses the gathered Facts and writes
one report with a section per node. With ``--from`` it renders a saved cluster snapshot the
same way, offline.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from diagnose.contract import Exit, Parser, UsageError, emit, kb_option
from diagnose.render import machine_summary, md_cell, render, safe_report
from diagnose.report import Report
from probes.facts import Cluster, ClusterNode, Facts

_SIZE = re.compile(r"^(\d+)\s*([KMG]?)B?$", re.IGNORECASE)


def build_parser() -> Parser:
    parser = Parser(
        prog="diagnose cluster",
        description="Diagnose a whole multi-node job from inside it: run as the job's program, one "
        "process per GPU (torchrun --nnodes N --nproc-per-node G -m diagnose cluster, or "
        "srun python -m diagnose cluster). Rank 0 writes one report with a section per node.",
    )
    out = parser.add_argument_group("output (rank 0)")
    out.add_argument("--json", action="store_true", help="the JSON report (same as --format json)")
    out.add_argument("--format", choices=["text", "json", "markdown"], default=None, help="report format (default text)")
    out.add_argument("--out", metavar="FILE", help="write the report to FILE instead of stdout")
    out.add_argument("--save-facts", metavar="FILE", help="also write the gathered facts snapshot, for `diagnose --from FILE` later")
    run = parser.add_argument_group("the run (every rank)")
    run.add_argument("--timeout", type=float, default=180.0, metavar="S", help="hard deadline of the whole run in seconds (default 180)")
    run.add_argument("--join-timeout", type=float, default=60.0, metavar="S", help="how long rank 0 waits for every rank to join (default 60)")
    run.add_argument("--op-timeout", type=float, default=60.0, metavar="S", help="deadline of one collective (default 60)")
    run.add_argument("--backend", choices=["nccl", "gloo"], help="process-group backend (default: nccl with CUDA, else gloo)")
    run.add_argument("--microtests", choices=["all", "none"], default="all", help="run the collectives in the job's group (default all)")
    run.add_argument("--max-size", default="64MB", metavar="SIZE", help="largest all_reduce of the sweep, e.g. 4MB (default 64MB)")
    parser.add_argument("--from", dest="snapshot", metavar="SNAPSHOT", help="render a saved cluster snapshot instead (offline)")
    kb_option(parser)
    return parser


def _bytes(text: str) -> int:
    match = _SIZE.match(text.strip())
    if not match:
        raise UsageError(f"--max-size: {text!r} is not a size such as 4MB or 1024")
    return int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]


def cmd_cluster(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.json and args.format not in (None, "json"):
        raise UsageError("--json and --format disagree")
    fmt = "json" if args.json else args.format or "text"
    from diagnose.kb import load_kb

    if args.snapshot:
        from probes.snapshot import load_snapshot

        facts = load_snapshot(args.snapshot)
        if facts.cluster is None:
            raise UsageError(f"{args.snapshot}: not a cluster snapshot (no cluster section); use `diagnose --from`")
        return _write(facts, load_kb(args.kb), fmt, args)

    from probes.cluster import ClusterError, LaunchError, Options, identity, run

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
    kb = load_kb(args.kb) if me.rank == 0 else None  # a broken rule base fails before anyone waits

    def report(facts: Facts, expired: bool) -> int:
        if expired:
            print(f"diagnose cluster: the {args.timeout:g} s deadline passed; reporting what rank 0 has", file=sys.stderr, flush=True)
        return _write(facts, kb, fmt, args)

    try:
        return run(options, report)
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


# --- the per-node sections ------------------------------------------------------------------------


def render_cluster(report: Report, fmt: str) -> str:
    """The usual report, then the job at a glance and one section per node (text, markdown).

    JSON carries the same in ``facts.cluster``: the nodes' facts, the ranks, the derived facts.
    """
    body = render(report, fmt)
    if fmt == "json" or report.facts.cluster is None:
        return body
    cluster = safe_report(report).facts.cluster  # the node sections leave the tool too
    if fmt == "markdown":
        return body + "\n" + "\n".join(_markdown(cluster)) + "\n"
    return body + "\n" + "\n".join(_text(cluster)) + "\n"


def job_summary(cluster: Cluster) -> list[tuple[str, str]]:
    """(label, value) rows about the whole job, shared by the text and markdown views."""
    states = [r.state for r in cluster.ranks]
    rows = [
        ("Job", f"{len(cluster.nodes)} node(s), world size {cluster.world_size}, backend {cluster.backend or 'unknown'}"),
        ("Ranks", ", ".join(f"{states.count(s)} {s}" for s in ("reported", "silent", "missing") if s in states)),
    ]
    for label, values in (
        ("Missing", [f"rank {r.rank} ({r.node})" for r in cluster.ranks if r.state == "missing"]),
        ("Silent", [f"rank {r.rank} ({r.node}) at '{r.step or '?'}'" for r in cluster.ranks if r.state == "silent"]),
        ("Differing env", cluster.differing_env or []),
        ("Differing versions", cluster.differing_versions or []),
        ("GPU models", cluster.gpu_models or []),
        ("Slow nodes", cluster.slow_nodes or []),
        ("Shared GPUs", cluster.shared_devices or []),
    ):
        if values:
            rows.append((label, ", ".join(values)))
    return rows


def node_rows(node: ClusterNode, cluster: Cluster) -> list[tuple[str, str]]:
    """One node: its machine summary, bandwidths, the values where it differs, its ranks."""
    rows: list[tuple[str, str]] = []
    if node.reported:
        facts = Facts(**{s: getattr(node, s) for s in ("host", "packages", "env", "torch", "gpus", "driver", "launcher") if getattr(node, s) is not None})
        rows += [(k, v) for k, v in machine_summary(Report.model_construct(facts=facts)) if k not in ("Inputs", "Launcher")]
    else:
        rows.append(("Facts", "none arrived (no rank of this node reported)"))
    if node.intra_busbw_gbps is not None:
        rows.append(("Intra-node", f"all_reduce busbw {node.intra_busbw_gbps:g} GB/s"))
    if node.inter_gbps is not None:
        slow = " (far below the other nodes)" if node.name in (cluster.slow_nodes or []) else ""
        rows.append(("Inter-node", f"send/recv with rank 0 {node.inter_gbps:g} GB/s{slow}"))
    if node.reported and node.env is not None:
        for name in cluster.differing_env or []:
            rows.append((name, f"{node.env.values.get(name, 'unset')} (differs between nodes)"))
        versions = node.versions()
        for name in cluster.differing_versions or []:
            rows.append((name, f"{versions.get(name) or 'unknown'} (differs between nodes)"))
    for rank in (r for r in cluster.ranks if r.node == node.name):
        where = {"reported": "reported", "missing": "never joined", "silent": f"silent at '{rank.step or '?'}'"}[rank.state]
        device = " ".join(x for x in (rank.device, rank.device_name) if x)
        error = f"; {rank.error}" if rank.error else ""
        rows.append((f"rank {rank.rank}", f"{where}{', ' + device if device else ''}{error}"))
    for error in node.errors:
        rows.append(("Probe error", f"{error.probe}: {error.message}"))
    return rows


def _title(node: ClusterNode) -> str:
    where = f"node rank {node.node_rank}" if node.node_rank is not None else "node rank unknown"
    host = f", host {node.hostname}" if node.hostname and node.hostname != node.name else ""
    return f"{node.name} ({where}{host})"


def _text(cluster: Cluster) -> list[str]:
    def table(rows: list[tuple[str, str]], indent: str) -> list[str]:
        width = max((len(k) for k, _ in rows), default=0)
        return [f"{indent}{k.ljust(width)}  {v}" for k, v in rows]

    out = ["Cluster", *table(job_summary(cluster), "  ")]
    for node in cluster.nodes:
        out += ["", f"Node {_title(node)}", *table(node_rows(node, cluster), "  ")]
    return out


def _markdown(cluster: Cluster) -> list[str]:
    def table(rows: list[tuple[str, str]]) -> list[str]:
        return ["| | |", "|---|---|", *(f"| {md_cell(k)} | {md_cell(v)} |" for k, v in rows), ""]

    out = ["## Cluster", "", *table(job_summary(cluster))]
    for node in cluster.nodes:
        out += [f"### Node {md_cell(_title(node))}", "", *table(node_rows(node, cluster))]
    return out
