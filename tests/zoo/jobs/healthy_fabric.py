"""Healthy control: Fabric, rank 0 saves inside its branch and the barrier is outside it."""

import os

import torch
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model = torch.nn.Linear(4, 1)
model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(3):
    fabric.backward(model(torch.randn(2, 4)).sum())
if fabric.global_rank == 0:
    torch.save(model.state_dict(), "/dev/null")
fabric.barrier()
fabric.print("done")
os._exit(0)  # gloo's teardown at exit aborts now and then under torch 2.13: leave at once
