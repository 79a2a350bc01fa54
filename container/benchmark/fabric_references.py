"""Published all-reduce figures and the fabric verdict made against them (docs/observability.md,
"The fabric verdict").

A multi-node all-reduce's bus bandwidth is judged against what the same instance type and node count
reached in a published run, never against a fraction of the network's line rate (two p5 nodes exceed
their 3,200 Gbps line rate at 8 GiB). A figure is `healthy` at >= HEALTHY_RATIO x the median of the
healthy published figures at the largest message size measured that has one; `degraded` below that,
naming the likely cause when the figure lies near a published run of a known bad configuration;
`uncalibrated` when nothing is published for the type and node count (the figures are shown, never
judged).

Add a row only for a figure you can cite: the file and commit (or page and date) it is printed in.
Every published figure is nccl-tests' out-of-place busbw in GB/s of one run; none of the sources
publishes a median or a minimum of several runs, so `minimum_GBps` stays None until one does. A row's
`test` names the collective test that measured it: nccl-tests' all_reduce_perf, or the benchmark
(container/benchmark/allreduce_bench.py: NCCL on GPUs, the XLA backend over Neuron collectives on
Trainium, which has no nccl-tests).

The rows between the RECORDED markers are written by `trainctl fabric record` (measurements nobody
had published, each with its source); REPLACED lists the type and node counts whose published healthy
rows a recorded measurement replaced (`--replace`). Edit that block only to remove an entry.

This module is the one table and the one verdict: trainctl imports it as config.fabric_references, and
the benchmark image carries a byte-identical copy, container/benchmark/fabric_references.py (a test pins
the two equal: `cp config/fabric_references.py container/benchmark/` after editing). Standard library
only, Python 3.10 (the images' Python).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

GIB = 1024**3
# A pass: this share of the published median at the same size. Published healthy runs of the same type
# differ by about 1% at 1 GiB and more (p5, Batch against Slurm); a lost EFA costs far more than 10%.
HEALTHY_RATIO = 0.90
# A degraded figure is put down to a known bad configuration when it lies within this factor of that
# configuration's published figure (p4d: one EFA reaches about a quarter of four, no EFA about a tenth).
CAUSE_FACTOR = 1.5

HEALTHY = "healthy"
DEGRADED = "degraded"
UNCALIBRATED = "uncalibrated"

# The collective tests a row may name (Reference.test).
NCCL_TESTS_ALL_REDUCE = "nccl-tests all_reduce_perf"
BENCHMARK_NCCL = "allreduce_bench.py, NCCL"
BENCHMARK_XLA = "allreduce_bench.py, XLA over Neuron collectives"

FEWER_EFAS = "fewer EFAs in use"
NO_EFA = "no EFA / socket fallback"


@dataclass(frozen=True)
class Source:
    """Where the figures are printed and how they were measured (None: the source does not say)."""

    url: str
    path: str
    commit: str
    published: str | None  # date of the commit that added the figures, when known
    retrieved: str
    command: str
    nccl: str | None = None
    aws_ofi_nccl: str | None = None
    efa_installer: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Reference:
    instance_type: str
    nodes: int
    message_bytes: int
    busbw_GBps: float
    source: Source
    # None: a healthy run. Otherwise the degraded configuration that was measured on purpose.
    cause: str | None = None
    minimum_GBps: float | None = None
    test: str = NCCL_TESTS_ALL_REDUCE


AWSOME = "https://github.com/awslabs/awsome-distributed-training"
AWSOME_HEAD = "0edaf1526bc47185ce5f827100416f99bd7b69e1"
SKYPILOT = "https://github.com/skypilot-org/skypilot"
SKYPILOT_README_COMMIT = "05e8e8fe0c29346b2b0af4d8412480ab248b8175"
NCCL_TESTS_16G = "all_reduce_perf -b 8 -e 16G -f 2 -g 1 -c 1 -n 100"

P5_BATCH = Source(
    url=f"{AWSOME}/blob/{AWSOME_HEAD}/micro-benchmarks/nccl-tests/aws-batch/README.md",
    path="micro-benchmarks/nccl-tests/aws-batch/README.md",
    commit=AWSOME_HEAD,
    published="2024-10-30",  # 0fbac547 "P5 on AWS Batch w/ Capacity Blocks (#448)"
    retrieved="2026-11-28",
    # The NCCLTest job definition of 1.architectures/3.aws-batch/0.aws-batch-distributed-training-p5.yaml.
    command=f"mpirun -np 8 -N 8 {NCCL_TESTS_16G} (AWS Batch multi-node, 2 x p5.48xlarge)",
    note="image public.ecr.aws/hpc-cloud/nccl-tests:latest; versions not stated",
)
P5_SLURM = Source(
    url=f"{AWSOME}/blob/{AWSOME_HEAD}/micro-benchmarks/nccl-tests/README.md",
    path="micro-benchmarks/nccl-tests/README.md",
    commit=AWSOME_HEAD,
    published="2024-04-19",  # 88c2e71 "Change README for K8s instructions"
    retrieved="2026-11-28",
    command=f"srun {NCCL_TESTS_16G} (slurm/nccl-tests.sbatch, 2 x p5.48xlarge)",
    note="versions of the run not stated (the README's build defaults then: EFA installer 1.31.0, "
    "aws-ofi-nccl 1.8.1, NCCL 2.20.3)",
)
P4DE_SLURM = Source(
    url=P5_SLURM.url,
    path=P5_SLURM.path,
    commit=AWSOME_HEAD,
    published="2024-04-19",
    retrieved="2026-11-28",
    command="all_reduce_perf from 8 B to 2 GB (2 x p4de.24xlarge; the README names the range only)",
    note=P5_SLURM.note,
)
P4D_VM = Source(
    url=f"{SKYPILOT}/blob/{SKYPILOT_README_COMMIT}/examples/aws_efa/README.md",
    path='examples/aws_efa/README.md ("Using EFA on AWS VM", Benchmark results)',
    commit=SKYPILOT_README_COMMIT,
    published=None,
    retrieved="2026-11-28",
    command="all_reduce_perf -b 8 -e 2G -f 2 -g 1 -c 5 -w 5 -n 100 (examples/aws_efa/efa_vm.yaml, 2 x p4d.24xlarge)",
    note="AWS Deep Learning Base GPU AMI; versions not stated",
)
P4D_HYPERPOD = Source(
    url=P4D_VM.url,
    path='examples/aws_efa/README.md ("Using EFA on HyperPod/EKS", Benchmark results)',
    commit=SKYPILOT_README_COMMIT,
    published=None,
    retrieved="2026-11-28",
    command="all_reduce_perf up to 2 GB (examples/aws_efa/nccl_efa.yaml on SageMaker HyperPod EKS, 2 x p4d.24xlarge)",
    note="versions not stated",
)


def _rows(
    instance_type: str,
    source: Source,
    figures: Mapping[int, float],
    cause: str | None = None,
    nodes: int = 2,
    test: str = NCCL_TESTS_ALL_REDUCE,
) -> list[Reference]:
    return [Reference(instance_type, nodes, size, busbw, source, cause, test=test) for size, busbw in figures.items()]


PUBLISHED: tuple[Reference, ...] = tuple(
    _rows("p5.48xlarge", P5_BATCH, {GIB: 441.81, 2 * GIB: 444.02, 4 * GIB: 475.97, 8 * GIB: 480.43, 16 * GIB: 483.05})
    + _rows("p5.48xlarge", P5_SLURM, {GIB: 436.95, 2 * GIB: 443.72, 4 * GIB: 465.87, 8 * GIB: 479.28, 16 * GIB: 487.09})
    + _rows("p4de.24xlarge", P4DE_SLURM, {GIB: 76.79, 2 * GIB: 78.33})
    + _rows("p4d.24xlarge", P4D_VM, {GIB: 76.14, 2 * GIB: 77.90})
    + _rows("p4d.24xlarge", P4D_HYPERPOD, {GIB: 75.34, 2 * GIB: 77.35})
    + _rows("p4d.24xlarge", P4D_VM, {GIB: 20.19, 2 * GIB: 20.31}, cause=FEWER_EFAS)
    + _rows("p4d.24xlarge", P4D_VM, {GIB: 8.15, 2 * GIB: 8.20}, cause=NO_EFA)
    + _rows("p4d.24xlarge", P4D_HYPERPOD, {GIB: 4.08, 2 * GIB: 4.13}, cause=NO_EFA)
)

# fmt: off
# BEGIN RECORDED (written by `trainctl fabric record`)
RECORDED: tuple[Reference, ...] = ()
REPLACED: tuple[tuple[str, int], ...] = ()
# END RECORDED
# fmt: on

# A replaced type and node count keeps its published bad configurations (they still name causes).
REFERENCES: tuple[Reference, ...] = (
    tuple(row for row in PUBLISHED if row.cause or (row.instance_type, row.nodes) not in REPLACED) + RECORDED
)


@dataclass(frozen=True)
class Verdict:
    word: str  # HEALTHY, DEGRADED or UNCALIBRATED
    message_bytes: int | None  # the size judged (None: uncalibrated)
    busbw_GBps: float | None
    reference_GBps: float | None
    cause: str | None
    reason: str  # one line


def references_for(instance_type: str, nodes: int, table: tuple[Reference, ...] = REFERENCES) -> list[Reference]:
    return [row for row in table if row.instance_type == instance_type and row.nodes == nodes]


def size_text(size: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def judge(
    busbw_by_size: Mapping[int, float], instance_type: str, nodes: int, table: tuple[Reference, ...] = REFERENCES
) -> Verdict:
    """The verdict on measured busbw (GB/s by message size in bytes) of `nodes` nodes of `instance_type`."""
    rows = references_for(instance_type, nodes, table)
    healthy = {row.message_bytes for row in rows if row.cause is None}
    judged = sorted(size for size in busbw_by_size if size in healthy)
    if not judged:
        published = ", ".join(size_text(size) for size in sorted(healthy))
        reason = (
            f"no published reference for {nodes} x {instance_type}"
            if not healthy
            else f"none of the sizes measured has a published reference for {nodes} x {instance_type} "
            f"(published: {published})"
        )
        return Verdict(UNCALIBRATED, None, None, None, None, reason)
    size = judged[-1]
    measured = busbw_by_size[size]
    median = statistics.median(row.busbw_GBps for row in rows if row.cause is None and row.message_bytes == size)
    where = f"{measured:.2f} GB/s at {size_text(size)} against the published {median:.2f} GB/s"
    if measured >= HEALTHY_RATIO * median:
        return Verdict(HEALTHY, size, measured, median, None, f"{where} (>= {HEALTHY_RATIO:.0%})")
    cause = likely_cause(measured, [row for row in rows if row.cause is not None and row.message_bytes == size])
    said = f"; likely {cause}" if cause else ""
    return Verdict(DEGRADED, size, measured, median, cause, f"{where} (< {HEALTHY_RATIO:.0%}){said}")


def likely_cause(measured: float, degraded: list[Reference]) -> str | None:
    """The bad configuration whose published figure is nearest (by ratio) and within CAUSE_FACTOR."""
    if measured <= 0:
        return None
    near = [(max(measured / row.busbw_GBps, row.busbw_GBps / measured), row) for row in degraded if row.busbw_GBps > 0]
    near = [(distance, row) for distance, row in near if distance <= CAUSE_FACTOR]
    return min(near, key=lambda pair: pair[0])[1].cause if near else None
