"""A small training script that behaves like a real one where recovery is concerned: it trains a toy model
with DistributedDataParallel (gloo on CPU, NCCL on GPUs), saves a checkpoint every K steps into the
launcher's CHECKPOINT_DIR, and resumes from the newest complete checkpoint it finds there. It is what
`trainctl rehearse` runs by default; copy it as the skeleton of a script that survives retries.

    distributed_run.sh examples/rehearsal/train.py --steps 80 --checkpoint-every 10 --step-seconds 0.1

Checkpoints: rank 0 writes `checkpoint-<step>.pt` under a temporary name and renames it into place, so a
file with the final name is always whole (the launcher uploads it at once, container/launcher/checkpoint_sync.py).
On start, every rank looks for the newest file that loads (a torn one is skipped, older ones are tried):
rank 0 may have run on any node in the last attempt, and each node restores its own files, so the ranks
agree on the newest step and the rank holding it sends its weights to the others.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

NAME = re.compile(r"^checkpoint-(\d+)\.pt$")


def say(message: str) -> None:
    print(f"train.py: rank {dist.get_rank()}: {message}", flush=True)


def newest_checkpoint(folder: Path) -> tuple[int, dict[str, object]] | None:
    found = sorted(
        ((int(m.group(1)), p) for p in folder.glob("checkpoint-*.pt") if (m := NAME.match(p.name))), reverse=True
    )
    for step, path in found:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a torn or foreign file: try an older one
            say(f"skipping {path.name}: {error.__class__.__name__}")
            continue
        return step, state
    return None


def save(folder: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"checkpoint-{step}.pt"
    partial = folder / f".checkpoint-{step}.pt.partial"
    torch.save({"model": model.state_dict(), "step": step}, partial)
    os.replace(partial, final)
    say(f"saved {final.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="extra time per step (a bigger model)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda") if cuda else torch.device("cpu")
    folder = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    # Rank 0 may live on any node (the rendezvous orders nodes by host name and process id), and each node
    # restores its own files: the rank that holds the newest checkpoint hands it to the others.
    found = newest_checkpoint(folder)
    mine = torch.tensor([found[0] if found else 0], dtype=torch.long, device=device)
    newest = mine.clone()
    dist.all_reduce(newest, op=dist.ReduceOp.MAX)
    start = int(newest.item())
    holder = torch.tensor([dist.get_rank() if found and found[0] == start else dist.get_world_size()], device=device)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    if start == 0:
        if dist.get_rank() == 0:
            say("no checkpoint on any node: starting at step 0")
    else:
        holder_rank = int(holder.item())
        if dist.get_rank() == holder_rank and found is not None:
            model.load_state_dict(found[1]["model"])  # type: ignore[arg-type]
        # SGD without momentum keeps no state: the weights are all there is to hand over.
        for parameter in model.parameters():
            dist.broadcast(parameter.data, src=holder_rank)
        if dist.get_rank() == 0:
            say(f"resumed from checkpoint-{start}.pt (step {start}, held by rank {holder_rank})")
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    target = torch.arange(16, dtype=torch.float32, device=device)
    loss = torch.zeros(1, device=device)
    for step in range(start + 1, args.steps + 1):
        inputs = torch.randn(32, 16, device=device)
        loss = ((ddp(inputs).squeeze(1) - inputs @ target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_seconds)
        # Progress for the launcher's hang watch (TRAINING_HEARTBEAT_FILE, docs/health.md).
        Path(os.environ.get("TRAINING_HEARTBEAT_FILE", os.devnull)).touch()
        if step % args.checkpoint_every == 0 and dist.get_rank() == 0:
            save(folder, step, model, optimizer)
    dist.barrier()
    say(f"done at step {args.steps}, loss {loss.item():.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
