"""Each rank gathers the predictions of its own shard, and the shards differ in length:
all_gather needs the same shape on every rank (collective mismatch)."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT_S", "60"))))
rank, world = dist.get_rank(), dist.get_world_size()
predictions = torch.arange(10 + rank, dtype=torch.float32)  # 10 on rank 0, 11 on rank 1
gathered = [torch.empty_like(predictions) for _ in range(world)]
dist.all_gather(gathered, predictions)
print(f"rank {rank}: {sum(g.numel() for g in gathered)} predictions", flush=True)
dist.destroy_process_group()
