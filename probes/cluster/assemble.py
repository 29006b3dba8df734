"""Rank 0 puts the job together: every node and rank in ``Facts.cluster``, its own node's facts
in the usual sections, and the collectives judged as the local micro-tests are."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from probes.cluster.identity import Identity, node_key
from probes.facts import Cluster, ClusterNode, ClusterRank, Facts, MicroTests, ProbeError, Skipped
from probes.microtests.channel import RankReport
from probes.microtests.judge import judge


def assemble(
    me: Identity,
    roster: Mapping[int, dict],
    payloads: Mapping[int, dict],
    steps: Mapping[int, str],
    layout: Mapping[int, tuple[int | None, str | None]],
    *,
    backend: str | None,
    microtests_run: bool,
) -> Facts:
    """The job's Facts: rank 0's node in the usual sections, every node and rank in ``cluster``."""
    cluster = Cluster(source="live", world_size=me.world_size, nnodes=me.nnodes, backend=backend)
    where: dict[int, tuple[int | str, str, int | None]] = {}  # rank -> (node key, name, node rank)
    for rank in range(me.world_size):
        arrival = roster.get(rank) or {}
        node_rank, expected = layout.get(rank, (None, None))
        node_rank = arrival.get("node_rank", node_rank)
        name = arrival.get("node") or expected or (f"node {node_rank}" if node_rank is not None else "unknown node")
        where[rank] = (node_key({"node": name, "node_rank": node_rank}), name, node_rank)
    # the hostname is the label; where one host runs several nodes, their node ranks tell them apart
    keys_of: dict[str, set[int | str]] = {}
    for key, name, _ in where.values():
        keys_of.setdefault(name, set()).add(key)
    nodes: dict[int | str, ClusterNode] = {}
    for rank in range(me.world_size):
        arrival, payload = roster.get(rank), payloads.get(rank)
        key, name, node_rank = where[rank]
        if len(keys_of[name]) > 1 and node_rank is not None:
            name = f"{name} (node {node_rank})"
        node = nodes.setdefault(key, ClusterNode(name=name, node_rank=node_rank))
        node.ranks.append(rank)
        if arrival and node.hostname is None:
            node.hostname = arrival.get("hostname")
        state = "reported" if payload else "silent" if arrival else "missing"
        entry = ClusterRank(
            rank=rank,
            node=name,
            state=state,
            local_rank=(arrival or {}).get("local_rank"),
            pid=(arrival or {}).get("pid"),
        )
        if payload:
            entry.step, entry.error = payload.get("step"), payload.get("error")
            entry.device, entry.device_name, entry.device_uuid = (
                payload["device"].get(k) for k in ("device", "device_name", "device_uuid")
            )
            _fill_node(node, payload)
        elif arrival:
            entry.step = steps.get(rank)
        cluster.ranks.append(entry)
    cluster.nodes = sorted(nodes.values(), key=lambda n: (n.node_rank is None, n.node_rank or 0, min(n.ranks)))
    _bandwidths(cluster, payloads)

    own = next((n for n in cluster.nodes if 0 in n.ranks), None)
    facts = Facts(inputs=["live", f"cluster:{len(cluster.nodes)} nodes, {me.world_size} ranks"], cluster=cluster)
    facts.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if own is not None and own.reported:
        for section in ("host", "packages", "env", "torch", "gpus", "driver", "launcher"):
            setattr(facts, section, getattr(own, section))
    for node in cluster.nodes:
        facts.errors.extend(ProbeError(probe=f"{node.name}: {e.probe}", message=e.message) for e in node.errors)
    facts.microtests = (
        _microtests(me.world_size, roster, payloads, steps, backend) if microtests_run else MicroTests(source="live")
    )
    if not microtests_run:
        facts.skipped.append(Skipped(what="cluster micro-tests", reason="not requested (--microtests none)"))
    elif len(roster) < me.world_size:
        facts.skipped.append(
            Skipped(what="cluster micro-tests", reason=f"{me.world_size - len(roster)} rank(s) never joined")
        )
    return facts


def _fill_node(node: ClusterNode, payload: dict) -> None:
    if payload.get("node_error"):
        node.errors.append(ProbeError(probe="node facts", message=payload["node_error"]))
    data = payload.get("node_facts")
    if not data or node.reported:
        return
    facts = Facts.model_validate(data)
    for section in ("host", "packages", "env", "torch", "gpus", "driver", "launcher"):
        setattr(node, section, getattr(facts, section))
    node.errors.extend(facts.errors)
    node.reported = True


def _bandwidths(cluster: Cluster, payloads: Mapping[int, dict]) -> None:
    inter = payloads.get(0, {}).get("tests", {}).get("inter_node", {}).get("measurements", {})
    for node in cluster.nodes:
        leader = min(node.ranks)
        intra = payloads.get(leader, {}).get("tests", {}).get("intra_node", {}).get("measurements", {})
        node.intra_busbw_gbps = intra.get("busbw_gbps")
        node.inter_gbps = inter.get(f"gbps_rank{leader}")


def _microtests(
    world: int, roster: Mapping[int, dict], payloads: Mapping[int, dict], steps: Mapping[int, str], backend: str | None
) -> MicroTests:
    """The job's collectives, judged as the local micro-tests are (``probes.microtests.judge``)."""
    tests = MicroTests(source="microtest")
    missing = [r for r in range(world) if r not in roster]
    where = {r: "never joined" for r in missing}
    where.update({r: f"silent at '{steps.get(r, 'unknown')}'" for r in roster if r not in payloads})
    where.update({r: p.get("step", "?") for r, p in payloads.items()})
    states = {str(r): s for r, s in sorted(where.items())}
    if missing:
        test = judge("rendezvous", {r: RankReport() for r in range(world)}, status="timed_out",
                     error=f"rank(s) {', '.join(map(str, missing))} never joined the job",
                     nproc=world, backend=backend, duration_s=None, ranks=states)  # fmt: skip
        test.measurements.update(joined=len(roster), expected=world)
        tests.rendezvous = test
        return tests
    for name in ("rendezvous", "barrier", "all_reduce"):
        seen = {r: p["tests"][name] for r, p in payloads.items() if name in p.get("tests", {})}
        if not seen and not payloads:
            continue
        status, error = _verdict([t["status"] for t in seen.values()], seen, world)
        setattr(tests, name, judge(
            name, {r: _as_report(name, seen.get(r)) for r in range(world)}, status=status, error=error,
            nproc=world, backend=backend, ranks=states,
            duration_s=max((t["duration_s"] or 0 for t in seen.values()), default=None),
        ))  # fmt: skip
    return tests


def _verdict(statuses: list[str], seen: Mapping[int, dict], world: int) -> tuple[str, str | None]:
    """(status, error): the worst rank's status; a rank that never reported did not finish."""
    status = next((s for s in ("timed_out", "failed", "skipped") if s in statuses), "passed")
    if len(seen) < world and status == "passed":
        status = "timed_out"
    first = next((t for t in seen.values() if t.get("error")), None)
    return status, first["error"] if first else None


def _as_report(name: str, test: dict | None) -> RankReport:
    """One rank's result of one collective, as the judge reads a local rank's channel."""
    if test is None:
        return RankReport()
    measurements = dict(test.get("measurements") or {})
    wrong = measurements.get("correct") is False
    return RankReport(
        steps=[name] if test["status"] != "skipped" else [],
        measurements=measurements,
        checks_failed=[test.get("error") or "wrong result"] if wrong else [],
        error=test.get("error") if not wrong else None,
        missing=list(measurements.pop("missing_ranks", []) or []),
        done=test["status"] == "passed" or wrong,
    )
