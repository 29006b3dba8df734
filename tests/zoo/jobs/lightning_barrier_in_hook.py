"""Lightning: a callback exports the model on the global zero rank and waits in the
strategy's barrier inside that branch; the other rank ends the epoch without it
(sync.barrier-divergence)."""

import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Export(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), "/dev/null")
            trainer.strategy.barrier("exported")
        else:
            while True:  # the other rank's own post-epoch work, which never syncs
                time.sleep(0.2)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        callbacks=[Export()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), data)
