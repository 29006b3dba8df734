"""Who this rank is, from the launcher's variables (torchrun, srun), and where the others are."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probes import launcher as launcher_probe


class LaunchError(ValueError):
    """The environment does not describe one rank of a launched job."""


@dataclass
class Identity:
    rank: int
    local_rank: int
    world_size: int
    node: str  # the node's name in the report
    hostname: str
    node_rank: int | None
    nnodes: int | None
    kind: str  # torchrun, slurm, ...
    master_addr: str
    master_port: int
    agent_store: bool  # torchrun's agent hosts the store; every rank is a client


def node_name(environ: Mapping[str, str]) -> str:
    """DIAGNOSE_NODE_NAME (two "nodes" on one host in tests), SLURM's name, or the hostname."""
    return environ.get("DIAGNOSE_NODE_NAME") or environ.get("SLURMD_NODENAME") or socket.gethostname()


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list: ``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1."""
    names: list[str] = []
    for part in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        names.extend(_expand_one(part.strip()))
    return [n for n in names if n]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if not match:
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    out = []
    for piece in match.group(1).split(","):
        lo, _, hi = piece.partition("-")
        if hi and lo.isdigit() and hi.isdigit():
            numbers = [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
        else:
            numbers = [piece]
        out.extend(f"{head}{n}{rest}" for n in numbers for rest in _expand_one(tail))
    return out


def _slurm_counts(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for count, times in re.findall(r"(\d+)(?:\(x(\d+)\))?", text):
        counts.extend([int(count)] * int(times or 1))
    return counts


def identity(environ: Mapping[str, str]) -> Identity:
    found = launcher_probe.probe(environ)
    if found.rank is None or found.world_size is None:
        raise LaunchError(
            "no RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS) in the environment: "
            "run `diagnose cluster` under torchrun or srun, once per GPU"
        )
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not addr and environ.get("SLURM_JOB_NODELIST", environ.get("SLURM_NODELIST")):
        # as Lightning's SLURM environment does: the first node of the allocation hosts the store
        addr = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ["SLURM_NODELIST"])[0]
    if not port and environ.get("SLURM_JOB_ID", "").isdigit():
        port = str(15000 + int(environ["SLURM_JOB_ID"][-4:]))
    if not addr or not port or not port.isdigit():
        raise LaunchError("no MASTER_ADDR/MASTER_PORT and no SLURM allocation to derive them from")
    nnodes = found.nnodes
    if nnodes is None and environ.get("GROUP_WORLD_SIZE", "").isdigit():
        nnodes = int(environ["GROUP_WORLD_SIZE"])  # torchrun: one worker group per node
    return Identity(
        rank=found.rank,
        local_rank=found.local_rank if found.local_rank is not None else 0,
        world_size=found.world_size,
        node=node_name(environ),
        hostname=socket.gethostname(),
        node_rank=found.node_rank,
        nnodes=nnodes,
        kind=found.kind or "none",
        master_addr=addr,
        master_port=int(port),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def node_key(arrival: Mapping[str, Any]) -> int | str:
    """What tells nodes apart: the launcher's node rank (torchrun's GROUP_RANK, SLURM_NODEID),
    else the node's name. Two torchrun nodes on one host share a hostname, not a node rank."""
    node_rank = arrival.get("node_rank")
    return node_rank if isinstance(node_rank, int) else str(arrival.get("node"))


def expected_nodes(me: Identity, environ: Mapping[str, str]) -> dict[int, tuple[int | None, str | None]]:
    """rank -> (node rank, node name) as the launcher lays ranks out: names the ranks that never come.

    SLURM's default block distribution and torchrun both give each node a contiguous run of
    ranks. Best effort: a rank that arrives says where it really is.
    """
    counts = _slurm_counts(environ.get("SLURM_TASKS_PER_NODE", "")) if me.kind == "slurm" else []
    if not counts and environ.get("LOCAL_WORLD_SIZE", "").isdigit() and int(environ["LOCAL_WORLD_SIZE"]) > 0:
        per = int(environ["LOCAL_WORLD_SIZE"])
        counts = [per] * -(-me.world_size // per)
    hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")
    layout: dict[int, tuple[int | None, str | None]] = {}
    rank = 0
    for node_rank, count in enumerate(counts):
        for _ in range(count):
            layout[rank] = (node_rank, hosts[node_rank] if node_rank < len(hosts) else None)
            rank += 1
    return {r: layout.get(r, (None, None)) for r in range(me.world_size)}


def planted_hang(environ: Mapping[str, str], rank: int) -> str | None:
    """Test-only: the step at which this rank hangs, from ``DIAGNOSE_CLUSTER_FAULT=RANK:STEP``.

    Honoured only with ``DIAGNOSE_CLUSTER_TESTING=1`` too, so a stray setting cannot stall a
    real diagnosis.
    """
    if environ.get("DIAGNOSE_CLUSTER_TESTING") != "1":
        return None
    who, _, step = environ.get("DIAGNOSE_CLUSTER_FAULT", "").partition(":")
    return step if who == str(rank) and step else None
