"""Lightning with strategy="ddp_spawn": the model holds a lambda, which cannot be pickled to
the spawned processes (launch.spawn-pickling)."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.activation = lambda x: x.clamp(min=0)

    def training_step(self, batch, _):
        return self.activation(self.layer(batch[0])).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
