"""The all-reduce benchmark's verdicts and what it says about them: a measured bandwidth against a
published one, the worst of several verdicts, a node's own check, the CloudWatch embedded-metric
line and the short summary line that ends the run (allreduce_bench.py runs the benchmark).

No torch here: trainctl's tests make benchmark output with these functions without importing it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

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
