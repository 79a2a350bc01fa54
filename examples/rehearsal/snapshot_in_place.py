"""A training script shaped like PyTorch's DDP tutorial series (`multinode.py`): a Trainer class, a
DistributedSampler, and one snapshot file that `torch.save` rewrites in place every `--save_every` epochs and
that the script loads on start when it exists. Nothing in it knows about the launcher but the path it is
given, which the job's command names through the launcher's expansion:

    distributed_run.sh examples/rehearsal/snapshot_in_place.py --snapshot_path '${CHECKPOINT_DIR}/snapshot.pt'

The tutorial saves from each node's local rank 0; this script saves from global rank 0 (the main node's), as
many users do, so that every node restores the same snapshot (docs/checkpoints.md, "One file saved in place").
The fault catalog rehearses it with a child killed mid-run (`make faults ENTRIES=in-place-file`):
`--seconds_per_batch` paces the toy epochs, as real batches would.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model: torch.nn.Module, data: DataLoader[Any], save_every: int, snapshot_path: str) -> None:
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.data = data
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            print("Loading snapshot", flush=True)
            self._load_snapshot(snapshot_path)
        self.model = DistributedDataParallel(self.model)

    def _load_snapshot(self, path: str) -> None:
        snapshot = torch.load(path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def _run_epoch(self, epoch: int, pause: float) -> None:
        assert isinstance(self.data.sampler, DistributedSampler)
        self.data.sampler.set_epoch(epoch)
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
            time.sleep(pause)
        print(f"[RANK{self.global_rank}] Epoch {epoch} | loss {loss.item():.4f}", flush=True)

    def train(self, max_epochs: int, pause: float) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch, pause)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP training with one snapshot file saved in place")
    parser.add_argument("--total_epochs", type=int, default=40)
    parser.add_argument("--save_every", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--snapshot_path", default="snapshot.pt")
    parser.add_argument("--seconds_per_batch", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    generator = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 16, generator=generator), torch.randn(256, 1, generator=generator))
    data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    trainer = Trainer(torch.nn.Linear(16, 1), data, args.save_every, args.snapshot_path)
    trainer.train(args.total_epochs, args.seconds_per_batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
