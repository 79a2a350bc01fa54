"""One all-reduce sweep in nccl-tests' terms: the backend it runs on, a check and a timed loop at
every message size, and the table all_reduce_perf prints (allreduce_bench.py says what it measures)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

KIB = 1024
MIB = 1024 * KIB
# The average bus bandwidth, and every verdict, use sizes from here up: below 1 MiB an all-reduce
# measures latency, not bandwidth.
AVERAGE_FROM_BYTES = MIB
ELEMENT_BYTES = 4  # float32, nccl-tests' default type ("float")

# Test hooks (tests/test_allreduce.py): seconds added to every timed all-reduce within this node
# (a slow node), and the rank that perturbs one element of every checked result (a wrong result).
SLOW_NODE_ENV = "ALLREDUCE_BENCH_SLOW_SECONDS"
CORRUPT_RANK_ENV = "ALLREDUCE_BENCH_CORRUPT_RANK"


def bus_factor(ranks: int) -> float:
    """busbw / algbw for an all-reduce of n ranks: 2 (n - 1) / n (nccl-tests, doc/PERFORMANCE.md).
    0 for one rank: it moves nothing."""
    return 2 * (ranks - 1) / ranks


# --- Backends -------------------------------------------------------------------------------------

AllReduce = Callable[[torch.Tensor, str, "ProcessGroup | None"], torch.Tensor]


@dataclass(frozen=True)
class Backend:
    name: str
    device: torch.device
    # (tensor, "sum" | "max", group or None for every rank) -> the reduced tensor.
    all_reduce: AllReduce
    # Waits until queued device work has run.
    sync: Callable[[], None]
    # Lines the ranks of a group up before a timer starts.
    barrier: Callable[[ProcessGroup | None], None]
    # Whether torch.distributed subgroups work (the per-node check).
    subgroups: bool = True


_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _dist_all_reduce(tensor: torch.Tensor, op: str, group: ProcessGroup | None) -> torch.Tensor:
    dist.all_reduce(tensor, op=_OPS[op], group=group)
    return tensor


def _dist_barrier(group: ProcessGroup | None) -> None:
    dist.barrier(group=group)


def init_backend(name: str) -> Backend:
    if name == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl")
        return Backend(name, torch.device("cuda"), _dist_all_reduce, torch.cuda.synchronize, _dist_barrier)
    if name == "xla":
        # torch-neuronx: the xla process group; tensors are lazy until mark_step runs the graph.
        # Installed in the Neuron image only; importing xla_backend registers the "xla" backend.
        import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]
        import torch_xla.distributed.xla_backend  # type: ignore[import-not-found]  # noqa: F401

        dist.init_process_group(backend="xla")
        xla_ops = {"sum": xm.REDUCE_SUM, "max": xm.REDUCE_MAX}

        def xla_all_reduce(tensor: torch.Tensor, op: str, group: ProcessGroup | None) -> torch.Tensor:
            result: torch.Tensor = xm.all_reduce(xla_ops[op], tensor)
            xm.mark_step()
            return result

        def xla_barrier(group: ProcessGroup | None) -> None:
            xm.rendezvous("allreduce_bench")

        # torch_xla reduces within replica groups of its own (xm.all_reduce(groups=...)), not within
        # torch.distributed subgroups, so the per-node phase is not offered there.
        return Backend(name, xm.xla_device(), xla_all_reduce, xm.wait_device_ops, xla_barrier, subgroups=False)
    dist.init_process_group(backend="gloo")
    return Backend(name, torch.device("cpu"), _dist_all_reduce, lambda: None, _dist_barrier)


def timed_iterations(backend: Backend, operation: Callable[[], object], iters: int) -> tuple[float, list[float]]:
    """(mean seconds per iteration over the whole timed block, seconds of each iteration), measured
    on the device: CUDA events around every call on GPUs, which queue no synchronization between
    calls; elsewhere a synchronize after every call, with the host clock around it."""
    if backend.device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]  # type: ignore[no-untyped-call]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]  # type: ignore[no-untyped-call]
        for start_event, end_event in zip(starts, ends, strict=True):
            start_event.record()
            operation()
            end_event.record()
        torch.cuda.synchronize()
        each = [a.elapsed_time(b) / 1e3 for a, b in zip(starts, ends, strict=True)]
        return starts[0].elapsed_time(ends[-1]) / 1e3 / iters, each
    each = []
    block_start = time.perf_counter()
    for _ in range(iters):
        started = time.perf_counter()
        operation()
        backend.sync()
        each.append(time.perf_counter() - started)
    return (time.perf_counter() - block_start) / iters, each


# --- One sweep ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table, in nccl-tests' units."""

    bytes: int
    count: int
    time_us: float  # mean over the timed iterations, slowest rank
    median_us: float
    algbw_GBps: float  # nccl-tests prints GB/s; the JSON keys keep the unit
    busbw_GBps: float
    wrong: int


