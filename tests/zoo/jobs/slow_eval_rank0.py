"""Rank 0 evaluates the whole validation set by itself after each epoch (busy computing) while
rank 1 is already waiting in the next epoch's all_reduce: a collective timeout in the making
(sync.collective-timeout)."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def evaluate(model: torch.nn.Module) -> float:
    total = 0.0
    x = torch.randn(64, 64)
    for _ in range(10**9):  # a long evaluation: minutes on a real validation set
        total += float((x @ x).sum())
    return total


dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT_S", "60"))))
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
for epoch in range(3):
    grad = torch.ones(4)
    dist.all_reduce(grad)
    print(f"rank {rank}: epoch {epoch} trained", flush=True)
    if rank == 0:
        print(f"evaluation: {evaluate(model)}", flush=True)
