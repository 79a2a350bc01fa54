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

Verdicts compare the average busbw with a published figure: across nodes the instance's network
bandwidth (--network-gbps, NETWORK_GBPS), within one node its GPUs' interconnect (--node-gbps,
NODE_GBPS; config/gpu_interconnect.py). `--per-node` first reduces within every node at once (one
subgroup per node), then across all nodes, and names the nodes that failed.

Exit status: 0 when every result was right, 1 when any element was wrong, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

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

# CloudWatch embedded metric format (config/metrics.py holds the same strings; a test pins them).
METRIC_NAMESPACE = "TrainingPlatform"
FLEET_DIMENSION = "Fleet"
FLEET_ENV = "TRAINING_FLEET"
BUSBW_METRIC = "BenchmarkBusBandwidthGbps"
VERDICT_METRIC = "BenchmarkVerdict"
VERDICT_VALUES = {"healthy": 1.0, "degraded": 0.5, "broken": 0.0, "wrong-result": 0.0}

# Verdict thresholds on busbw / published bandwidth. They are this project's rules of thumb, not AWS
# figures: a healthy EFA fabric with large messages reaches well over half of the instance's
# bandwidth; a TCP-socket fallback stays at single-flow ENA speed (a few Gbps), a small fraction on
# every EFA type; a GPU pair that lost NVLink falls back to PCIe, a tenth of NVLink or less.
HEALTHY_FRACTION = 0.5
DEGRADED_FRACTION = 0.1
# Worst first: the final verdict is the worst of the node and fabric verdicts.
VERDICT_ORDER = ("wrong-result", "broken", "degraded", "unknown", "healthy")

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
        "--network-gbps",
        type=float,
        default=float(os.environ.get("NETWORK_GBPS") or 0),
        help="the instance's published network bandwidth in Gbps (default: $NETWORK_GBPS; 0: unknown)",
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
    if not args.sizes or args.iters < 1 or args.warmup < 0 or args.network_gbps < 0 or args.node_gbps < 0:
        parser.error("--sizes needs a size, --iters >= 1, --warmup >= 0, --network-gbps and --node-gbps >= 0")
    return args


def bus_factor(ranks: int) -> float:
    """busbw / algbw for an all-reduce of n ranks: 2 (n - 1) / n (nccl-tests, doc/PERFORMANCE.md).
    0 for one rank: it moves nothing."""
    return 2 * (ranks - 1) / ranks


def verdict(busbw_gbps: float, published_gbps: float) -> tuple[float | None, str]:
    """(busbw as a fraction of the published bandwidth, one word)."""
    if published_gbps <= 0:
        return None, "unknown"
    fraction = busbw_gbps / published_gbps
    if fraction >= HEALTHY_FRACTION:
        return round(fraction, 3), "healthy"
    if fraction >= DEGRADED_FRACTION:
        return round(fraction, 3), "degraded"
    return round(fraction, 3), "broken"


def worst(words: Sequence[str]) -> str:
    return min(words, key=VERDICT_ORDER.index)


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


def choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "nccl"
    if importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    return "gloo"


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


SUMMARY_FIELDS = ("world_size", "nodes", "busbw_gbps", "verdict", "failing_nodes", "degraded_nodes", "correct")


def summary(report: dict[str, object]) -> dict[str, object]:
    """The report's verdict fields alone, for the benchmark's last line."""
    return {"summary": True, **{key: report[key] for key in SUMMARY_FIELDS if key in report}}


def metric_line(fleet: str, busbw_gbps: float, word: str) -> str:
    """One CloudWatch embedded-metric-format event (CloudWatch user guide, "Specification: Embedded
    metric format"); CloudWatch Logs extracts it from the job's log stream, no header needed
    ("Using the PutLogEvents API to send manually-created embedded metric format logs")."""
    metrics: list[dict[str, str]] = [{"Name": BUSBW_METRIC, "Unit": "Gigabits/Second"}]
    event: dict[str, object] = {FLEET_DIMENSION: fleet, BUSBW_METRIC: round(busbw_gbps, 3)}
    if word in VERDICT_VALUES:
        metrics.append({"Name": VERDICT_METRIC, "Unit": "None"})
        event[VERDICT_METRIC] = VERDICT_VALUES[word]
    event["_aws"] = {
        "Timestamp": int(time.time() * 1000),
        "CloudWatchMetrics": [{"Namespace": METRIC_NAMESPACE, "Dimensions": [[FLEET_DIMENSION]], "Metrics": metrics}],
    }
    return json.dumps(event)


# --- The run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeCheck:
    node: str  # "node <Batch node index or torchrun node rank> (<hostname>)"
    ranks: int
    busbw_gbps: float
    fraction: float | None
    verdict: str
    wrong: int


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


def node_check(label: str, ranks: int, busbw_gbytes: float, wrong: int, node_gbps: float) -> NodeCheck:
    busbw_gbps = busbw_gbytes * 8
    fraction, word = verdict(busbw_gbps, node_gbps)
    return NodeCheck(label, ranks, round(busbw_gbps, 3), fraction, "wrong-result" if wrong else word, wrong)


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
        fraction, word = verdict(busbw_gbps, args.network_gbps)
        word = "wrong-result" if wrong else word
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
        fleet = os.environ.get(FLEET_ENV)
        if fleet:
            print(metric_line(fleet, busbw_gbps, final), flush=True)
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
                "network_gbps": args.network_gbps or None,
                "node_gbps": args.node_gbps or None,
                "fraction_of_network": None if single else fraction,
                "fraction_of_node": fraction if single else None,
                "node_checks": [asdict(check) for check in checks],
                "failing_nodes": [c.node for c in checks if c.verdict in ("broken", "wrong-result")],
                "degraded_nodes": [c.node for c in checks if c.verdict == "degraded"],
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
