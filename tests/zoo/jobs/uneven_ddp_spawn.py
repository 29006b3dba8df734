"""mp.spawn workers split a list by rank and train with DistributedDataParallel; rank 1 runs
out of batches first and waits to save, rank 0 waits for it in its last step's gradient
all_reduce (sync.uneven-batches)."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def work(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT_S", "60")))
    )
    model = DDP(torch.nn.Linear(4, 1))
    batches = torch.randn(7, 4)[rank::world].split(1)  # 4 batches on rank 0, 3 on rank 1
    for step, batch in enumerate(batches):
        model(batch).sum().backward()
        print(f"rank {rank}: step {step}", flush=True)
    print(f"rank {rank}: finished", flush=True)
    dist.barrier()  # everyone done before rank 0 saves


if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1]), nprocs=2)
