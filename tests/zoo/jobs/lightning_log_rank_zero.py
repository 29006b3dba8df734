"""Lightning: the validation loss is logged with sync_dist=True, but only under
`if self.trainer.is_global_zero:`; rank 0 alone reduces it at the end of validation and
waits for a peer that never joins (sync.log-rank-zero-only)."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, _):
        loss = self.layer(batch[0]).pow(2).mean()
        if self.trainer.is_global_zero:
            self.log("val_loss", loss, sync_dist=True)

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
    )
    trainer.fit(Model(), data, data)
