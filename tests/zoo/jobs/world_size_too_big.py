"""mp.spawn starts two processes for a world size of three: both wait in rendezvous for a
third rank that is never started (hang.rendezvous-stall)."""

import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 3  # copied from the 3-GPU machine's script


def work(rank: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    print(f"rank {rank}: joining", flush=True)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)


if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
