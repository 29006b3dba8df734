"""Lightning DDP: the model has a head it never uses in training_step, so its parameters
get no gradient and DDP's reducer complains on the next step (ddp.unused-parameters)."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.aux_head = torch.nn.Linear(4, 2)  # only used at inference

    def training_step(self, batch, _):
        return self.body(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
