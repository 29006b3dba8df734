"""The lightning_fit micro-test: a tiny LightningModule fit for a few steps with a strategy.

Only rank processes import this module (it imports Lightning at the top, so the module class
can be pickled by the ddp_spawn launcher). With ddp, fsdp and deepspeed each rank sets
``LOCAL_RANK`` as torchrun would; with ddp_spawn one process fits and Lightning spawns the
ranks, as ``python train.py`` would.
"""

from __future__ import annotations

import math
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import LightningEnvironment
except ImportError:  # the standalone package
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import LightningEnvironment

from probes.microtests.channel import Channel
from probes.microtests.checks import Context

STEPS = 4


class TinyModule(pl.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.out = out
        self.channel: Channel | None = None
        self.last_loss: float | None = None

    def setup(self, stage: str) -> None:
        # Runs in each rank after the process group is up: only now is global_rank known.
        self.channel = Channel(self.out, self.global_rank)
        self.channel.step("setup")

    def training_step(self, batch, batch_idx):
        self.channel.step(f"training_step {batch_idx}")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.last_loss = float(loss.detach())
        return loss

    def on_fit_end(self) -> None:
        self.channel.measure(global_step=self.trainer.global_step)
        if self.last_loss is not None:
            self.channel.measure(loss_finite=math.isfinite(self.last_loss))
        self.channel.step("fit done")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator))
        return DataLoader(data, batch_size=4)


def _strategy(ctx: Context):
    options = {"process_group_backend": ctx.backend, "timeout": ctx.remaining()}
    if ctx.strategy == "ddp":
        return pl.strategies.DDPStrategy(**options)
    if ctx.strategy == "ddp_spawn":
        return pl.strategies.DDPStrategy(start_method="spawn", **options)
    if ctx.strategy == "fsdp":
        return pl.strategies.FSDPStrategy(**options)
    if ctx.strategy == "deepspeed":
        return pl.strategies.DeepSpeedStrategy(**options)
    raise ValueError(f"unknown strategy {ctx.strategy!r}")


def _as_launched(ctx: Context) -> None:
    """Set the variables a launcher would have: a group's ranks were started before the plan."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ctx.port), NODE_RANK="0")
    if ctx.rank is not None:
        # Lightning reads LOCAL_RANK as the sign that a launcher (torchrun) made the ranks.
        os.environ["LOCAL_RANK"] = str(ctx.rank)


def fit(ctx: Context) -> None:
    _as_launched(ctx)
    ctx.channel.step("trainer")
    trainer = pl.Trainer(
        accelerator="gpu" if ctx.cuda else "cpu",
        devices=ctx.world_size,
        num_nodes=1,
        strategy=_strategy(ctx),
        plugins=[LightningEnvironment()],
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=ctx.out,
    )
    ctx.channel.step("fit")
    start = time.perf_counter()
    trainer.fit(TinyModule(ctx.out))
    if trainer.global_rank == 0:
        ctx.channel.measure(fit_s=round(time.perf_counter() - start, 3), strategy=ctx.strategy)
