"""All-reduce bandwidth in nccl-tests' terms: a sweep of message sizes, per node and across nodes.

Run it through the launcher, on one node or many:

    distributed_run.sh allreduce_bench.py --sizes 8K:1G --iters 20 --per-node

NCCL on GPUs (its network plugin uses EFA through aws-ofi-nccl), the XLA backend on Neuron devices
(Neuron collectives over EFA, as in the AWS Neuron Batch all-reduce sample), gloo on CPU; `--backend`
picks one explicitly.

For every size (`--sizes 8K:1G` doubles from 8 KiB to 1 GiB; `--sizes 1M,64M` is a list; `--size-mb`
is one size) it checks the result (#wrong: elements that differ from the expected sum, over all
ranks), then times `--iters` in-place all-reduces on the device (CUDA events on GPUs, a synchronize
around each call elsewhere) and prints the row all_reduce_perf prints: size, count, type, redop,
root, time (us, mean), algbw and busbw (GB/s), #wrong, plus the median time. busbw = algbw x
2 (n - 1) / n (nccl-tests' doc/PERFORMANCE.md), and "# Avg bus bandwidth" averages it over the sizes
of 1 MiB and more. Rank 0 ends with one JSON line (the table, the verdict); a world of one process
moves no data, so it prints no bandwidth and the verdict "no-peers".

Across nodes the verdict compares busbw at the largest size measured with published runs of the same
instance type (--instance-type, INSTANCE_TYPE) and node count (fabric_references.py, a copy of
config/fabric_references.py): healthy, degraded (with the likely cause) or uncalibrated (nothing
published). Within one node it compares the average busbw with the GPUs' interconnect (--node-gbps,
NODE_GBPS; config/gpu_interconnect.py). `--per-node` first reduces within every node at once (one
subgroup per node), then across all nodes, and names the nodes that failed. With three or more nodes
whose fabric verdict is degraded (or uncalibrated where two nodes of the type have a published figure),
pairs of nodes are then measured at once and bisected to the slow node in at most two rounds
(allreduce_pairs.py, node_bisect.py; docs/observability.md, "Naming the slow node").

Exit status: 0 when every result was right, 1 when any element was wrong, 2 on bad arguments.

The modules beside this one: allreduce_sweep.py (backends, the sweep, the table),
allreduce_per_node.py (the per-node phase), allreduce_pairs.py and node_bisect.py (the pairs phase),
allreduce_verdicts.py (verdicts, the metric and summary lines), fabric_references.py (the published
figures). The images copy them all into /opt/training; this file is the one to run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import asdict

import torch
import torch.distributed as dist
from allreduce_pairs import pairs_bar, pairs_phase
from allreduce_per_node import node_identity, node_phase
from allreduce_sweep import (
    CORRUPT_RANK_ENV,
    ELEMENT_BYTES,
    KIB,
    MIB,
    SLOW_NODE_ENV,
    Row,
    average_busbw_gbytes,
    bus_factor,
    format_table,
    init_backend,
    sweep,
)
from allreduce_verdicts import (
    BUSBW_METRIC,
    FLEET_DIMENSION,
    FLEET_ENV,
    METRIC_NAMESPACE,
    VERDICT_METRIC,
    NodeCheck,
    fabric_verdict,
    metric_line,
    node_check,
    summary,
    verdict,
    worst,
)
from node_bisect import pair_size, report_lines, should_bisect

# The benchmark's names in one place, as tests/test_allreduce.py and readers of this file find them.
__all__ = [
    "BUSBW_METRIC",
    "FLEET_DIMENSION",
    "FLEET_ENV",
    "METRIC_NAMESPACE",
    "VERDICT_METRIC",
    "Row",
    "bus_factor",
    "choose_backend",
    "fabric_verdict",
    "format_table",
    "init_backend",
    "main",
    "metric_line",
    "node_check",
    "parse_args",
    "parse_sizes",
    "summary",
    "sweep",
    "verdict",
    "worst",
]

_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)
_UNITS = {"": 1, "K": KIB, "M": MIB, "G": 1024 * MIB}


def parse_size(text: str) -> int:
    """'8K' -> 8192 (binary units, as nccl-tests reads -b/-e)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"size {text!r} is not a number of bytes with an optional K, M or G")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size < ELEMENT_BYTES or size % ELEMENT_BYTES:
        raise ValueError(f"size {text!r} is not a positive multiple of {ELEMENT_BYTES} bytes (float32)")
    return size


