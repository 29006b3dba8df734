"""probes.launcher over the variables each launcher really sets."""

from __future__ import annotations

import pytest

from probes import launcher

# what torchrun --nproc-per-node 4 --nnodes 2 sets for local rank 1 on the second node
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node-0",
    "MASTER_PORT": "29500",
}
# srun --ntasks-per-node 4 -N 2 inside sbatch
SLURM = {
    "SLURM_JOB_ID": "123456",
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_NNODES": "2",
    "SLURM_GPUS_ON_NODE": "4",
    "SLURM_JOB_NAME": "train",
}
MPIRUN = {
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}


def test_torchrun() -> None:
    found = launcher.probe(TORCHRUN)
    assert found.kind == "torchrun"
    assert (found.rank, found.local_rank, found.world_size, found.local_world_size, found.node_rank) == (5, 1, 8, 4, 1)
    assert (found.master_addr, found.master_port) == ("node-0", 29500)
    assert found.slurm_ntasks is None


def test_slurm() -> None:
    found = launcher.probe(SLURM)
    assert found.kind == "slurm"
    assert (found.rank, found.local_rank, found.world_size, found.node_rank) == (6, 2, 8, 1)
    assert (found.slurm_ntasks, found.slurm_ntasks_per_node, found.slurm_nnodes, found.slurm_gpus_on_node) == (
        8,
        4,
        2,
        4,
    )


def test_torchrun_inside_a_slurm_allocation_keeps_both() -> None:
    found = launcher.probe({**SLURM, **TORCHRUN})
    assert found.kind == "torchrun" and found.rank == 5 and found.slurm_ntasks == 8


def test_mpirun() -> None:
    found = launcher.probe(MPIRUN)
    assert (found.kind, found.rank, found.local_rank, found.world_size, found.local_world_size) == (
        "mpirun",
        3,
        3,
        4,
        4,
    )


def test_srun_with_pmi_is_slurm_not_mpirun() -> None:
    assert launcher.probe({**SLURM, "PMI_RANK": "6", "PMI_SIZE": "8"}).kind == "slurm"


def test_deepspeed_launcher() -> None:
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": "2"}
    found = launcher.probe(env)
    assert found.kind == "deepspeed" and found.local_world_size == 2


@pytest.mark.parametrize(("interactive", "kind"), [(True, "jupyter"), (False, "none"), (None, "none")])
def test_plain_python_or_a_notebook(interactive: bool | None, kind: str) -> None:
    found = launcher.probe({}, interactive=interactive)
    assert found.kind == kind and found.rank is None and found.world_size is None


def test_compressed_slurm_counts_and_bad_values() -> None:
    found = launcher.probe(
        {"SLURM_JOB_ID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)", "RANK": "zero", "MASTER_PORT": "29500x"}
    )
    assert found.slurm_ntasks_per_node == 4
    assert found.rank is None and found.unavailable["rank"] == "RANK='zero' is not a count"
    assert found.master_port is None and "MASTER_PORT" in found.unavailable["master_port"]
