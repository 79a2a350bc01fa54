"""Which node makes a fleet's all-reduce slow: measure disjoint pairs of nodes at once and bisect, in at
most two rounds (docs/observability.md, "Naming the slow node").

Round 1 pairs the nodes in order, (0, 1), (2, 3), ...; with an odd count the last node sits out (pairing
it twice would put one node in two concurrent measurements) and is measured in round 2 against a good
node. Pairs below the bar are slow and both their nodes suspects. Round 2 pairs every suspect with a
node of a pair that passed, so each suspect is judged on its own; a suspect whose round-2 pair is slow is
named. Three nodes with the one pair slow have no passing pair: the node that sat out probes the pair's
first node, which names one of the two on the assumption that only one is slow.

The bar: the two-node reference of the instance type at the message size measured
(fabric_references.judge with nodes=2: a pair passes at >= HEALTHY_RATIO x the published median).
Without one (an uncalibrated type or size), relative: a pair is slow below HEALTHY_RATIO x the best pair
of round 1, which finds nothing when round 1 has a single pair or when every node is equally slow.

Not found, with the reason, when no pair is slow (the full all-reduce's shortfall is not one node's),
when every pair is slow (the fabric or every node, not one node), or when too few pairs pass to partner
every suspect. Standard library only (Python 3.10): the benchmark runs it, tests call it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fabric_references import DEGRADED, HEALTHY, HEALTHY_RATIO, UNCALIBRATED, judge, size_text

# One size per pair, timed PAIR_ITERS times after one check and one warm-up all-reduce: 12 all-reduces of
# 1 GiB move under 12 x 2 x 1 GiB per rank, so a round (its pairs run at once) stays within 90 s while
# every pair reaches 0.3 GB/s busbw (a pair without EFA on p4d reaches 4 to 8). 1 GiB is the smallest size
# with a published two-node figure (p5, p4d, p4de).
PAIR_MAX_BYTES = 1024**3
PAIR_ITERS = 10
PAIR_WARMUP = 1

Pair = tuple[int, int]
# Measures the given disjoint pairs at the same time; returns each pair's busbw (GB/s), in order.
Measure = Callable[[Sequence[Pair]], Sequence[float]]


@dataclass(frozen=True)
class PairResult:
    nodes: Pair
    busbw_GBps: float
    slow: bool


@dataclass(frozen=True)
class Bisection:
    rounds: list[list[PairResult]]
    bar_GBps: float
    calibrated: bool  # the bar is the published two-node reference (else relative to the best pair)
    named: list[int]  # the slow node(s), by position in the node list
    reason: str  # one line: why these were named, or why none was
    unresolved: list[int] = field(default_factory=list)


def pair_bar(instance_type: str, message_bytes: int) -> float | None:
    """The lowest healthy busbw (GB/s) of two nodes of the type at this size, by the published
    references; None when nothing is published for two nodes there."""
    verdict = judge({message_bytes: 0.0}, instance_type, 2)
    if verdict.word not in (HEALTHY, DEGRADED) or verdict.reference_GBps is None:
        return None
    return HEALTHY_RATIO * verdict.reference_GBps


def _measure(measure: Measure, pairs: list[Pair], bar: float | None) -> tuple[list[PairResult], float]:
    figures = list(measure(pairs))
    if len(figures) != len(pairs):
        raise ValueError(f"measured {len(figures)} figures for {len(pairs)} pairs")
    if bar is None:
        bar = HEALTHY_RATIO * max(figures, default=0.0)
    return [PairResult(pair, busbw, busbw < bar) for pair, busbw in zip(pairs, figures, strict=True)], bar


def bisect(nodes: int, measure: Measure, bar_GBps: float | None) -> Bisection:
    """Find the slow node(s) among `nodes` nodes (0 .. nodes - 1) in at most two rounds of `measure`.
    `bar_GBps`: the healthy two-node figure (pair_bar); None: relative to round 1's best pair."""
    if nodes < 3:
        raise ValueError(f"bisecting needs at least 3 nodes, got {nodes}: two nodes are one pair already")
    calibrated = bar_GBps is not None
    pairs = [(node, node + 1) for node in range(0, nodes - 1, 2)]
    sitter = nodes - 1 if nodes % 2 else None
    first, bar = _measure(measure, pairs, bar_GBps)
    good = [node for result in first if not result.slow for node in result.nodes]
    suspects = [node for result in first if result.slow for node in result.nodes]
    slow_pairs = sum(result.slow for result in first)
    probe: Pair | None = None
    if sitter is not None:
        if good:
            suspects.append(sitter)
        elif slow_pairs == 1:
            probe = (first[0].nodes[0], sitter)
    if not suspects and probe is None:
        return Bisection([first], bar, calibrated, [], "not found: every pair reached the bar, so no one node is slow")
    if not good and probe is None:
        return Bisection(
            [first],
            bar,
            calibrated,
            [],
            "not found: every pair is below the bar: the fabric or every node, not one node",
        )
    if probe is not None:
        second, _ = _measure(measure, [probe], bar)
        (result,) = second
        pair = first[0].nodes
        named = [pair[0]] if result.slow else [pair[1]]
        reason = "slow with both partners" if result.slow else "its round-1 partner passed with the node that sat out"
        return Bisection([first, second], bar, calibrated, named, f"{reason} (assuming one slow node)")
    # More suspects than good nodes: the first ones get partners, the rest stay unresolved.
    partnered = list(zip(suspects, good, strict=False))
    unresolved = suspects[len(partnered) :]
    second, _ = _measure(measure, partnered, bar)
    named = [result.nodes[0] for result in second if result.slow]
    left = "; some suspects not measured alone (too few passing pairs)" if unresolved else ""
    if named:
        reason = f"below the bar with a node that passed round 1{left}"
    else:
        reason = (
            f"not found: every suspect passed with a good partner (a slow link between pairs, or a transient){left}"
        )
    return Bisection([first, second], bar, calibrated, named, reason, unresolved)


