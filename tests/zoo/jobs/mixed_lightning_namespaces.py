"""The model comes from `pytorch_lightning`, the Trainer from `lightning`: the Trainer does not
accept it (env.lightning-mixed-packages)."""

import lightning as L
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False)
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
