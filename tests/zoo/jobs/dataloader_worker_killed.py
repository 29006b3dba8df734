"""A DataLoader worker is killed (here it kills itself, as the kernel's OOM killer would)
while the rank waits for its batch (dataloader.worker-killed)."""

import os
import signal

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.zeros(4)


dist.init_process_group("gloo")
for batch in DataLoader(Images(), batch_size=2, num_workers=1):
    dist.all_reduce(batch)
print("done", flush=True)
