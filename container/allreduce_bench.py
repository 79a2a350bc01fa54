"""All-reduce bandwidth across every process of a torch.distributed job.

Run it through the launcher, on one node or many:

    distributed_run.sh allreduce_bench.py --size-mb 256 --iters 20

NCCL on GPUs (its network plugin uses EFA through aws-ofi-nccl), gloo on CPU. Neuron devices are
not measured here. Rank 0 prints one JSON line: world_size, backend, bytes, algbw_gbps and
busbw_gbps in gigabits per second (busbw = algbw * 2 (n - 1) / n, the nccl-tests convention; the
same figures in gigabytes per second, as nccl-tests prints them, are in algbw_GBps / busbw_GBps).
The result is checked: every element must equal the world size after a sum of ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="torch.distributed all-reduce bandwidth")
    parser.add_argument("--size-mb", type=float, default=64.0, help="message size in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    args = parser.parse_args(argv)
    if args.size_mb <= 0 or args.iters < 1 or args.warmup < 0:
        parser.error("--size-mb must be > 0, --iters >= 1, --warmup >= 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if use_cuda else torch.device("cpu")

    elements = max(1, int(args.size_mb * 1024 * 1024) // 4)
    tensor = torch.ones(elements, dtype=torch.float32, device=device)

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        dist.all_reduce(tensor)
    tensor.fill_(1.0)
    dist.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
    sync()
    seconds = (time.perf_counter() - start) / args.iters

    dist.all_reduce(tensor)
    correct = bool(torch.all(tensor == float(world)).item())
    nbytes = elements * 4
    algbw = nbytes / seconds  # bytes per second
    busbw = algbw * 2 * (world - 1) / world if world > 1 else algbw
    if rank == 0:
        line = {
            "world_size": world,
            "backend": backend,
            "bytes": nbytes,
            "algbw_gbps": round(algbw * 8 / 1e9, 3),
            "busbw_gbps": round(busbw * 8 / 1e9, 3),
            "algbw_GBps": round(algbw / 1e9, 3),
            "busbw_GBps": round(busbw / 1e9, 3),
            "seconds_per_iter": round(seconds, 6),
            "correct": correct,
        }
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
