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

Options that make it behave like scripts that give recovery trouble (the fault catalog uses them):
`--fail-at-step N` (every rank raises a ValueError at step N: a plain bug), `--silent-save-seconds S` (rank
0's first save takes S seconds and prints nothing, as a large model's first save does, while the other ranks
wait in the next collective), `--compile-seconds S` (before the first step every rank waits for a silent child
process that burns CPU for S seconds, as neuronx-cc's or torch.compile's workers do; a whole core, or the
share `--compile-share F` gives). `--compute-seconds S` waits S seconds per step between the forward and
the backward in 1 ms slices, as a GPU rank waits on its kernels (the straggler entries time it).
`--gradients allreduce` does DDP's and torch.optim's work by hand (an all-reduce per gradient, then the SGD
step): the same collectives, without the first DistributedDataParallel and optimizer importing
torch._dynamo (about 3 s of CPU per rank on torch 2.x, measured with cProfile), which the fault catalog pays
on every attempt on a two-core machine. Scripts of your own use DDP.

Rehearsal only: `trainctl rehearse` sets REHEARSAL_STALL_FILE on every node, and its stall-rank fault
creates that file with a local rank in it; that rank then sleeps at its next step, silent and runnable (not
stopped), while its peers wait in the next collective: a rank stuck in user code. Nothing else sets the
variable, so the hook is inert on AWS.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

NAME = re.compile(r"^checkpoint-(\d+)\.pt$")
STALL_VARIABLE = "REHEARSAL_STALL_FILE"
# What a compiler's worker does, for as many seconds as it is given: burn CPU and print nothing.
# A compiler's worker: for argv[1] seconds, busy for argv[2] of every 0.2 s and asleep for the rest.
BURN = """import sys, time
end, share = time.monotonic() + float(sys.argv[1]), float(sys.argv[2])
while time.monotonic() < end:
    busy = time.monotonic() + 0.2 * share
    while time.monotonic() < busy:
        pass
    time.sleep(0.2 * (1 - share))
"""


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


def write_slowly(path: Path, data: bytes, seconds: float, chunks: int = 20) -> None:
    """Write `data` to `path` in chunks spread over `seconds`, printing nothing (a big model's first save)."""
    size = max(1, -(-len(data) // chunks))
    with path.open("wb") as out:
        for start in range(0, max(len(data), 1), size):
            out.write(data[start : start + size])
            out.flush()
            time.sleep(seconds / chunks)


def save(folder: Path, step: int, model: torch.nn.Module, slow_seconds: float = 0.0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"checkpoint-{step}.pt"
    partial = folder / f".checkpoint-{step}.pt.partial"
    state = {"model": model.state_dict(), "step": step}
    if slow_seconds > 0:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        write_slowly(partial, buffer.getvalue(), slow_seconds)
    else:
        torch.save(state, partial)
    os.replace(partial, final)
    say(f"saved {final.name}")


def compile_workers(seconds: float, share: float = 1.0) -> None:
    """Wait for a silent child that burns `share` of a core for `seconds`, as a rank waits for its compiler's
    workers."""
    subprocess.run(  # noqa: S603 - this interpreter, with the script's own code
        [sys.executable, "-c", BURN, str(seconds), str(share)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def compute(seconds: float, slice_seconds: float = 0.001) -> None:
    """`seconds` of work in slices of 1 ms, each a sleep, as a GPU rank waits on its kernels: it needs no
    CPU, so ranks side by side on a small machine do not slow each other, but a rank that is stopped part
    of the time (a slow node) gets through its slices only while it runs."""
    for _ in range(round(seconds / slice_seconds)):
        time.sleep(slice_seconds)


def stalled(environ: Mapping[str, str] = os.environ) -> bool:
    """Rehearsal only: this rank is the one the stall file names (its LOCAL_RANK; empty names rank 0)."""
    path = environ.get(STALL_VARIABLE)
    if not path or not os.path.exists(path):
        return False
    named = Path(path).read_text().strip() or "0"
    return named == environ.get("LOCAL_RANK", "0")


def averaged_sgd_step(model: torch.nn.Module, learning_rate: float = 0.05) -> None:
    """What DDP and torch.optim.SGD(lr=...) do together, by hand: average each gradient over the ranks (an
    all-reduce per parameter) and step against it."""
    for parameter in model.parameters():
        if parameter.grad is None:
            continue
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        with torch.no_grad():
            parameter -= learning_rate * parameter.grad / dist.get_world_size()
        parameter.grad = None


def check_batch(step: int, fail_at: int | None) -> None:
    """The user's own check of a batch; --fail-at-step makes it fail on every rank, as a bug would."""
    if fail_at is not None and step == fail_at:
        raise ValueError(f"step {step}: the batch has {step % 7} label columns, the model expects 1")


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.1, help="extra time per step (a bigger model)")
    parser.add_argument("--fail-at-step", type=int, default=None, help="every rank raises ValueError at this step")
    parser.add_argument("--silent-save-seconds", type=float, default=0.0, help="rank 0's first save takes this long")
    parser.add_argument("--compile-seconds", type=float, default=0.0, help="a silent CPU-bound child before step 1")
    parser.add_argument("--compile-share", type=float, default=1.0, help="the share of a core that child burns")
    parser.add_argument(
        "--compute-seconds", type=float, default=0.0, help="seconds each step's kernels take (1 ms sleeps)"
    )
    parser.add_argument(
        "--gradients",
        choices=("ddp", "allreduce"),
        default="ddp",
        help="ddp: DistributedDataParallel and torch.optim; allreduce: the same step by hand",
    )
    return parser.parse_args(argv)


def main() -> int:
    args = options()

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda") if cuda else torch.device("cpu")
    folder = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05) if args.gradients == "ddp" else None

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
    forward = DistributedDataParallel(model, device_ids=[device.index] if cuda else None) if optimizer else model
    target = torch.arange(16, dtype=torch.float32, device=device)
    loss = torch.zeros(1, device=device)
    if args.compile_seconds > 0:
        compile_workers(args.compile_seconds, args.compile_share)
    slow_save = args.silent_save_seconds
    for step in range(start + 1, args.steps + 1):
        while stalled():
            time.sleep(1)
        check_batch(step, args.fail_at_step)
        inputs = torch.randn(32, 16, device=device)
        loss = ((forward(inputs).squeeze(1) - inputs @ target) ** 2).mean()
        compute(args.compute_seconds)
        if optimizer:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            loss.backward()
            averaged_sgd_step(model)
        time.sleep(args.step_seconds)
        # Progress for the launcher's hang watch (TRAINING_HEARTBEAT_FILE, docs/health.md).
        Path(os.environ.get("TRAINING_HEARTBEAT_FILE", os.devnull)).touch()
        if step % args.checkpoint_every == 0 and dist.get_rank() == 0:
            save(folder, step, model, slow_save)
            slow_save = 0.0
    dist.barrier()
    say(f"done at step {args.steps}, loss {loss.item():.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
