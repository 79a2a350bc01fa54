"""container/benchmark/node_bisect.py: naming the slow node of a fleet from pairs measured at once, on
synthetic fleets (a pair runs at its slower node's speed), against the published two-node p5 bar and
relative to the best pair; the report entry and its `#` lines. Standard library only, no torch."""

from __future__ import annotations

import ast
import sys
from collections.abc import Sequence

import pytest

from tests.harness import ROOT

BENCH_DIR = ROOT / "container" / "benchmark"
sys.path.insert(0, str(BENCH_DIR))
import node_bisect  # noqa: E402
from fabric_references import GIB, HEALTHY_RATIO  # noqa: E402

HEALTHY_GBPS = 440.0  # two healthy p5 nodes at 1 GiB
SLOW_GBPS = 20.0  # a node on one EFA of four
# The published two-node p5 medians at 1 GiB: 441.81 (Batch) and 436.95 (Slurm).
P5_BAR = HEALTHY_RATIO * (441.81 + 436.95) / 2


class Fleet:
    """A synthetic fleet: each node's own speed; a pair reaches the slower of its two. Records every
    call, so a test sees the rounds and that each round's pairs are disjoint."""

    def __init__(self, speeds: Sequence[float]) -> None:
        self.speeds = list(speeds)
        self.calls: list[list[tuple[int, int]]] = []

    def __call__(self, pairs: Sequence[tuple[int, int]]) -> list[float]:
        members = [node for pair in pairs for node in pair]
        assert len(members) == len(set(members)), f"a node is in two pairs at once: {pairs}"
        self.calls.append(list(pairs))
        return [min(self.speeds[a], self.speeds[b]) for a, b in pairs]


def fleet(count: int, slow: Sequence[int] = (), healthy: float = HEALTHY_GBPS) -> Fleet:
    return Fleet([SLOW_GBPS if node in slow else healthy for node in range(count)])


def test_the_bar_is_the_published_two_node_reference():
    assert node_bisect.pair_bar("p5.48xlarge", GIB) == pytest.approx(P5_BAR)
    # Nothing published for two nodes of the type, or at that size: no bar (relative instead).
    assert node_bisect.pair_bar("p5en.48xlarge", GIB) is None
    assert node_bisect.pair_bar("p5.48xlarge", 1024 * 1024) is None


@pytest.mark.parametrize("slow", range(8))
def test_one_slow_node_of_eight_is_named_in_exactly_two_rounds(slow):
    measure = fleet(8, [slow])
    result = node_bisect.bisect(8, measure, node_bisect.pair_bar("p5.48xlarge", GIB))
    assert result.named == [slow] and result.calibrated
    assert len(measure.calls) == 2 and len(result.rounds) == 2
    # Round 1 pairs every node once; round 2 pairs the two suspects with nodes of passing pairs.
    assert sorted(n for pair in measure.calls[0] for n in pair) == list(range(8))
    partner = slow ^ 1
    assert sorted(pair[0] for pair in measure.calls[1]) == sorted([slow, partner])
    assert all(pair[1] not in (slow, partner) for pair in measure.calls[1])
    assert [r.slow for r in result.rounds[1]].count(True) == 1
    assert "not found" not in result.reason


def test_two_slow_nodes_in_different_pairs_are_both_named():
    result = node_bisect.bisect(8, fleet(8, [2, 5]), P5_BAR)
    assert sorted(result.named) == [2, 5] and len(result.rounds) == 2


def test_two_slow_nodes_in_one_pair_are_both_named():
    result = node_bisect.bisect(8, fleet(8, [6, 7]), P5_BAR)
    assert sorted(result.named) == [6, 7]


def test_every_node_slow_names_none_and_says_the_fabric():
    measure = fleet(8, range(8))
    result = node_bisect.bisect(8, measure, P5_BAR)
    assert result.named == [] and len(measure.calls) == 1
    assert result.reason.startswith("not found: every pair is below the bar") and "not one node" in result.reason


def test_a_healthy_fleet_stops_after_one_round():
    measure = fleet(6)
    result = node_bisect.bisect(6, measure, P5_BAR)
    assert result.named == [] and len(measure.calls) == 1 and result.reason.startswith("not found: every pair reached")


@pytest.mark.parametrize(("count", "slow"), [(5, 4), (7, 1), (7, 6)])
def test_odd_counts_measure_the_node_that_sat_out_in_round_two(count, slow):
    measure = fleet(count, [slow])
    result = node_bisect.bisect(count, measure, P5_BAR)
    assert result.named == [slow] and len(measure.calls) == 2
    # The last node sits out round 1 and is paired with a node that passed in round 2.
    assert count - 1 not in {n for pair in measure.calls[0] for n in pair}
    assert count - 1 in {pair[0] for pair in measure.calls[1]}


