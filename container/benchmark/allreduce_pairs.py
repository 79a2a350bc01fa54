"""The pairs phase of allreduce_bench.py: when the fabric verdict of more than two nodes is degraded (or
uncalibrated while two nodes of the type have a published figure), measure disjoint pairs of nodes at
once, one torch.distributed subgroup per pair, and bisect to the slow node (node_bisect.py plans it)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from allreduce_per_node import LABEL_LENGTH, _decode, _encode, gather, node_identity
from allreduce_sweep import SLOW_NODE_ENV, Backend, sweep
from node_bisect import PAIR_ITERS, PAIR_WARMUP, Measure, Pair, as_report, bisect, pair_bar

# Test hook (tests/test_allreduce.py): the two-node bar in GB/s, standing in for a published reference
# at the pairs' size so the phase runs on CPU, where nothing is published.
PAIR_BAR_ENV = "ALLREDUCE_BENCH_PAIR_BAR_GBPS"


def nodes_and_labels(backend: Backend) -> tuple[list[list[int]], list[str]]:
    """Every node's ranks and label ("node <Batch index> (<hostname>)"), ordered by torchrun's node rank."""
    node, label = node_identity()
    rows = gather(backend, [float(node), *_encode(label)])
    members: dict[int, list[int]] = {}
    for rank, row in enumerate(rows):
        members.setdefault(int(row[0]), []).append(rank)
    order = sorted(members)
    return [members[key] for key in order], [_decode(rows[members[key][0]][1 : 1 + LABEL_LENGTH]) for key in order]


def pair_measure(backend: Backend, members: Sequence[Sequence[int]], size: int, iters: int) -> Measure:
    """Measure the given pairs at once: every rank creates every pair's group (new_group is
    collective), the ranks of each pair time all-reduces within it, then every rank learns every figure."""
    rank = dist.get_rank()
    slow_seconds = float(os.environ.get(SLOW_NODE_ENV) or 0)

    def measure(pairs: Sequence[Pair]) -> list[float]:
        mine = [0.0] * len(pairs)
        for index, (a, b) in enumerate(pairs):
            ranks = sorted([*members[a], *members[b]])
            group = dist.new_group(ranks)
            if rank not in ranks:
                continue
            (row,) = sweep(
                backend,
                [size],
                iters=iters,
                warmup=PAIR_WARMUP,
                group=group,
                ranks=len(ranks),
                corrupt=False,
                slow_seconds=slow_seconds,
            )
            if rank == ranks[0]:
                mine[index] = row.busbw_GBps
        table = backend.all_reduce(torch.tensor(mine, dtype=torch.float64, device=backend.device), "sum", None)
        backend.sync()
        figures: list[float] = table.cpu().tolist()
        return figures

    return measure


def pairs_bar(instance_type: str, size: int) -> float | None:
    hook = os.environ.get(PAIR_BAR_ENV)
    return float(hook) if hook else pair_bar(instance_type, size)


def pairs_phase(backend: Backend, bar: float | None, size: int, iters: int) -> tuple[dict[str, object], list[str]]:
    """Bisect the nodes (on every rank, which all learn the same figures): the report's "bisect" entry,
    with "verdict" degraded when a node was named or every pair fell below the two-node bar, else None
    (the pairs alone never make a fleet healthy), and the slow nodes' labels."""
    began = time.monotonic()
    members, labels = nodes_and_labels(backend)
    result = bisect(len(members), pair_measure(backend, members, size, min(iters, PAIR_ITERS)), bar)
    entry = as_report(result, labels, size, time.monotonic() - began)
    fabric_slow = result.calibrated and all(pair.slow for pair in result.rounds[0])
    entry["verdict"] = "degraded" if result.named or fabric_slow else None
    return entry, [labels[node] for node in result.named]
