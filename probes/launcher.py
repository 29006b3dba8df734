"""The ``launcher`` section: what started this process, read from the variables it sets.

The process launcher (torchrun, srun, mpirun, deepspeed) decides ``kind``; a torchrun
inside a SLURM allocation is ``torchrun`` with the ``slurm_*`` fields still filled, since
rules compare the allocation with the devices either way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from probes.facts import Launcher

# field -> variables that carry it, first found wins: the launcher's own name before the
# scheduler's, because the launcher is what the training code reads.
_INT_FIELDS: dict[str, tuple[str, ...]] = {
    "rank": ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
    "local_rank": ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
    "world_size": ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
    "local_world_size": ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_SIZE"),
    "node_rank": ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID"),
    "nnodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "master_port": ("MASTER_PORT",),
    "slurm_ntasks": ("SLURM_NTASKS",),
    "slurm_ntasks_per_node": ("SLURM_NTASKS_PER_NODE",),
    "slurm_nnodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "slurm_gpus_on_node": ("SLURM_GPUS_ON_NODE",),
}

_COUNT = re.compile(r"^\s*(\d+)\s*$")
# SLURM writes per-node counts compressed: "4(x2),2" means 4 on two nodes then 2.
_SLURM_COUNT = re.compile(r"^\s*(\d+)")


def detect_kind(environ: Mapping[str, str], interactive: bool | None = None) -> str:
    if "TORCHELASTIC_RUN_ID" in environ:
        return "torchrun"
    # deepspeed's own launcher sets these next to RANK/LOCAL_RANK
    if "CROSS_RANK" in environ and "LOCAL_SIZE" in environ:
        return "deepspeed"
    if "OMPI_COMM_WORLD_SIZE" in environ or ("PMI_RANK" in environ and "SLURM_JOB_ID" not in environ):
        return "mpirun"
    if "SLURM_JOB_ID" in environ:
        return "slurm"
    if "LOCAL_RANK" in environ and "WORLD_SIZE" in environ:
        # torch.distributed.launch without elastic, or a hand-rolled spawner
        return "torchrun"
    if interactive:
        return "jupyter"
    return "none"


def probe(environ: Mapping[str, str] | None = None, *, interactive: bool | None = None) -> Launcher:
    environ = os.environ if environ is None else environ
    launcher = Launcher(source="live", kind=detect_kind(environ, interactive))
    for field, names in _INT_FIELDS.items():
        for name in names:
            if name not in environ:
                continue
            raw = environ[name]
            match = (_SLURM_COUNT if name.startswith("SLURM_") else _COUNT).match(raw)
            if match:
                setattr(launcher, field, int(match.group(1)))
            else:
                launcher.unavailable[field] = f"{name}={raw!r} is not a count"
            break
    launcher.master_addr = environ.get("MASTER_ADDR") or None
    reason = "chosen inside the training script; not visible from the environment"
    launcher.unavailable.setdefault("strategy", reason)
    launcher.unavailable.setdefault("devices_requested", reason)
    return launcher