def test_odd_count_with_nothing_slow_still_checks_the_node_that_sat_out():
    measure = fleet(5)
    result = node_bisect.bisect(5, measure, P5_BAR)
    assert result.named == [] and measure.calls[1] == [(4, 0)]


@pytest.mark.parametrize("slow", [0, 1, 2])
def test_three_nodes_name_the_slow_one_in_two_rounds(slow):
    measure = fleet(3, [slow])
    result = node_bisect.bisect(3, measure, P5_BAR)
    assert result.named == [slow] and len(measure.calls) == 2 and measure.calls[0] == [(0, 1)]


def test_uncalibrated_bar_is_relative_to_the_best_pair():
    # No published figure: a pair below 90% of round 1's best is slow, whatever the absolute speed.
    measure = fleet(6, [3], healthy=100.0)
    result = node_bisect.bisect(6, measure, None)
    assert result.named == [3] and not result.calibrated and result.bar_GBps == pytest.approx(90.0)
    # Every node equally slow: nothing stands out relative to the best, so nothing is named.
    flat = node_bisect.bisect(6, fleet(6, range(6)), None)
    assert flat.named == [] and len(flat.rounds) == 1


def test_too_few_passing_pairs_leave_suspects_unresolved():
    # Three slow pairs of four: two good nodes partner two of the six suspects.
    result = node_bisect.bisect(8, fleet(8, [0, 2, 4]), P5_BAR)
    assert len(result.unresolved) == 4 and "too few passing pairs" in result.reason
    assert 0 in result.named and set(result.named) <= {0, 1, 2}


def test_fewer_than_three_nodes_are_refused():
    with pytest.raises(ValueError, match="at least 3 nodes, got 2"):
        node_bisect.bisect(2, fleet(2), P5_BAR)


@pytest.mark.parametrize(
    ("word", "nodes", "bar", "expected"),
    [
        ("degraded", 8, None, True),  # relative bar: a degraded fleet is bisected anyway
        ("uncalibrated", 8, P5_BAR, True),  # the pairs are the only calibrated judgement
        ("uncalibrated", 8, None, False),
        ("healthy", 8, P5_BAR, False),
        ("degraded", 2, P5_BAR, False),  # two nodes are one pair already
        ("wrong-result", 8, P5_BAR, False),
    ],
)
def test_when_the_benchmark_bisects(word, nodes, bar, expected):
    assert node_bisect.should_bisect(word, nodes, bar) is expected


def test_pairs_use_the_largest_size_up_to_one_gib():
    assert node_bisect.pair_size([8192, GIB // 2, GIB]) == GIB
    assert node_bisect.pair_size([1024 * 1024, 2 * GIB]) == 1024 * 1024
    assert node_bisect.pair_size([2 * GIB]) == 2 * GIB


def test_report_names_nodes_by_label_and_prints_the_rounds():
    labels = [f"node {i} (ip-10-0-0-{i})" for i in range(4)]
    result = node_bisect.bisect(4, fleet(4, [3]), P5_BAR)
    entry = node_bisect.as_report(result, labels, GIB, 1.25)
    assert entry["slow_nodes"] == ["node 3 (ip-10-0-0-3)"]
    assert entry["rounds"][0][1] == {"pair": labels[2:4], "busbw_GBps": SLOW_GBPS, "slow": True}
    assert len(entry["rounds"]) == 2 and entry["bar"] == "published two-node reference"
    lines = node_bisect.report_lines(entry)
    assert lines[0] == (
        "# bisect round 1: node 0 (ip-10-0-0-0) + node 1 (ip-10-0-0-1) 440.00 GB/s; "
        "node 2 (ip-10-0-0-2) + node 3 (ip-10-0-0-3) 20.00 GB/s SLOW"
    )
    assert lines[1].startswith("# bisect round 2: node 2 (ip-10-0-0-2) + node 0 (ip-10-0-0-0) 440.00 GB/s; ")
    assert lines[-1].startswith("# slow node: node 3 (ip-10-0-0-3): below the bar")
    assert f"2 round(s) of 1 GiB pairs against {round(P5_BAR, 3)} GB/s" in lines[-1] and "1.25 s" in lines[-1]
    none = node_bisect.as_report(node_bisect.bisect(4, fleet(4, range(4)), P5_BAR), labels, GIB, 0.5)
    assert node_bisect.report_lines(none)[-1].startswith("# slow node not found: every pair is below the bar")


def test_the_planner_needs_nothing_beyond_the_standard_library():
    tree = ast.parse((BENCH_DIR / "node_bisect.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported.discard("fabric_references")
    assert {name.split(".")[0] for name in imported} <= sys.stdlib_module_names, imported
