"""Lambda handler: a fleet's boot-check circuit breaker. Disables the fleet's compute environment once
enough of its nodes failed the boot check with a node fault within the alarm's hour, and says so on the
job-alert topic: which checks failed, and the command that turns the fleet back on.

Invoked by an EventBridge rule on the fleet's breaker alarm entering ALARM, with a constant input
naming the fleet, its compute environment and its boot-check log group. The alarm decides "within an
hour"; the boot-check log is the evidence: the function counts the node-fault lines of the lookback
(the alarm's period and as much again, for the alarm's own delay) and does nothing below the threshold.
Stdlib plus the boto3 that Lambda's Python runtimes include (Lambda developer guide, "Building Lambda
functions with Python").
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any

# Set by training_constructs/health/boot_breaker.py from the same constants as the alarm.
THRESHOLD_ENV = "NODE_FAULTS_TO_TRIP"
LOOKBACK_ENV = "LOOKBACK_SECONDS"
TOPIC_ENV = "ALERT_TOPIC_ARN"
FAULT_FIELD, NODE_FAULT = "Fault", "node"  # config/metrics.py FAULT_DIMENSION, BOOT_FAULTS[0]
MAX_PAGES = 20


def node_faults(logs: Any, log_group: str, since_ms: int) -> list[dict[str, Any]]:
    """The boot-check lines since `since_ms` that report a node fault (one line per node boot)."""
    found: list[dict[str, Any]] = []
    request: dict[str, Any] = {"logGroupName": log_group, "startTime": since_ms}
    for _ in range(MAX_PAGES):
        page = logs.filter_log_events(**request)
        for event in page.get("events", []):
            try:
                line = json.loads(event["message"])
            except ValueError:
                continue
            if isinstance(line, dict) and line.get(FAULT_FIELD) == NODE_FAULT:
                found.append(line)
        if not page.get("nextToken"):
            break
        request["nextToken"] = page["nextToken"]
    return found


def enable_command(compute_environment: str) -> str:
    return f"aws batch update-compute-environment --compute-environment {compute_environment} --state ENABLED"


def message(fleet: str, environments: list[str], log_group: str, faults: list[dict[str, Any]], hours: float) -> str:
    counted = collections.Counter(failure for line in faults for failure in line.get("failed", []))
    checks = "; ".join(f"{failure} ({n} node{'s' if n > 1 else ''})" for failure, n in counted.most_common())
    return (
        f"Fleet {fleet}: {len(faults)} nodes failed the boot check with a node fault in the last {hours:g} h "
        f"({checks or 'no failure lines'}). The circuit breaker disabled its compute environments (one per "
        "placement): they launch no instances, running jobs go on, queued jobs wait. Read the lines in log group "
        f"{log_group}, fix the cause (AMI, instance type, launch template), then turn the fleet back on: "
        + "; ".join(enable_command(arn) for arn in environments)
    )


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    import boto3  # here, so that the app imports this module's names at synth without boto3

    fleet, environments, log_group = event["fleet"], list(event["computeEnvironments"]), event["logGroup"]
    threshold, lookback = int(os.environ[THRESHOLD_ENV]), int(os.environ[LOOKBACK_ENV])
    since_ms = int((time.time() - lookback) * 1000)
    faults = node_faults(boto3.client("logs"), log_group, since_ms)
    if len(faults) < threshold:
        # The alarm fired but the log does not show enough: say so, disable nothing.
        print(json.dumps({"fleet": fleet, "tripped": False, "nodeFaults": len(faults), "threshold": threshold}))
        return {"tripped": False, "nodeFaults": len(faults)}
    # A DISABLED managed compute environment does not scale out; jobs already STARTING or RUNNING
    # continue (Batch API, ComputeEnvironmentDetail.state).
    batch = boto3.client("batch")
    for arn in environments:
        batch.update_compute_environment(computeEnvironment=arn, state="DISABLED")
    text = message(fleet, environments, log_group, faults, lookback / 3600)
    boto3.client("sns").publish(
        TopicArn=os.environ[TOPIC_ENV], Subject=f"Fleet {fleet} stopped: boot-check circuit breaker", Message=text
    )
    print(json.dumps({"fleet": fleet, "tripped": True, "nodeFaults": len(faults), "computeEnvironments": environments}))
    return {"tripped": True, "nodeFaults": len(faults)}