def parse_sizes(text: str) -> list[int]:
    """'8K:1G' doubles from 8 KiB up to 1 GiB; '1M,64M,1G' is a list."""
    if ":" in text:
        low_text, _, high_text = text.partition(":")
        low, high = parse_size(low_text), parse_size(high_text)
        if low > high:
            raise ValueError(f"size range {text!r} starts above its end")
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= 2
        return sizes
    return sorted({parse_size(part) for part in text.split(",") if part.strip()})


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="torch.distributed all-reduce bandwidth, nccl-tests style")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--sizes", help="a range MIN:MAX (doubling), e.g. 8K:1G, or a list, e.g. 1M,64M,1G")
    sizes.add_argument("--size-mb", type=float, help="one message size in MiB (default 64)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations per size first (default 5)")
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "xla", "gloo"),
        default="auto",
        help="auto: nccl with CUDA, else xla when torch_xla is installed (Neuron), else gloo",
    )
    parser.add_argument(
        "--instance-type",
        default=os.environ.get("INSTANCE_TYPE", ""),
        help="the nodes' EC2 instance type, to find published figures by (default: $INSTANCE_TYPE)",
    )
    parser.add_argument(
        "--node-gbps",
        type=float,
        default=float(os.environ.get("NODE_GBPS") or 0),
        help="the published GPU-to-GPU bandwidth within one node, Gbps per GPU and direction "
        "(default: $NODE_GBPS; 0: unknown)",
    )
    parser.add_argument(
        "--per-node", action="store_true", help="first reduce within every node at once, then across nodes"
    )
    args = parser.parse_args(argv)
    try:
        if args.sizes is not None:
            try:
                args.sizes = parse_sizes(args.sizes)
            except ValueError as error:
                raise ValueError(f"--sizes {args.sizes!r}: {error}") from None
        else:
            size_mb = 64.0 if args.size_mb is None else args.size_mb
            if size_mb <= 0:
                raise ValueError(f"--size-mb {size_mb:g} is not above 0")
            args.sizes = [max(1, int(size_mb * MIB) // ELEMENT_BYTES) * ELEMENT_BYTES]
    except ValueError as error:
        parser.error(str(error))
    if not args.sizes or args.iters < 1 or args.warmup < 0 or args.node_gbps < 0:
        parser.error("--sizes needs a size, --iters >= 1, --warmup >= 0, --node-gbps >= 0")
    return args


def choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "nccl"
    if importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    return "gloo"


def main(argv: list[str]) -> int:
    began = time.monotonic()
    args = parse_args(argv)
    backend = init_backend(choose_backend(args.backend))
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // local)
    report: dict[str, object] = {"world_size": world, "backend": backend.name, "nodes": nodes}

    if world == 1:
        # One rank moves no data: nccl-tests prints busbw 0 at every size for the same reason.
        if rank == 0:
            print("# one process: an all-reduce without peers moves no data; nothing to measure", flush=True)
            print(json.dumps({**report, "verdict": "no-peers"}), flush=True)
        dist.destroy_process_group()
        return 0

    checks: list[NodeCheck] = []
    fabric: dict[str, object] | None = None
    bisection: dict[str, object] | None = None
    slow_nodes: list[str] = []
    if args.per_node and nodes > 1:
        if not backend.subgroups:
            report["node_checks_skipped"] = f"the {backend.name} backend has no torch.distributed subgroups"
        elif local < 2:
            report["node_checks_skipped"] = "one process per node: nothing to reduce within a node"
        else:
            checks = node_phase(backend, args, rank)

    # Across every rank: the fabric when there are several nodes, the node itself when there is one.
    single = nodes == 1
    rows = sweep(
        backend,
        args.sizes,
        iters=args.iters,
        warmup=args.warmup,
        group=None,
        ranks=world,
        corrupt=os.environ.get(CORRUPT_RANK_ENV) == str(rank),
        slow_seconds=float(os.environ.get(SLOW_NODE_ENV) or 0) if single else 0.0,
    )
    average, from_bytes = average_busbw_gbytes(rows)
    busbw_gbps = average * 8
    wrong = sum(row.wrong for row in rows)
    if single:
        checks = [node_check(node_identity()[1], world, average, wrong, args.node_gbps)]
        fraction, word = checks[0].fraction, checks[0].verdict
    else:
        fraction = None
        fabric = fabric_verdict({row.bytes: row.busbw_GBps for row in rows}, args.instance_type, nodes)
        word = "wrong-result" if wrong else str(fabric["verdict"])
        # Every rank holds the same figures (the sweep reduces them), so all decide alike.
        size = pair_size(args.sizes)
        bar = pairs_bar(args.instance_type, size)
        if backend.subgroups and should_bisect(word, nodes, bar):
            bisection, slow_nodes = pairs_phase(backend, bar, size, args.iters)
            word = worst([word, str(bisection["verdict"] or word)])
    final = worst([word, *(check.verdict for check in checks)])
    correct = wrong == 0 and all(check.wrong == 0 for check in checks)
    largest = rows[-1]
    if rank == 0:
        if "node_checks_skipped" in report:
            print(f"# per-node check skipped: {report['node_checks_skipped']}", flush=True)
        if checks and not single:
            print("# per node (all nodes at once, each its own world)", flush=True)
            for check in checks:
                print(
                    f"#   {check.node}: {check.ranks} ranks, avg busbw {check.busbw_gbps:.3f} Gbps, "
                    f"{check.verdict}, #wrong {check.wrong}",
                    flush=True,
                )
        title = f"{'one node' if single else f'{nodes} nodes'}, {world} ranks, {backend.name}"
        print(format_table(rows, title), flush=True)
        if fabric is not None:
            print(f"# fabric: {fabric['verdict']}: {fabric['reason']}", flush=True)
        if bisection is not None:
            print("\n".join(report_lines(bisection)), flush=True)
        fleet = os.environ.get(FLEET_ENV)
        if fleet:
            print(metric_line(fleet, busbw_gbps, final, slow_nodes), flush=True)
        report.update(
            {
                # The figures of the largest size, as one-size runs always reported them.
                "bytes": largest.bytes,
                "seconds_per_iter": round(largest.time_us / 1e6, 6),
                "algbw_gbps": round(largest.algbw_GBps * 8, 3),
                "algbw_GBps": largest.algbw_GBps,
                # The average over the sizes of 1 MiB and more: what the verdict judges.
                "busbw_gbps": round(busbw_gbps, 3),
                "busbw_GBps": round(average, 3),
                "avg_busbw_from_bytes": from_bytes,
                "sizes": [asdict(row) for row in rows],
                "wrong": wrong,
                "fabric": fabric,
                "node_gbps": args.node_gbps or None,
                "fraction_of_node": fraction if single else None,
                "node_checks": [asdict(check) for check in checks],
                "failing_nodes": [c.node for c in checks if c.verdict in ("broken", "wrong-result")],
                "degraded_nodes": [c.node for c in checks if c.verdict == "degraded"],
                # The pairs phase (allreduce_pairs.py): its rounds and the slow node(s) named.
                "bisect": bisection,
                "slow_nodes": slow_nodes,
                "verdict": final,
                "correct": correct,
                "elapsed_seconds": round(time.monotonic() - began, 3),
            }
        )
        print(json.dumps(report), flush=True)
        # Last, a short line with the verdict alone: the full one grows with the sizes and the nodes,
        # and a container log driver splits lines of over 16 KB (Docker's json-file and awslogs
        # buffer), which would leave `trainctl check` without a whole verdict line on large fleets.
        print(json.dumps(summary(report)), flush=True)
    dist.destroy_process_group()
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
