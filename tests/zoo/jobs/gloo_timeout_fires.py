"""mp.spawn with a short process-group timeout: rank 0 writes a large checkpoint and is late,
rank 1's next all_reduce times out (sync.collective-timeout)."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=2))
    if rank == 0:
        time.sleep(6)  # saving the checkpoint takes longer than the timeout
    grad = torch.ones(4)
    dist.all_reduce(grad)


if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
