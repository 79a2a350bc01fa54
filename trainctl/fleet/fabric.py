"""all_reduce_perf output read back into figures, for `trainctl fabric verdict`.

Two layouts, both with nccl-tests' columns (size, count, type, redop, root, then time, algbw, busbw,
#wrong): nccl-tests' own, out of place then in place, and the benchmark's (container/benchmark), in place
then its median time. Rows may carry a launcher's prefix (`[1,0]<stdout>:` from mpirun --tag-output, `0:`
from srun -l, `[n0]` from `trainctl logs`). The figure kept is the first busbw of a row: out of place for
nccl-tests, as the published references are; in place for the benchmark, which measures nothing else.
When a size appears in more than one table the last one counts (the cross-node table follows the
per-node ones).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from config.fabric_references import HEALTHY, Verdict, judge, size_text

# nccl-tests' -d types and -o operations (src/common.cu: test_typenames, test_opnames).
_TYPES = "int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|f8e4m3|f8e5m2"
_OPS = "sum|prod|max|min|avg|mulsum|none"
_NUMBER = r"(\d+(?:\.\d+)?)"
ROW = re.compile(
    rf"(?:^|[\s:>\]])(\d+)\s+(\d+)\s+(?:{_TYPES})\s+(?:{_OPS})\s+-?\d+\s+{_NUMBER}\s+{_NUMBER}\s+{_NUMBER}"
    r"(?:\s+(\d+|N/A))?(?:\s|$)"
)


@dataclass(frozen=True)
class Figure:
    bytes: int
    algbw_GBps: float
    busbw_GBps: float
    wrong: int | None = None  # the row's #wrong (None: not checked, nccl-tests' `N/A` under -c 0)


def parse_figures(lines: Iterable[str]) -> list[Figure]:
    """The rows of every all_reduce_perf table in `lines`, one per size (the last seen), by size."""
    found: dict[int, Figure] = {}
    for line in lines:
        if line.lstrip().startswith("#"):
            continue
        match = ROW.search(line)
        if match is None:
            continue
        size, _count, _time, algbw, busbw, wrong = match.groups()
        checked = int(wrong) if wrong and wrong.isdigit() else None
        found[int(size)] = Figure(int(size), float(algbw), float(busbw), checked)
    return [found[size] for size in sorted(found)]


def fabric_judgement(figures: list[Figure], instance_type: str, nodes: int) -> Verdict:
    return judge({figure.bytes: figure.busbw_GBps for figure in figures}, instance_type, nodes)


def verdict_line(verdict: Verdict, instance_type: str, nodes: int) -> str:
    """`healthy: 2 x p5.48xlarge, 441.81 GB/s at 1 GiB against the published 439.38 GB/s (>= 90%)`."""
    return f"{verdict.word}: {nodes} x {instance_type}, {verdict.reason}"


def figures_table(figures: list[Figure], judged: int | None) -> list[str]:
    """One line per size of 1 MiB and more (every size when none is that large); `*` marks the size judged."""
    large = [figure for figure in figures if figure.bytes >= 1024**2] or figures
    lines = [f"  {'size':>10}  {'algbw GB/s':>11}  {'busbw GB/s':>11}"]
    for figure in large:
        mark = "  *" if figure.bytes == judged else ""
        lines.append(f"  {size_text(figure.bytes):>10}  {figure.algbw_GBps:>11.2f}  {figure.busbw_GBps:>11.2f}{mark}")
    return lines


def is_healthy(verdict: Verdict) -> bool:
    return verdict.word == HEALTHY