def fill_pattern(view: torch.Tensor) -> None:
    """Every rank sends 1, 2, 3, 1, 2, 3, ...: after a sum each element is n times that, exact in
    float32 far beyond any job's rank count; an element out of place or a rank missing shows."""
    for offset in range(3):
        view[offset::3].fill_(offset + 1)


def count_wrong(view: torch.Tensor, ranks: int) -> int:
    wrong = 0
    for offset in range(3):
        wrong += int((view[offset::3] != float(ranks * (offset + 1))).sum().item())
    return wrong


def sweep(
    backend: Backend,
    sizes: Sequence[int],
    *,
    iters: int,
    warmup: int,
    group: ProcessGroup | None,
    ranks: int,
    corrupt: bool,
    slow_seconds: float,
) -> list[Row]:
    """Check and time an all-reduce at every size among the ranks of `group` (None: every rank).
    One buffer for the largest size; every size reduces a view of it in place, so no copy is timed."""
    buffer = torch.zeros(max(sizes) // ELEMENT_BYTES, dtype=torch.float32, device=backend.device)
    rows = []
    for size in sizes:
        count = size // ELEMENT_BYTES
        view = buffer[:count]
        fill_pattern(view)
        result = backend.all_reduce(view, "sum", group)
        backend.sync()
        if corrupt:
            result[count // 2] += 1
        wrong = count_wrong(result, ranks)
        # The timed loop reduces zeros, so the values never grow however many iterations run.
        view.zero_()

        def operation(view: torch.Tensor = view) -> None:
            backend.all_reduce(view, "sum", group)
            if slow_seconds:
                time.sleep(slow_seconds)

        for _ in range(warmup):
            backend.all_reduce(view, "sum", group)
        backend.sync()
        backend.barrier(group)
        mean, each = timed_iterations(backend, operation, iters)
        # An all-reduce ends when its slowest rank ends; #wrong counts every rank's result.
        times = backend.all_reduce(
            torch.tensor([mean, statistics.median(each)], dtype=torch.float64, device=backend.device), "max", group
        )
        wrongs = backend.all_reduce(torch.tensor([wrong], dtype=torch.float64, device=backend.device), "sum", group)
        backend.sync()
        mean, median = (float(x) for x in times.cpu().tolist())
        algbw = size / mean / 1e9
        rows.append(
            Row(
                bytes=size,
                count=count,
                time_us=round(mean * 1e6, 2),
                median_us=round(median * 1e6, 2),
                algbw_GBps=round(algbw, 3),
                busbw_GBps=round(algbw * bus_factor(ranks), 3),
                wrong=int(wrongs.cpu().item()),
            )
        )
    return rows


def average_busbw_gbytes(rows: Sequence[Row]) -> tuple[float, int]:
    """(average busbw in GB/s, the smallest size it averages): sizes of 1 MiB and more, or every size
    when none is that large."""
    large = [row for row in rows if row.bytes >= AVERAGE_FROM_BYTES] or list(rows)
    return sum(row.busbw_GBps for row in large) / len(large), min(row.bytes for row in large)


# --- Printing -------------------------------------------------------------------------------------


def _number(value: float, width: int) -> str:
    """nccl-tests' style: two decimals while they fit, fewer for large values."""
    decimals = 2 if value < 1e3 else 1 if value < 1e4 else 0
    return f"{value:{width}.{decimals}f}"


def format_table(rows: Sequence[Row], title: str) -> str:
    """The columns and units of nccl-tests' all_reduce_perf (in place only), plus the median."""
    lines = [
        f"# {title}",
        f"#{'in-place':>69}",
        f"#{'size':>11}{'count':>14}{'type':>10}{'redop':>8}{'root':>8}"
        f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>8}{'median':>9}",
        f"#{'(B)':>11}{'(elements)':>14}{'':>26}{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}{'':>8}{'(us)':>9}",
    ]
    for row in rows:
        lines.append(
            f"{row.bytes:>12}{row.count:>14}{'float':>10}{'sum':>8}{-1:>8}"
            f"{_number(row.time_us, 9)}{_number(row.algbw_GBps, 8)}{_number(row.busbw_GBps, 8)}"
            f"{row.wrong:>8}{_number(row.median_us, 9)}"
        )
    wrong = sum(row.wrong for row in rows)
    average, from_bytes = average_busbw_gbytes(rows)
    lines += [
        f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
        f"# Avg bus bandwidth    : {average:.3f} (GB/s, sizes >= {from_bytes} B)",
    ]
    return "\n".join(lines)
