"""A DDP training loop for bench/step_timing_bench.py, run under torchrun: an 8-layer MLP in 4 MiB
gradient buckets (8 of them), --steps timed steps after 10 untimed ones; rank 0 prints the median step."""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
layers = [torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()) for _ in range(8)]
model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs = torch.randn(64, 512)
seconds = []
for step in range(10 + args.steps):
    start = time.perf_counter()
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    optimizer.step()
    if step >= 10:
        seconds.append(time.perf_counter() - start)
if dist.get_rank() == 0:
    print(f"step_seconds={statistics.median(seconds):.6f}", flush=True)
dist.destroy_process_group()