def should_bisect(fabric_word: str, nodes: int, bar_GBps: float | None) -> bool:
    """After the full all-reduce: bisect more than two nodes when their verdict is degraded, or
    uncalibrated while a two-node bar exists at the pairs' size (pair_bar: the pairs are then the only
    calibrated judgement). Never when healthy, nor uncalibrated without a two-node bar."""
    if nodes < 3:
        return False
    return fabric_word == DEGRADED or (fabric_word == UNCALIBRATED and bar_GBps is not None)


def pair_size(measured: Sequence[int]) -> int:
    """The pairs' one message size: the largest the full sweep measured, up to PAIR_MAX_BYTES."""
    return max((size for size in measured if size <= PAIR_MAX_BYTES), default=min(measured))


def as_report(result: Bisection, labels: Sequence[str], message_bytes: int, seconds: float) -> dict[str, object]:
    """The report's "bisect" entry: nodes by their labels ("node <Batch index> (<hostname>)")."""
    return {
        "message_bytes": message_bytes,
        "bar_GBps": round(result.bar_GBps, 3),
        "bar": "published two-node reference" if result.calibrated else f"{HEALTHY_RATIO:.0%} of the best pair",
        "rounds": [
            [
                {"pair": [labels[r.nodes[0]], labels[r.nodes[1]]], "busbw_GBps": round(r.busbw_GBps, 3), "slow": r.slow}
                for r in one
            ]
            for one in result.rounds
        ],
        "slow_nodes": [labels[node] for node in result.named],
        "unresolved": [labels[node] for node in result.unresolved],
        "reason": result.reason,
        "seconds": round(seconds, 3),
    }


def report_lines(entry: dict[str, object]) -> list[str]:
    """The `#` lines of the report's "bisect" entry (as_report): one per round, then the verdict."""
    lines = []
    rounds = entry["rounds"]
    assert isinstance(rounds, list)
    for number, pairs in enumerate(rounds, start=1):
        parts = [
            f"{' + '.join(pair['pair'])} {pair['busbw_GBps']:.2f} GB/s{' SLOW' if pair['slow'] else ''}"
            for pair in pairs
        ]
        lines.append(f"# bisect round {number}: {'; '.join(parts)}")
    slow = entry["slow_nodes"]
    how = (
        f"{len(rounds)} round(s) of {size_text(int(str(entry['message_bytes'])))} pairs against "
        f"{entry['bar_GBps']} GB/s ({entry['bar']}), {entry['seconds']} s"
    )
    if slow:
        assert isinstance(slow, list)
        lines.append(f"# slow node: {', '.join(slow)}: {entry['reason']} ({how})")
    else:
        lines.append(f"# slow node {entry['reason']} ({how})")
    return lines
