"""The all-reduce benchmark's verdicts and what it says about them: the fabric against published runs
of the same type and node count (fabric_references.py, a copy of config/fabric_references.py: the
verdict `trainctl check` and `trainctl fabric verdict` make), a node's own check against its GPUs'
interconnect, the worst of several verdicts, the CloudWatch embedded-metric line and the short summary
line that ends the run (allreduce_bench.py runs the benchmark).

No torch here: trainctl's tests make benchmark output with these functions without importing it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from fabric_references import judge

# CloudWatch embedded metric format (config/metrics.py holds the same strings; a test pins them).
METRIC_NAMESPACE = "TrainingPlatform"
FLEET_DIMENSION = "Fleet"
FLEET_ENV = "TRAINING_FLEET"
BUSBW_METRIC = "BenchmarkBusBandwidthGbps"
VERDICT_METRIC = "BenchmarkVerdict"
# A property of the metric line, not a metric: the nodes the pairs phase named (allreduce_pairs.py).
SLOW_NODES_FIELD = "SlowNodes"
# uncalibrated: the check ran and nothing published to judge it by (neither healthy nor failing; the
# fleet check's missing-verdict alarm still sees a verdict arrive).
VERDICT_VALUES = {"healthy": 1.0, "uncalibrated": 0.75, "degraded": 0.5, "broken": 0.0, "wrong-result": 0.0}

# A node's own check (all GPUs of one node, no network) against its GPUs' published interconnect
# bandwidth. This project's rule of thumb, not an AWS figure: a GPU pair that lost NVLink falls back to
# PCIe, a tenth of NVLink or less. Across nodes the fabric verdict (fabric_references.judge) applies.
HEALTHY_FRACTION = 0.5
DEGRADED_FRACTION = 0.1
# Worst first: the final verdict is the worst of the node and fabric verdicts.
VERDICT_ORDER = ("wrong-result", "broken", "degraded", "uncalibrated", "unknown", "healthy")


def fabric_verdict(busbw_by_size: dict[int, float], instance_type: str, nodes: int) -> dict[str, object]:
    """The calibrated fabric verdict as the report carries it: word, size judged, busbw and the
    published median there (GB/s), the likely cause, the one-line reason."""
    judged = asdict(judge(busbw_by_size, instance_type, nodes))
    return {"verdict": judged.pop("word"), "instance_type": instance_type or None, **judged}


def verdict(busbw_gbps: float, published_gbps: float) -> tuple[float | None, str]:
    """A node's check: (busbw as a fraction of its GPUs' published bandwidth, one word)."""
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


@dataclass(frozen=True)
class NodeCheck:
    node: str  # "node <Batch node index or torchrun node rank> (<hostname>)"
    ranks: int
    busbw_gbps: float
    fraction: float | None
    verdict: str
    wrong: int


def node_check(label: str, ranks: int, busbw_gbytes: float, wrong: int, node_gbps: float) -> NodeCheck:
    busbw_gbps = busbw_gbytes * 8
    fraction, word = verdict(busbw_gbps, node_gbps)
    return NodeCheck(label, ranks, round(busbw_gbps, 3), fraction, "wrong-result" if wrong else word, wrong)


SUMMARY_FIELDS = (
    "world_size",
    "nodes",
    "busbw_gbps",
    "verdict",
    "fabric",
    "failing_nodes",
    "degraded_nodes",
    "slow_nodes",
    "correct",
)


def summary(report: dict[str, object]) -> dict[str, object]:
    """The report's verdict fields alone, for the benchmark's last line."""
    return {"summary": True, **{key: report[key] for key in SUMMARY_FIELDS if key in report}}


def metric_line(fleet: str, busbw_gbps: float, word: str, slow_nodes: Sequence[str] = ()) -> str:
    """One CloudWatch embedded-metric-format event (CloudWatch user guide, "Specification: Embedded
    metric format"); CloudWatch Logs extracts it from the job's log stream, no header needed
    ("Using the PutLogEvents API to send manually-created embedded metric format logs"). The slow
    nodes the pairs phase named ride along as SLOW_NODES_FIELD, a property of the log event that no
    metric or dimension names: the record keeps the node, the metrics stay one series per fleet."""
    metrics: list[dict[str, str]] = [{"Name": BUSBW_METRIC, "Unit": "Gigabits/Second"}]
    event: dict[str, object] = {FLEET_DIMENSION: fleet, BUSBW_METRIC: round(busbw_gbps, 3)}
    if slow_nodes:
        event[SLOW_NODES_FIELD] = list(slow_nodes)
    if word in VERDICT_VALUES:
        metrics.append({"Name": VERDICT_METRIC, "Unit": "None"})
        event[VERDICT_METRIC] = VERDICT_VALUES[word]
    event["_aws"] = {
        "Timestamp": int(time.time() * 1000),
        "CloudWatchMetrics": [{"Namespace": METRIC_NAMESPACE, "Dimensions": [[FLEET_DIMENSION]], "Metrics": metrics}],
    }
    return json.dumps(event)
