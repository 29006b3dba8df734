"""Rank 1 looks up a setting its config lacks and raises; rank 0 then loses its peer in the
next all_reduce. Nothing more specific than "one rank failed first" (hang.rank-failed-first)."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

CONFIGS = [{"lr": 0.1, "warmup": 10}, {"lr": 0.1}]

dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get("HANG_TIMEOUT_S", "60"))))
rank = dist.get_rank()
warmup = CONFIGS[rank]["warmup"]
time.sleep(1.0)
dist.all_reduce(torch.ones(1))
