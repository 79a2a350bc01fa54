"""`make bench`, the straggler watch's per-step timing (container/launcher/step_timing.py): what it adds to
a DDP step on this machine's CPU, two ranks over gloo (bench/ddp_steps.py, 8 gradient buckets).

- end to end: the median step with and without the timing (its sitecustomize on PYTHONPATH), runs
  interleaved, median of --runs each; target: at most 0.5% of the step. On two busy cores it is within the
  noise.
- the timing's own work per step, in one process: the forward wrapper's clock and the gradient hooks'
  (a layer's weight and bias keep theirs), measured over 100,000 steps;
- in one process (bench/ddp_hook_cost.py): the same model under DDP as it is and through the timing's patch
  (its forward wrapped, its first gradients hooked), blocks of steps alternating, so that load falls on both
  alike; also with 8 x 8 layers, whose step of about a millisecond shows the added microseconds themselves.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "container" / "launcher"))
from step_timing import StepClock  # noqa: E402

TARGET_PERCENT = 0.5


def one_run(timed: bool, steps: int, folder: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    if timed:
        env.update(PYTHONPATH=str(ROOT / "container/launcher/inject"), STRAGGLER_TIMING_DIR=folder)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*command, str(ROOT / "bench/ddp_steps.py"), "--steps", str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"step_seconds=([0-9.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"no step time in the output: {done.stdout[-500:]} {done.stderr[-500:]}")
    return float(match.group(1))


def own_work(folder: str) -> float:
    """Seconds per step of the clock's own calls: one forward, and the gradients of the two parameters of the
    first bucket that keep their hooks (the first one recorded)."""
    clock = StepClock(os.path.join(folder, "micro.txt"), 3600.0)
    steps = 100_000
    start = time.perf_counter()
    for _ in range(steps):
        clock.forward()
        clock.collective()
        clock.collective()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    plain, timed = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.runs):
            plain.append(one_run(False, args.steps, folder))
            timed.append(one_run(True, args.steps, folder))
        work = own_work(folder)
    base, with_timing = statistics.median(plain), statistics.median(timed)
    overhead = (with_timing - base) / base * 100
    print(f"cores: {os.cpu_count()}")
    print(
        f"DDP step (2 ranks, gloo, 8 buckets), median of {args.runs} runs of {args.steps} steps: "
        f"{base * 1000:.2f} ms plain, {with_timing * 1000:.2f} ms timed: {overhead:+.2f}% "
        f"(target <= {TARGET_PERCENT}%; runs plain {min(plain) * 1000:.2f}-{max(plain) * 1000:.2f} ms, "
        f"timed {min(timed) * 1000:.2f}-{max(timed) * 1000:.2f} ms)"
    )
    print(f"the timing's own work per step: {work * 1e6:.2f} us ({work / base * 100:.3f}% of the plain step)")
    for shape, options in (("8 x 512", ()), ("8 x 8 (a step of about 1 ms)", ("--width", "8", "--steps", "200"))):
        plain_one, timed_one = in_one_process(*options)
        added = timed_one - plain_one
        print(
            f"in one process, {shape} layers (world size 1, blocks of steps alternating): {plain_one * 1000:.3f} ms "
            f"plain, {timed_one * 1000:.3f} ms timed: {added * 1e6:+.1f} us a step ({added / plain_one * 100:+.2f}%; "
            f"target <= {TARGET_PERCENT}%)"
        )


def in_one_process(*options: str) -> tuple[float, float]:
    """bench/ddp_hook_cost.py: the median step of DDP as it is and of DDP through the timing's patch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/ddp_hook_cost.py"), "--blocks", "40", *options],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = re.search(r"plain_seconds=([0-9.]+) timed_seconds=([0-9.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"no step times in the output: {done.stdout[-500:]} {done.stderr[-500:]}")
    return float(match.group(1)), float(match.group(2))


if __name__ == "__main__":
    main()
