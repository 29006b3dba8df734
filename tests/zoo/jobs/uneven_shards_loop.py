"""A hand-written DDP-style loop over a hand-made split that leaves the remainder on rank 0:
rank 0 runs one more step, whose all_reduce rank 1 never joins (sync.uneven-batches)."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT_S", "60"))))
rank, world = dist.get_rank(), dist.get_world_size()
samples = list(range(11))
mine = samples[rank::world]  # 6 samples on rank 0, 5 on rank 1
model = torch.nn.Linear(4, 1)
for step, _ in enumerate(mine):
    model.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    print(f"rank {rank}: step {step}", flush=True)
print(f"rank {rank}: epoch done", flush=True)
dist.barrier()
