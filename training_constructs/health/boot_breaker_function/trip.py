"""Lambda handler: a fleet's node-fault circuit breaker. Disables the fleet's compute environments once
enough of its nodes failed within the alarm's hour, and says so on the job-alert topic: which checks
failed, and the command that turns the fleet back on. A node fault is a boot check's node fault (the
node never registered) or a take-out its host confirmed (a node asked to be taken out during a job, and
the host's own check, node_scripts/boot_check.py `confirm`, found a node fault: TakeOutConfirmed 1). Both
are lines the hosts write to the fleet's boot-check log group with the instance role; no job can write
there, and the job log group, where a job prints whatever it likes, is never read.

Invoked by an EventBridge rule on the fleet's breaker alarm entering ALARM, with a constant input
naming the fleet, its compute environments, its boot-check log group and its threshold. The
alarm decides "within an hour"; the logs are the evidence: the function counts the node-fault lines of
the lookback (the alarm's period and as much again, for the alarm's own delay) and does nothing below
the threshold. Batch may refuse UpdateComputeEnvironment while the environment is being updated (an
update runs for minutes; ClientException is how the Batch API reports a request it refuses): the
function retries with a growing backoff until UPDATE_DEADLINE_SECONDS, then fails, and Lambda retries
the invocation (asynchronous invocation: two more attempts, Lambda developer guide, "Error handling and
automatic retries") while the function's Errors alarm pages. Stdlib plus the boto3 that Lambda's Python
runtimes include (Lambda developer guide, "Building Lambda functions with Python").
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable
from typing import Any

# Set by training_constructs/health/boot_breaker.py from the same constants as the alarm.
LOOKBACK_ENV = "LOOKBACK_SECONDS"
TOPIC_ENV = "ALERT_TOPIC_ARN"
FAULT_FIELD, NODE_FAULT = "Fault", "node"  # config/metrics.py FAULT_DIMENSION, BOOT_FAULTS[0]
CONFIRMED_FIELD = "TakeOutConfirmed"  # config/metrics.py TAKE_OUT_CONFIRMED
MAX_PAGES = 20
# Refusals worth waiting out: an update in progress (ClientException), Batch's own errors, throttling.
RETRIED_ERRORS = frozenset({"ClientException", "ServerException", "TooManyRequestsException", "ThrottlingException"})
FIRST_BACKOFF_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 60.0
# Inside the function's 15-minute timeout (boot_breaker.py), with room for the message.
UPDATE_DEADLINE_SECONDS = 780.0


def _lines(logs: Any, request: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON-object lines of a FilterLogEvents request, over its pages."""
    found: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        page = logs.filter_log_events(**request)
        for event in page.get("events", []):
            try:
                line = json.loads(event["message"])
            except ValueError:
                continue
            if isinstance(line, dict):
                found.append(line)
        if not page.get("nextToken"):
            break
        request["nextToken"] = page["nextToken"]
    return found


def host_lines(logs: Any, log_group: str, since_ms: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The fleet's boot-check log group since `since_ms`: the boot checks that found a node fault (one line per
    node boot), and the take-outs the host confirmed (one per instance: a repeated line counts once)."""
    lines = _lines(logs, {"logGroupName": log_group, "startTime": since_ms})
    faults = [line for line in lines if line.get(FAULT_FIELD) == NODE_FAULT]
    confirmed = {str(line.get("InstanceId")): line for line in lines if line.get(CONFIRMED_FIELD) == 1}
    return faults, list(confirmed.values())


def _wait(seconds: float) -> None:
    time.sleep(seconds)


def disable(batch: Any, arn: str, deadline: float, sleep: Callable[[float], None] | None = None) -> str | None:
    """DISABLED, retried with a growing backoff while Batch refuses it; the last refusal as text, or None."""
    backoff = FIRST_BACKOFF_SECONDS
    while True:
        try:
            batch.update_compute_environment(computeEnvironment=arn, state="DISABLED")
            return None
        except Exception as error:  # botocore's ClientError, without importing botocore at synth
            code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
            if code not in RETRIED_ERRORS:
                raise
            if time.monotonic() + backoff > deadline:
                return f"{code}: {error}"
            print(json.dumps({"computeEnvironment": arn, "refused": code, "retryInSeconds": backoff}))
            (sleep or _wait)(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


def enable_command(compute_environment: str) -> str:
    return f"aws batch update-compute-environment --compute-environment {compute_environment} --state ENABLED"


def message(
    fleet: str,
    environments: list[str],
    log_group: str,
    faults: list[dict[str, Any]],
    taken_out: list[dict[str, Any]],
    hours: float,
) -> str:
    counted = collections.Counter(failure for line in faults for failure in line.get("failed", []))
    counted.update(f"taken out: {failure}"[:120] for line in taken_out for failure in line.get("failed", []))
    checks = "; ".join(f"{failure} ({n} node{'s' if n > 1 else ''})" for failure, n in counted.most_common())
    return (
        f"Fleet {fleet}: {len(faults)} nodes failed the boot check with a node fault and {len(taken_out)} were taken "
        f"out during a job with a fault their host confirmed in the last {hours:g} h ({checks or 'no failure lines'}). "
        "The circuit breaker disabled its compute environments (one per placement): they launch no instances, "
        f"running jobs go on, queued jobs wait. Read the lines in log group {log_group}, fix the cause (AMI, "
        "instance type, launch template), then turn the fleet back on: "
        + "; ".join(enable_command(arn) for arn in environments)
    )


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    import boto3  # here, so that the app imports this module's names at synth without boto3

    fleet, environments, log_group = event["fleet"], list(event["computeEnvironments"]), event["logGroup"]
    threshold = int(event["nodeFaultsToTrip"])
    lookback = int(os.environ[LOOKBACK_ENV])
    since_ms = int((time.time() - lookback) * 1000)
    faults, taken_out = host_lines(boto3.client("logs"), log_group, since_ms)
    counted = len(faults) + len(taken_out)
    if counted < threshold:
        # The alarm fired but the logs do not show enough: say so, disable nothing.
        print(json.dumps({"fleet": fleet, "tripped": False, "nodeFaults": counted, "threshold": threshold}))
        return {"tripped": False, "nodeFaults": counted}
    # A DISABLED managed compute environment does not scale out; jobs already STARTING or RUNNING
    # continue (Batch API, ComputeEnvironmentDetail.state).
    batch = boto3.client("batch")
    deadline = time.monotonic() + UPDATE_DEADLINE_SECONDS
    refused = {arn: why for arn in environments if (why := disable(batch, arn, deadline))}
    if refused:
        # Raised, so that Lambda retries the invocation and the function's Errors alarm pages.
        raise RuntimeError(f"fleet {fleet}: Batch kept refusing to disable {refused}")
    text = message(fleet, environments, log_group, faults, taken_out, lookback / 3600)
    boto3.client("sns").publish(
        TopicArn=os.environ[TOPIC_ENV], Subject=f"Fleet {fleet} stopped: node-fault circuit breaker", Message=text
    )
    print(json.dumps({"fleet": fleet, "tripped": True, "nodeFaults": counted, "computeEnvironments": environments}))
    return {"tripped": True, "nodeFaults": counted}
