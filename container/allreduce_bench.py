"""All-reduce bandwidth across every process of a torch.distributed job.

Run it through the launcher, on one node or many:

    distributed_run.sh allreduce_bench.py --size-mb 256 --iters 20

NCCL on GPUs (its network plugin uses EFA through aws-ofi-nccl), the XLA backend on Neuron devices
(Neuron collectives over EFA, as in the AWS Neuron Batch all-reduce sample), gloo on CPU; `--backend`
picks one explicitly. Rank 0 prints one JSON line: world_size, backend, bytes, algbw_gbps and
busbw_gbps in gigabits per second (busbw = algbw * 2 (n - 1) / n, the nccl-tests convention; the
same figures in gigabytes per second, as nccl-tests prints them, are in algbw_GBps / busbw_GBps).
With the instance's published network bandwidth (--network-gbps, or NETWORK_GBPS as the job
definitions set it) it also prints busbw as a fraction of it and a one-word verdict. The result is
checked: every element must equal the world size after a sum of ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="torch.distributed all-reduce bandwidth")
    parser.add_argument("--size-mb", type=float, default=64.0, help="message size in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "xla", "gloo"),
        default="auto",
        help="auto: nccl with CUDA, else xla when torch_xla is installed (Neuron), else gloo",
    )
    parser.add_argument(
        "--network-gbps",
        type=float,
        default=float(os.environ.get("NETWORK_GBPS") or 0),
        help="the instance's published network bandwidth in Gbps (default: $NETWORK_GBPS; 0: unknown)",
    )
    args = parser.parse_args(argv)
    if args.size_mb <= 0 or args.iters < 1 or args.warmup < 0 or args.network_gbps < 0:
        parser.error("--size-mb must be > 0, --iters >= 1, --warmup >= 0, --network-gbps >= 0")
    return args


# Verdict thresholds on busbw / published bandwidth across nodes. They are this project's rules of
# thumb, not AWS figures: a healthy EFA fabric with 1 GiB messages reaches well over half of the
# instance's bandwidth; a TCP-socket fallback stays at single-flow ENA speed (a few Gbps), a small
# fraction on every EFA type.
HEALTHY_FRACTION = 0.5
DEGRADED_FRACTION = 0.1


def verdict(busbw_gbps: float, network_gbps: float, nodes: int) -> tuple[float | None, str]:
    """(busbw as a fraction of the published bandwidth, one word). Within one node the traffic does
    not cross the network, so there is nothing to judge."""
    if nodes < 2:
        return None, "single-node"
    if network_gbps <= 0:
        return None, "unknown"
    fraction = busbw_gbps / network_gbps
    if fraction >= HEALTHY_FRACTION:
        return round(fraction, 3), "healthy"
    if fraction >= DEGRADED_FRACTION:
        return round(fraction, 3), "degraded"
    return round(fraction, 3), "broken"


@dataclass(frozen=True)
class Backend:
    name: str
    device: torch.device
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    # Waits until queued device work has run, so that the timer measures it.
    sync: Callable[[], None]
    # Lines every rank up before the timer starts.
    barrier: Callable[[], None] = dist.barrier


def choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "nccl"
    if importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    return "gloo"


def _in_place(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor)
    return tensor


def init_backend(name: str) -> Backend:
    if name == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl")
        return Backend(name, torch.device("cuda"), _in_place, torch.cuda.synchronize)
    if name == "xla":
        # torch-neuronx: the xla process group; tensors are lazy until mark_step runs the graph.
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)

        dist.init_process_group(backend="xla")

        def xla_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
            result = xm.all_reduce(xm.REDUCE_SUM, tensor)
            xm.mark_step()
            return result

        return Backend(
            name, xm.xla_device(), xla_all_reduce, xm.wait_device_ops, lambda: xm.rendezvous("allreduce_bench")
        )
    dist.init_process_group(backend="gloo")
    return Backend(name, torch.device("cpu"), _in_place, lambda: None)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    backend = init_backend(choose_backend(args.backend))
    rank, world = dist.get_rank(), dist.get_world_size()

    elements = max(1, int(args.size_mb * 1024 * 1024) // 4)
    # The timed loop reduces one buffer of zeros in place, again and again: no copy is timed and the
    # values never grow. Correctness is checked on a fresh buffer of ones afterwards.
    buffer = torch.zeros(elements, dtype=torch.float32, device=backend.device)

    for _ in range(args.warmup):
        backend.all_reduce(buffer)
    backend.sync()
    backend.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        backend.all_reduce(buffer)
    backend.sync()
    seconds = (time.perf_counter() - start) / args.iters

    result = backend.all_reduce(torch.ones(elements, dtype=torch.float32, device=backend.device))
    backend.sync()
    correct = bool(torch.all(result.cpu() == float(world)).item())
    nbytes = elements * 4
    algbw = nbytes / seconds  # bytes per second
    busbw = algbw * 2 * (world - 1) / world if world > 1 else algbw
    nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", world))
    fraction, word = verdict(busbw * 8 / 1e9, args.network_gbps, nodes)
    if rank == 0:
        line = {
            "world_size": world,
            "backend": backend.name,
            "bytes": nbytes,
            "algbw_gbps": round(algbw * 8 / 1e9, 3),
            "busbw_gbps": round(busbw * 8 / 1e9, 3),
            "algbw_GBps": round(algbw / 1e9, 3),
            "busbw_GBps": round(busbw / 1e9, 3),
            "seconds_per_iter": round(seconds, 6),
            "nodes": nodes,
            "network_gbps": args.network_gbps or None,
            "fraction_of_network": fraction,
            "verdict": word if correct else "wrong-result",
            "correct": correct,
        }
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
