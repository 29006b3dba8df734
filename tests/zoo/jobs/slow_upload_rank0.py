"""Fabric: rank 0 uploads the checkpoint to remote storage (slow, waiting on the network)
while rank 1 waits at the barrier after it (sync.collective-timeout)."""

import time

import torch
from lightning.fabric import Fabric


def upload(path: str) -> None:
    time.sleep(3600)  # a slow object store; no CPU used while it waits


fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model = torch.nn.Linear(4, 1)
fabric.print("epoch 0 done")
if fabric.global_rank == 0:
    torch.save(model.state_dict(), "checkpoint.pt")
    upload("checkpoint.pt")
fabric.barrier()
fabric.print("checkpoint uploaded")
