"""Fabric: the checkpoint is written on rank 0, which then waits in fabric.barrier() inside
its `if` block; rank 1 goes on with its next epoch (sync.barrier-divergence)."""

import time

import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model = fabric.setup(torch.nn.Linear(4, 1))
for epoch in range(3):
    if fabric.global_rank == 0:
        torch.save(model.state_dict(), "/dev/null")
        fabric.barrier()
    fabric.print(f"epoch {epoch} done")
    time.sleep(0.1)
while True:  # the rest of rank 1's program
    time.sleep(0.2)
