"""The per-node phase of `allreduce_bench.py --per-node`: every node measures itself, all at once and
before any collective across nodes, and every rank learns every node's verdict."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence

import torch
import torch.distributed as dist
from allreduce_sweep import CORRUPT_RANK_ENV, SLOW_NODE_ENV, Backend, average_busbw_gbytes, sweep
from allreduce_verdicts import NodeCheck, node_check


def node_identity() -> tuple[int, str]:
    """(torchrun's node rank, "node <Batch node index, else that rank> (<hostname>)")."""
    node = int(os.environ.get("GROUP_RANK", "0"))
    index = os.environ.get("AWS_BATCH_JOB_NODE_INDEX") or str(node)
    return node, f"node {index} ({socket.gethostname()})"


LABEL_LENGTH = 96


def gather(backend: Backend, mine: Sequence[float]) -> list[list[float]]:
    """Every rank's numbers, on every rank: a sum over rows that only their owner fills (no pickled
    objects, so no numpy needed)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    table = torch.zeros(world, len(mine), dtype=torch.float64, device=backend.device)
    table[rank] = torch.tensor(list(mine), dtype=torch.float64, device=backend.device)
    table = backend.all_reduce(table, "sum", None)
    backend.sync()
    rows: list[list[float]] = table.cpu().tolist()
    return rows


def _encode(label: str) -> list[float]:
    data = label.encode()[:LABEL_LENGTH]
    return [float(byte) for byte in data.ljust(LABEL_LENGTH, b"\0")]


def _decode(values: Sequence[float]) -> str:
    return bytes(int(value) for value in values).rstrip(b"\0").decode(errors="replace")


def node_phase(backend: Backend, args: argparse.Namespace, rank: int) -> list[NodeCheck]:
    """Every node reduces among its own ranks, all nodes at once, before any collective across
    nodes: a node whose network is broken still measures itself and names its verdict in its own log
    (one `# node check` line). Then every rank learns every node's result."""
    node, label = node_identity()
    local, world = int(os.environ.get("LOCAL_WORLD_SIZE", "0")), dist.get_world_size()
    members: dict[int, list[int]] = {}
    if local and world % local == 0 and rank // local == node:
        # torchrun numbers ranks node by node (rank = node rank x local world size + local rank).
        members = {group: list(range(group * local, (group + 1) * local)) for group in range(world // local)}
    else:
        for other, identity in enumerate(gather(backend, [float(node)])):
            members.setdefault(int(identity[0]), []).append(other)
    # new_group is collective: every rank creates every node's group, in the same order.
    groups = {key: dist.new_group(ranks) for key, ranks in sorted(members.items())}
    rows = sweep(
        backend,
        args.sizes,
        iters=args.iters,
        warmup=args.warmup,
        group=groups[node],
        ranks=len(members[node]),
        corrupt=os.environ.get(CORRUPT_RANK_ENV) == str(rank),
        slow_seconds=float(os.environ.get(SLOW_NODE_ENV) or 0),
    )
    # Every rank of a node holds the same (reduced) figures; its first rank reports them.
    average, _ = average_busbw_gbytes(rows)
    wrong = sum(row.wrong for row in rows)
    leader = rank == members[node][0]
    if leader:
        own = node_check(label, len(members[node]), average, wrong, args.node_gbps)
        print(f"# node check, {own.node}: busbw {own.busbw_gbps} Gbps, {own.verdict}", flush=True)
    mine = [average, float(wrong), *_encode(label)] if leader else [0.0] * (2 + LABEL_LENGTH)
    results = gather(backend, mine)
    return [
        node_check(
            _decode(results[ranks[0]][2:]), len(ranks), results[ranks[0]][0], int(results[ranks[0]][1]), args.node_gbps
        )
        for _, ranks in sorted(members.items())
    ]
