"""Each rank builds its model from a config it reads itself, and the ranks disagree on the
hidden size: DDP's construction finds parameters of different shapes (ddp.param-shape-mismatch)."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
hidden = 16 if dist.get_rank() == 0 else 32  # a stale config file on one node
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1)))
print("model ready", os.getpid(), flush=True)
