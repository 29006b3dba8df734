"""The views of a cluster snapshot: the job at a glance and one section per node.

Every front end that shows a report of a multi-node job draws these: ``diagnose cluster``,
``diagnose --from cluster.json`` and the TUI, so no view of a cluster snapshot hides its nodes.
"""

from __future__ import annotations

from diagnose.render import machine_summary, md_cell, render, safe_report
from diagnose.report import Report
from probes.facts import Cluster, ClusterNode, Facts


def render_cluster(report: Report, fmt: str, *, color: bool = False) -> str:
    """The usual report, then the job at a glance and one section per node (text, markdown);
    a report without a cluster is the usual report alone.

    JSON carries the same in ``facts.cluster``: the nodes' facts, the ranks, the derived facts.
    """
    body = render(report, fmt, color=color)
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
        (
            "Job",
            f"{len(cluster.nodes)} node(s), world size {cluster.world_size}, backend {cluster.backend or 'unknown'}",
        ),
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
        facts = Facts(
            **{
                s: getattr(node, s)
                for s in ("host", "packages", "env", "torch", "gpus", "driver", "launcher")
                if getattr(node, s) is not None
            }
        )
        rows += [
            (k, v) for k, v in machine_summary(Report.model_construct(facts=facts)) if k not in ("Inputs", "Launcher")
        ]
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
        where = {"reported": "reported", "missing": "never joined", "silent": f"silent at '{rank.step or '?'}'"}[
            rank.state
        ]
        device = " ".join(x for x in (rank.device, rank.device_name) if x)
        error = f"; {rank.error}" if rank.error else ""
        rows.append((f"rank {rank.rank}", f"{where}{', ' + device if device else ''}{error}"))
    for error in node.errors:
        rows.append(("Probe error", f"{error.probe}: {error.message}"))
    return rows


def node_title(node: ClusterNode) -> str:
    where = f"node rank {node.node_rank}" if node.node_rank is not None else "node rank unknown"
    host = f", host {node.hostname}" if node.hostname and node.hostname != node.name else ""
    return f"{node.name} ({where}{host})"


def _text(cluster: Cluster) -> list[str]:
    def table(rows: list[tuple[str, str]], indent: str) -> list[str]:
        width = max((len(k) for k, _ in rows), default=0)
        return [f"{indent}{k.ljust(width)}  {v}" for k, v in rows]

    out = ["Cluster", *table(job_summary(cluster), "  ")]
    for node in cluster.nodes:
        out += ["", f"Node {node_title(node)}", *table(node_rows(node, cluster), "  ")]
    return out


def _markdown(cluster: Cluster) -> list[str]:
    def table(rows: list[tuple[str, str]]) -> list[str]:
        return ["| | |", "|---|---|", *(f"| {md_cell(k)} | {md_cell(v)} |" for k, v in rows), ""]

    out = ["## Cluster", "", *table(job_summary(cluster))]
    for node in cluster.nodes:
        out += [f"### Node {md_cell(node_title(node))}", "", *table(node_rows(node, cluster))]
    return out
