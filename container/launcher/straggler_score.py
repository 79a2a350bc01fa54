"""Which node of a data-parallel job trains slower than the others, from each rank's compute time before its
first gradient collective of every step.

In synchronous data parallelism every rank waits at each collective for the slowest, so step times look the
same everywhere; what a slow GPU, a throttled card or a noisy neighbour does show is a longer stretch of work
before the rank's first collective of the step (a rank on a slow node reaches it late, the others wait
inside it). So each window of samples is scored per node:

- a rank's value is the median of its samples in the window; a node's is its slowest rank's (one slow GPU
  of eight must not hide in the node's median), and that rank is the one named;
- the node is compared with the median of the other nodes' values, not with the fastest: its ratio is its
  value over that median, its excess the difference (every node's value is its slowest rank's, so the
  comparison is like with like however many ranks a node has);
- the window counts against the node at `ratio` or more with at least `min_excess_seconds` of excess (a
  1.2x ratio on a 5 ms step is noise, not a straggler); the node is a straggler after `windows`
  consecutive such windows, and one clean window starts the count again.

A node only ever compares with the others, so with two nodes a slow one and a fast one both differ; the
threshold and the run of windows decide which is out of line, and a job of two equally slow nodes has no
straggler. Python 3.10, stdlib.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

# node -> rank -> the window's samples (seconds from the step's start to the rank's first gradient collective)
Window = Mapping[int, Mapping[int, Sequence[float]]]


@dataclass(frozen=True)
class Thresholds:
    ratio: float = 1.20  # STRAGGLER_RATIO
    min_excess_seconds: float = 0.010  # STRAGGLER_MIN_EXCESS_MS / 1000
    windows: int = 3  # STRAGGLER_WINDOWS


@dataclass(frozen=True)
class NodeScore:
    node: int
    rank: int  # its slowest rank
    seconds: float  # that rank's median
    others: float  # the median of the other nodes' values
    slow: bool

    @property
    def ratio(self) -> float:
        return self.seconds / self.others if self.others > 0 else float("inf")


def score(window: Window, thresholds: Thresholds) -> dict[int, NodeScore]:
    """Each node's score for one window; empty with fewer than two nodes that have samples."""
    ranks = {
        node: {rank: median(samples) for rank, samples in by_rank.items() if samples}
        for node, by_rank in window.items()
    }
    ranks = {node: values for node, values in ranks.items() if values}
    if len(ranks) < 2:
        return {}
    slowest = {node: max(values, key=lambda r: (values[r], -r)) for node, values in ranks.items()}
    paces = {node: ranks[node][rank] for node, rank in slowest.items()}
    scores: dict[int, NodeScore] = {}
    for node, rank in slowest.items():
        others = median([pace for other, pace in paces.items() if other != node])
        seconds = paces[node]
        slow = seconds >= thresholds.ratio * others and seconds - others >= thresholds.min_excess_seconds
        scores[node] = NodeScore(node, rank, seconds, others, slow)
    return scores


@dataclass
class StragglerWatch:
    """Windows in, stragglers out: what the main node's watch keeps between windows."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    streaks: dict[int, int] = field(default_factory=dict)  # node -> consecutive slow windows

    def add(self, window: Window) -> tuple[dict[int, NodeScore], list[NodeScore]]:
        """The window's scores, and the nodes that are stragglers after it (slowest first). A node without
        samples in a window keeps its count: a window it missed says nothing about its pace."""
        scores = score(window, self.thresholds)
        for node, result in scores.items():
            self.streaks[node] = self.streaks.get(node, 0) + 1 if result.slow else 0
        found = [result for node, result in scores.items() if self.streaks[node] >= self.thresholds.windows]
        return scores, sorted(found, key=lambda result: -result.ratio)
