"""What the step timing adds to one DDP step, in one process: for bench/step_timing_bench.py. Two copies of
bench/ddp_steps.py's model (8 layers of 512, 8 gradient buckets; --width and --depth for others) under
DistributedDataParallel, world size 1 over gloo: one as DDP runs it, one through step_timing.patch (its
forward wrapped, its parameters' gradients hooked), as in a training process the launcher started. Blocks of
steps alternate between the two, so that the machine's load falls on both alike; prints the median step of
each."""

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "container" / "launcher"))
from step_timing import StepClock, patch


def model(wrapper: type[DistributedDataParallel], width: int, depth: int) -> DistributedDataParallel:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU()) for _ in range(depth)]
    return wrapper(torch.nn.Sequential(*layers), bucket_cap_mb=4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512, help="each layer's; 8: a step of a few hundred us")
    parser.add_argument("--depth", type=int, default=8)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    folder = tempfile.mkdtemp()
    clock = StepClock(os.path.join(folder, "rank-0.txt"), 3600.0)
    # The launcher's patch, on a subclass of its own so that the plain model keeps torch's class as it is.
    timed_module = types.SimpleNamespace(DistributedDataParallel=type("Timed", (DistributedDataParallel,), {}),
                                         torch=torch)  # fmt: skip
    patch(timed_module, clock)  # type: ignore[arg-type]
    shape = (args.width, args.depth)
    plain, with_timing = model(DistributedDataParallel, *shape), model(timed_module.DistributedDataParallel, *shape)
    inputs = torch.randn(64, args.width)
    optimizers = {id(m): torch.optim.SGD(m.parameters(), lr=0.01) for m in (plain, with_timing)}

    def block(ddp: DistributedDataParallel) -> float:
        optimizer = optimizers[id(ddp)]
        start = time.perf_counter()
        for _ in range(args.steps):
            optimizer.zero_grad()
            ddp(inputs).square().mean().backward()
            optimizer.step()
        return (time.perf_counter() - start) / args.steps

    for _ in range(2):  # warm-up: DDP rebuilds its buckets after the first step; the timing keeps its first hooks
        block(plain), block(with_timing)
    times: dict[bool, list[float]] = {False: [], True: []}
    for k in range(args.blocks):
        for timing in (k % 2 == 0, k % 2 == 1):
            times[timing].append(block(with_timing if timing else plain))
    print(f"plain_seconds={statistics.median(times[False]):.7f} timed_seconds={statistics.median(times[True]):.7f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
