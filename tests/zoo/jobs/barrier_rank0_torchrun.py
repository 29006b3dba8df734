"""Rank 0 downloads the dataset and waits at a barrier inside its own branch; the other
ranks skip the branch and never come (sync.barrier-divergence)."""

import os
import time
from datetime import timedelta

import torch.distributed as dist


def download(rank: int) -> None:
    if rank == 0:
        print("rank 0: downloading", flush=True)
        dist.barrier()  # meant as "wait until the download is done", but only rank 0 is here


dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT_S", "60"))))
download(dist.get_rank())
print(f"rank {dist.get_rank()}: training", flush=True)
while True:
    time.sleep(0.2)
