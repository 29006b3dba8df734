"""Lightning: predictions are gathered for a report with self.all_gather, inside the global
zero branch of on_validation_epoch_end (sync.log-rank-zero-only)."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.outputs = []

    def training_step(self, batch, _):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, _):
        self.outputs.append(self.layer(batch[0]).detach())

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            everything = self.all_gather(torch.cat(self.outputs))
            print("report over", everything.shape, flush=True)
        self.outputs.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Model(), data, data)
