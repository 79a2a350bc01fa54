"""A training script that checkpoints the way Hugging Face's Trainer does: every `--save_steps` steps global
rank 0 writes `checkpoint-<step>/` file by file (weights, optimizer, scheduler, RNG state, and
`trainer_state.json` last), then removes all but the newest `--save_total_limit` folders; on start it resumes
from the newest `checkpoint-<step>/` by its number alone, as `transformers.trainer_utils.get_last_checkpoint`
does, without checking that the folder is whole. Nothing in it knows about the launcher but the folder it is
given:

    distributed_run.sh examples/rehearsal/trainer_folders.py --output_dir '${CHECKPOINT_DIR}'

`--megabytes_per_save` pads the optimizer file, written in 1 MiB pieces 50 ms apart, so that a save takes a while, as a
real one does; the fault catalog loses the saving host during one (`make faults ENTRIES=trainer-folders`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

FOLDER = re.compile(r"checkpoint-(\d+)")


def checkpoints(output_dir: str) -> list[str]:
    """`checkpoint-<step>` folders in `output_dir`, oldest first."""
    names = [name for name in os.listdir(output_dir) if FOLDER.fullmatch(name)] if os.path.isdir(output_dir) else []
    return [os.path.join(output_dir, name) for name in sorted(names, key=lambda name: int(name.split("-")[1]))]


def save(folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, padding: int) -> None:
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    # A real optimizer's state is twice the weights' size: padding stands in for it, written in 1 MiB pieces.
    buffer = io.BytesIO()
    torch.save({"state": optimizer.state_dict(), "padding": torch.ones(padding << 18)}, buffer)
    with open(os.path.join(folder, "optimizer.pt"), "wb") as out:
        view = buffer.getbuffer()
        for start in range(0, len(view), 1 << 20):
            out.write(view[start : start + (1 << 20)])
            out.flush()
            time.sleep(0.05)
    torch.save({"last_epoch": step}, os.path.join(folder, "scheduler.pt"))
    torch.save({"torch": torch.get_rng_state()}, os.path.join(folder, "rng_state.pth"))
    with open(os.path.join(folder, "trainer_state.json"), "w") as out:
        json.dump({"global_step": step, "log_history": []}, out)


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP training checkpointed as Hugging Face's Trainer does")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=80)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--save_total_limit", type=int, default=2)
    parser.add_argument("--seconds_per_step", type=float, default=0.0)
    parser.add_argument("--megabytes_per_save", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    found = checkpoints(args.output_dir)
    if found:
        newest = found[-1]
        with open(os.path.join(newest, "trainer_state.json")) as state:  # Trainer reads this first
            start = json.load(state)["global_step"]
        model.load_state_dict(torch.load(os.path.join(newest, "pytorch_model.bin")))
        optimizer.load_state_dict(torch.load(os.path.join(newest, "optimizer.pt"))["state"])
        if rank == 0:
            print(f"resumed from {os.path.basename(newest)} (global step {start})", flush=True)
    elif rank == 0:
        print("no checkpoint on any node: training from step 0", flush=True)
    ddp = DistributedDataParallel(model)
    generator = torch.Generator().manual_seed(rank)
    for step in range(start + 1, args.max_steps + 1):
        optimizer.zero_grad()
        inputs = torch.randn(32, 16, generator=generator)
        F.mse_loss(ddp(inputs), inputs.sum(dim=1, keepdim=True)).backward()
        optimizer.step()
        time.sleep(args.seconds_per_step)
        if step % args.save_steps == 0:
            if rank == 0:
                save(
                    os.path.join(args.output_dir, f"checkpoint-{step}"), model, optimizer, step, args.megabytes_per_save
                )
                for old in checkpoints(args.output_dir)[: -args.save_total_limit]:
                    shutil.rmtree(old)
                print(f"saved checkpoint-{step}", flush=True)
            dist.barrier()  # the other ranks wait for the save, as Trainer's do
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
