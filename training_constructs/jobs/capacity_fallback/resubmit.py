"""Lambda handler: send a job that its queue cancelled for lack of capacity to the fleet's next placement.

Invoked by an EventBridge rule on "Batch Job State Change" events of a fleet's placement queues with
status FAILED and the capacity cancel's status reason (see CAPACITY_CANCEL) or the Capacity Block expiry's
(BLOCK_EXPIRY: stopped 40 minutes before its block ends, its final checkpoint uploaded). The job is submitted
again, once, to the next placement's queue whose window (a Capacity Block's, less its last half hour
and a job's expected start, see BLOCK_EARLY_END) holds the present:
same job definition, name, parameters, node count, environment and command (as DescribeJobs shows them:
see _overrides), share identifier, priority, timeout, retries and tags; the instance type of each node
range is the placement's. Every node range also gets CHECKPOINT_LINEAGE: the cancelled job's own, else
its id, so that the launcher (container/launcher/restore_phase.py) of the successor restores the
original's checkpoints.
Every decision is one JSON line in the function's log, which metric filters count.

ROUTES (environment, JSON): queue ARN -> {"fleet", "placement" (0 = the fleet's own), "label",
"next": [{"queue", "placement", "label", "instanceType", "start", "end"}, ...]}.
Stdlib, plus the boto3 that Lambda's Python runtime ships.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

# The statusReason Batch writes when a queue's jobStateTimeLimitActions cancels a job waiting for
# capacity (Batch user guide, "Jobs stuck in RUNNABLE due to capacity").
CAPACITY_CANCEL = "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
# The reason the Capacity Block expiry stops a block placement's jobs with, 40 minutes before the block
# ends (capacity_block_expiry/stop_jobs.py EXPIRY_REASON; a test pins the two): once the job has ended,
# its final checkpoint uploaded, it goes on at the next placement like a capacity cancel.
BLOCK_EXPIRY = "trainctl capacity-block:"
# Each reason this function acts on, and the event name its log lines carry.
RESUBMITTED_REASONS = {CAPACITY_CANCEL: "capacity-cancel", BLOCK_EXPIRY: "block-expiry"}
# Set on the cancelled job once its successor exists: a repeated event (EventBridge delivers at
# least once) finds it and submits nothing.
SUCCESSOR_TAG = "training:fallback-job"
# Set on the successor: the job it continues and the placement it was sent to.
ORIGIN_TAG = "training:fallback-of"
PLACEMENT_TAG = "training:placement"
# The launcher keys checkpoints on it, else on the job id (container/launcher/node_settings.py).
LINEAGE_VARIABLE = "CHECKPOINT_LINEAGE"
# Errors worth another try (botocore's standard retry mode's throttling and transient codes).
RETRIED_CODES = frozenset({"ThrottlingException", "TooManyRequestsException", "ServiceUnavailable", "InternalFailure"})
# Batch reserves the aws: prefix; tags it set itself cannot be passed to SubmitJob.
_RESERVED_TAG_PREFIX = "aws:"


def batch_client() -> Any:
    import boto3  # Lambda's Python runtime includes it

    return boto3.client("batch")


def log(**fields: Any) -> dict[str, Any]:
    print(json.dumps(fields, sort_keys=True))
    return fields


# EC2 starts terminating a Capacity Block's instances 30 minutes before the block ends (EC2 user
# guide, "Monitor Capacity Blocks using EventBridge": the expiration warning comes 40 minutes before
# the end and says termination begins 10 minutes later; Auto Scaling user guide, "Use Capacity Blocks
# for ML"). A job sent to a block also needs time before it runs: its queue's capacity wait, then
# instances launch and pull the image. A block takes no new job after end - BLOCK_EARLY_END - EXPECTED_START.
BLOCK_EARLY_END = timedelta(minutes=30)
EXPECTED_START = timedelta(minutes=20)


def last_routing_time(window: Mapping[str, Any]) -> datetime:
    """The last moment a job may still be sent to the block: it could start before EC2 ends it."""
    end = datetime.fromisoformat(str(window["end"]).replace("Z", "+00:00"))
    return end - BLOCK_EARLY_END - EXPECTED_START


def _inside(window: Mapping[str, Any], now: datetime) -> bool:
    if not window.get("start"):
        return True
    start = datetime.fromisoformat(str(window["start"]).replace("Z", "+00:00"))
    return start <= now < last_routing_time(window)


def next_placement(route: Mapping[str, Any], now: datetime) -> Mapping[str, Any] | None:
    """The first later placement usable now: a Capacity Block only from its start until
    last_routing_time (its end less the last half hour and a job's expected start)."""
    return next((p for p in route.get("next", []) if _inside(p, now)), None)


def lineage_of(job: Mapping[str, Any]) -> str:
    """The job's training lineage: the CHECKPOINT_LINEAGE it ran with (a job resubmitted before), else
    its own id (the first of its line)."""
    for node_range in (job.get("nodeProperties") or {}).get("nodeRangeProperties", []):
        for variable in (node_range.get("container") or {}).get("environment") or []:
            if variable.get("name") == LINEAGE_VARIABLE and variable.get("value"):
                return str(variable["value"])
    return str(job["jobId"])


def _overrides(job: Mapping[str, Any], instance_type: str) -> dict[str, Any]:
    """Node overrides that keep what the job ran with, as DescribeJobs shows it: its node count, and per
    node range the environment and command, with the job's lineage. DescribeJobs' JobDetail has
    nodeProperties and no nodeOverrides (Batch API reference, JobDetail); whether those nodeProperties
    carry the submission's overrides merged in is not documented (unverified). trainctl submits every job
    on a job definition revision that carries its command, environment and node count
    (trainctl/submitting/revisions.py), so a trainctl job comes back whole either way, and the successor
    names the same revision (`jobDefinition`). A job submitted by other means with overrides keeps them
    only if DescribeJobs merges them."""
    nodes = job.get("nodeProperties") or {}
    lineage = {"name": LINEAGE_VARIABLE, "value": lineage_of(job)}
    ranges = []
    for node_range in nodes.get("nodeRangeProperties", []):
        container = node_range.get("container") or {}
        override: dict[str, Any] = {"instanceType": instance_type}
        kept = [
            {"name": e["name"], "value": e.get("value", "")}
            for e in container.get("environment") or []
            if not str(e.get("name", "")).startswith("AWS_BATCH") and e.get("name") != LINEAGE_VARIABLE
        ]
        override["environment"] = [*kept, lineage]
        if container.get("command"):
            override["command"] = list(container["command"])
        ranges.append({"targetNodes": node_range["targetNodes"], "containerOverrides": override})
    result: dict[str, Any] = {"nodePropertyOverrides": ranges}
    if nodes.get("numNodes"):
        result["numNodes"] = int(nodes["numNodes"])
    return result


def resubmission(job: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
    """SubmitJob's arguments for the job on the target placement."""
    tags = {k: v for k, v in (job.get("tags") or {}).items() if not k.startswith(_RESERVED_TAG_PREFIX)}
    tags.pop(SUCCESSOR_TAG, None)
    tags[ORIGIN_TAG] = str(job["jobId"])
    tags[PLACEMENT_TAG] = str(target["placement"])
    request: dict[str, Any] = {
        "jobName": job["jobName"],
        "jobQueue": target["queue"],
        "jobDefinition": job["jobDefinition"],
        "nodeOverrides": _overrides(job, str(target["instanceType"])),
        "tags": tags,
    }
    optional = {
        "parameters": job.get("parameters"),
        "shareIdentifier": job.get("shareIdentifier"),
        "schedulingPriorityOverride": job.get("schedulingPriority"),
        "timeout": job.get("timeout"),
        "retryStrategy": job.get("retryStrategy"),
        "propagateTags": job.get("propagateTags"),
    }
    request.update({k: v for k, v in optional.items() if v not in (None, {}, [])})
    return request


def handle(detail: Mapping[str, Any], routes: Mapping[str, Any], batch: Any, now: datetime) -> dict[str, Any]:
    job_id = str(detail.get("jobId", ""))
    route = routes.get(str(detail.get("jobQueue", "")))
    base = {"jobId": job_id, "jobName": detail.get("jobName")}
    if route is None:
        return log(action="ignored", reason="not a placement queue of this deployment", **base)
    base |= {"fleet": route["fleet"], "placement": route["placement"]}
    status_reason = str(detail.get("statusReason", ""))
    event = next((name for prefix, name in RESUBMITTED_REASONS.items() if status_reason.startswith(prefix)), None)
    if detail.get("status") != "FAILED" or event is None:
        return log(action="ignored", reason=f"not a capacity cancel or block expiry: {status_reason}", **base)
    # The event's detail is the job as it was cancelled; its tags as Batch holds them now tell
    # whether a repeated event already made its successor.
    jobs = batch.describe_jobs(jobs=[job_id]).get("jobs", [])
    job = {**detail, "tags": (jobs[0] if jobs else detail).get("tags") or {}}
    successor = job["tags"].get(SUCCESSOR_TAG)
    if successor:
        return log(action="already-resubmitted", successor=successor, **base)
    target = next_placement(route, now)
    if target is None:
        reason = "no further placement" if not route.get("next") else "no later placement's window is open now"
        return log(action="capacity-exhausted", event=event, reason=f"{reason}: the job ends here", **base)
    try:
        submitted = batch.submit_job(**resubmission(job, target))
    except Exception as error:
        # An AWS refusal (an old job definition revision the role may not use, a share identifier
        # the queue does not know) ends this job's chain: log it where the metric filter counts it.
        # Anything else (throttling, a network error) raises, and EventBridge retries the event.
        code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
        if not code or code in RETRIED_CODES:
            raise
        reason = f"SubmitJob to placement {target['placement']} refused: {error}"
        return log(action="resubmit-failed", event=event, reason=reason, **base)
    new_id = str(submitted["jobId"])
    try:
        batch.tag_resource(resourceArn=str(job.get("jobArn", "")), tags={SUCCESSOR_TAG: new_id})
    except Exception as error:
        # The successor exists: raising now would have EventBridge retry the event and submit a second
        # copy. Say it instead; only a repeated delivery of this event could still resubmit again.
        base = {**base, "tag_error": str(error)[:300]}
    return log(
        action="resubmitted",
        event=event,
        successor=new_id,
        to_placement=target["placement"],
        to=target["label"],
        **base,
    )


def handler(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    routes = json.loads(os.environ["ROUTES"])
    return handle(event.get("detail", {}), routes, batch_client(), datetime.now(UTC))
