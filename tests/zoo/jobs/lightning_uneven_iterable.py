"""Lightning with an IterableDataset sharded by rank: the shards differ in length, so one rank
runs more training steps than the other and waits for it in DDP's gradient all_reduce
(sync.uneven-batches)."""

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset


class Shard(IterableDataset):
    def __iter__(self):
        rank = torch.distributed.get_rank()
        for i in range(5 if rank == 0 else 3):  # the files of rank 0 hold more records
            yield torch.full((4,), float(i))


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    # the checkpoint at the end of the epoch: the rank that ran out of data waits there
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        default_root_dir=".",
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(Shard(), batch_size=1))
