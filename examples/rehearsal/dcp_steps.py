"""A training script that checkpoints with PyTorch Distributed Checkpoint the way TorchTitan does: every
`--save_every` steps each rank writes its part of `step-N/` under the folder it is given (`__<rank>_0.distcp`;
the coordinator adds `.metadata` once every rank is done), and on start every rank loads the newest `step-N/`
that has a `.metadata`. Nothing in it knows about the launcher but the folder it is given:

    distributed_run.sh examples/rehearsal/dcp_steps.py --checkpoint_folder '${CHECKPOINT_DIR}'

On load a rank reads other ranks' files: DCP stores a tensor every rank holds (DDP's weights) once, in one
rank's file, and each rank here also keeps a counter of its own, which the rank that has its number next time
reads, on whichever node the rendezvous put it. Rank 0 then checks that every rank resumed from the same step
and says which. The fault catalog rehearses it with a child killed mid-run (`make faults ENTRIES=dcp-steps`).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel


def newest_step(folder: str) -> int | None:
    """The newest `step-N/` in `folder` whose coordinator finished it (TorchTitan's test: a `.metadata`)."""
    steps = [
        int(match.group(1))
        for name in (os.listdir(folder) if os.path.isdir(folder) else [])
        if (match := re.fullmatch(r"step-(\d+)", name)) and os.path.isfile(os.path.join(folder, name, ".metadata"))
    ]
    return max(steps, default=None)


def state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, own: torch.Tensor) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    rank = dist.get_rank()
    return {"model": model_state, "optim": optimizer_state, "step": torch.tensor(step), f"rank_{rank}": own}


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP training checkpointed with torch.distributed.checkpoint")
    parser.add_argument("--checkpoint_folder", required=True)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--save_every", type=int, default=10)
    parser.add_argument("--seconds_per_step", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    own = torch.zeros(1)  # how many steps this rank number has trained, over every attempt
    start = 0
    found = newest_step(args.checkpoint_folder)
    if found is not None:
        loaded = state(model, optimizer, 0, own)
        dcp.load(loaded, checkpoint_id=os.path.join(args.checkpoint_folder, f"step-{found}"))
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
        start, own = int(loaded["step"]), loaded[f"rank_{rank}"]
    everyone: list[object] = [None] * world
    dist.all_gather_object(everyone, (start, int(own.item())))
    if rank == 0:
        if found is None:
            print("no checkpoint on any node: training from step 0", flush=True)
        elif len(set(everyone)) == 1:
            print(f"resumed from step-{start} on all {world} ranks", flush=True)
        else:
            raise SystemExit(f"ranks resumed from different steps (step, own count): {everyone}")
    generator = torch.Generator().manual_seed(rank)
    for step in range(start + 1, args.steps + 1):
        optimizer.zero_grad()
        inputs = torch.randn(32, 16, generator=generator)
        F.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True)).backward()
        optimizer.step()
        own += 1
        time.sleep(args.seconds_per_step)
        if step % args.save_every == 0:
            dcp.save(
                state(model, optimizer, step, own), checkpoint_id=os.path.join(args.checkpoint_folder, f"step-{step}")
            )
            if rank == 0:
                print(f"saved step-{step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
