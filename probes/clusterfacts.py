"""How the nodes of one job compare: the analysis behind the cluster section's derived facts.

Plain functions over plain values (variable tables, versions, bandwidths, placements), so the
policy (which variables every node must agree on, what makes a node slow, when ranks and GPUs
do not match) reads in one place; ``probes.facts.Cluster`` only picks the values out of its
nodes and ranks.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

# Variables every node of one job should agree on; rank- and node-specific ones (RANK,
# SLURM_NODEID, TORCHELASTIC_*, CUDA_VISIBLE_DEVICES) legitimately differ and are left out.
AGREED_ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "GLOO_")
AGREED_ENV_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF"})
NODE_SPECIFIC_ENV = frozenset({"CUDA_VISIBLE_DEVICES"})
# A node is slow when its inter-node bandwidth is below this share of the median of all nodes'.
SLOW_NODE_FRACTION = 0.5


def agreed(name: str) -> bool:
    """Whether every node of a job should set variable ``name`` the same way."""
    return name not in NODE_SPECIFIC_ENV and (name in AGREED_ENV_NAMES or name.startswith(AGREED_ENV_PREFIXES))


def differing_env(envs: Sequence[Mapping[str, str]]) -> list[str] | None:
    """Job-wide variables whose value differs between the nodes' environments; unset counts."""
    if len(envs) < 2:
        return None
    names = {name for env in envs for name in env if agreed(name)}
    return sorted(name for name in names if len({env.get(name) for env in envs}) > 1)


def differing_versions(per_node: Sequence[Mapping[str, str | None]]) -> list[str] | None:
    """Components with different known versions on different nodes; an unknown version is no evidence."""
    if len(per_node) < 2:
        return None
    seen: dict[str, set[str]] = {}
    for versions in per_node:
        for name, version in versions.items():
            if version is not None:
                seen.setdefault(name, set()).add(version)
    return sorted(name for name, versions in seen.items() if len(versions) > 1)


def missing_nodes(ranks: Iterable[tuple[str | None, str]]) -> list[str]:
    """Nodes none of whose ranks joined, from (node, state) per rank."""
    ranks = list(ranks)
    joined = {node for node, state in ranks if state != "missing"}
    return sorted({node or "?" for node, state in ranks if state == "missing" and node not in joined})


def slow_nodes(measured: Sequence[tuple[str, float]]) -> list[str] | None:
    """Nodes whose inter-node bandwidth is well under the median of all nodes'."""
    if len(measured) < 2:
        return None
    median = statistics.median(gbps for _, gbps in measured)
    return [name for name, gbps in measured if gbps < SLOW_NODE_FRACTION * median]


def shared_devices(placements: Iterable[tuple[str | None, str, int]]) -> list[str] | None:
    """Ranks that took the same GPU on one node, from (node, device uuid, rank), as ``"node: ranks 0,1"``."""
    placed: dict[tuple[str | None, str], list[int]] = {}
    for node, uuid, rank in placements:
        placed.setdefault((node, uuid), []).append(rank)
    if not placed:
        return None
    return [f"{node}: ranks {','.join(map(str, ranks))}" for (node, _), ranks in placed.items() if len(ranks) > 1]


def ranks_exceed_gpus(nodes: Sequence[tuple[str, int, int]]) -> list[str]:
    """Nodes running more ranks than they have GPUs, from (node, ranks, GPU slots): two ranks share a device."""
    return [name for name, ranks, slots in nodes if ranks > slots]


def gpus_exceed_ranks(nodes: Sequence[tuple[str, int, int]]) -> list[str]:
    """Nodes with GPUs that no rank uses, from (node, ranks, GPU slots)."""
    return [name for name, ranks, slots in nodes if ranks < slots]
