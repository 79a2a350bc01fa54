"""Why a job is not running, in plain words: its status reason, its request against what the compute
environment can hold, the environment's and the queue's state, and the RUNNABLE time limit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from budget_ledger.ledger import BATCH_REASON_PREFIX, REASON_PREFIX
from config.catalog import InstanceSpec
from config.job_events import TRAINCTL_CANCEL_REASON
from trainctl.fleet.capacity import wait_reasons
from trainctl.inspecting.recovery import Tail, attempt_story
from trainctl.jobs import node_requirements, num_nodes

# The status reason of a job whose attempt ran past its timeout: seen on timed-out jobs, not stated in AWS's
# pages (../shared/BATCH_MNP.md, "Status-reason strings"), so matched by its start.
TIMEOUT_REASON = "Job attempt duration exceeded timeout"
# Why Batch holds a RUNNABLE job, as the start of its statusReason, and the reasons a queue's
# jobStateTimeLimitActions act on (Batch user guide, "Jobs stuck in a RUNNABLE status"). A job the
# action cancelled says "Canceled by JobStateTimeLimit action due to reason: <code>".
REASONS = {
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY": "EC2 has no free capacity for the instance type in the fleet's AZ",
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE": (
        "the job asks for more vCPUs than the compute environment's maximum"
    ),
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT": (
        "one node asks for more than any instance of the compute environment holds"
    ),
    # No time-limit action can act on this one.
    "ACTION_REQUIRED": "the queue's compute environments are INVALID",
}


def reason_code(status_reason: str) -> str | None:
    return next((code for code in REASONS if code in status_reason), None)


@dataclass(frozen=True)
class Explanation:
    status: str
    # Plain sentences, most important first.
    reasons: list[str]


def _when(milliseconds: int) -> str:
    return datetime.fromtimestamp(milliseconds / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _minutes(seconds: float) -> str:
    return f"{math.ceil(seconds / 60)} min"


def explain(
    job: dict[str, Any],
    *,
    queue: dict[str, Any] | None,
    environment: dict[str, Any] | None,
    instance: InstanceSpec | None,
    now: datetime,
    tail: Tail | None = None,
) -> Explanation:
    status = str(job.get("status", "UNKNOWN"))
    # Every attempt so far: which node failed, what it found, how long the resume took (recovery.py);
    # told once an attempt has ended with an exit code or a reason.
    ended = [a for a in job.get("attempts", []) if a.get("statusReason") or "exitCode" in a.get("container", {})]
    story = attempt_story(job, tail) if ended else []
    reasons: list[str] = []
    status_reason = job.get("statusReason")
    if status_reason:
        code = reason_code(str(status_reason))
        reasons.append(f"Batch says: {status_reason}" + (f" ({REASONS[code]})" if code else ""))
        if str(status_reason).startswith(TIMEOUT_REASON):
            reasons.append(
                "the attempt ran past the job's timeout (attemptDurationSeconds): Batch stopped every node and never "
                'retries a timed-out job (Batch user guide, "Job timeouts"); with CHECKPOINT_URI the launcher\'s stop '
                "uploaded the last checkpoint files (its log says if that upload failed): submit it again with a "
                "longer timeout to go on"
            )
        if str(status_reason) == TRAINCTL_CANCEL_REASON:
            reasons.append("it was cancelled with `trainctl cancel`: Batch stopped every node and does not retry it")
        # The bare prefix: jobs stopped before the reasons shared one.
        if str(status_reason).startswith((BATCH_REASON_PREFIX, REASON_PREFIX)):
            reasons.append(
                "its team's monthly budget cancelled or stopped it (docs/budgets.md): `trainctl budget` shows what is "
                "left; it runs again next month or with a bigger budget deployed"
            )
    if status in ("RUNNING", "STARTING"):
        reasons.append(f"the job is {status}: nothing holds it back (`trainctl logs {job.get('jobId')}` shows it)")
        return Explanation(status, reasons + story)
    if status == "SUCCEEDED":
        reasons.append(f"the job finished SUCCEEDED at {_when(int(job.get('stoppedAt', 0)))}")
        return Explanation(status, reasons + story)
    capacity = wait_reasons(job, queue, now)
    if status == "FAILED":
        reasons += capacity + (story or _failure(job))
        return Explanation(status, reasons)

    problems = _misfit(job, environment, instance) + _environment_state(environment) + _queue_state(queue)
    reasons += capacity + problems
    if status == "RUNNABLE":
        if not problems and not status_reason:
            reasons.append(_scaling(job, environment))
        reasons += _runnable_limit(job, queue, now)
    if not reasons:
        reasons.append(
            f"the job is {status}: Batch has not yet placed it in a queue position (check again in a minute)"
        )
    return Explanation(status, reasons + story)


def _failure(job: dict[str, Any]) -> list[str]:
    lines = []
    attempts = job.get("attempts", [])
    for number, attempt in enumerate(attempts, start=1):
        container = attempt.get("container", {})
        detail = ", ".join(
            part
            for part in (
                f"exit code {container['exitCode']}" if "exitCode" in container else "",
                str(container.get("reason", "")),
                str(attempt.get("statusReason", "")),
            )
            if part
        )
        if detail:
            lines.append(f"attempt {number} of {len(attempts)}: {detail}")
    if not attempts:
        lines.append("the job never started: it failed before any node ran (see Batch's reason above)")
    return lines


def _misfit(job: dict[str, Any], environment: dict[str, Any] | None, instance: InstanceSpec | None) -> list[str]:
    lines = []
    nodes = num_nodes(job)
    asked = node_requirements(job)
    vcpus = asked.get("VCPU", 0)
    if environment is not None and vcpus:
        max_vcpus = int(environment.get("computeResources", {}).get("maxvCpus", 0))
        if nodes * vcpus > max_vcpus:
            fits = max_vcpus // vcpus
            lines.append(
                f"the job asks for {nodes} nodes x {vcpus} vCPUs = {nodes * vcpus} vCPUs, but the compute environment "
                f"holds at most {max_vcpus} vCPUs ({fits} nodes): it can never start. Submit with --nodes {fits} or "
                "fewer, or deploy the fleet with a larger maxNodes"
            )
    if instance is not None:
        memory_mib = instance.memory_gib * 1024
        for what, want, have in (
            ("vCPUs", vcpus, instance.vcpus),
            ("MiB of memory", asked.get("MEMORY", 0), memory_mib),
            ("GPUs", asked.get("GPU", 0), instance.accelerator_count),
        ):
            if want > have:
                lines.append(
                    f"one node asks for {want} {what}, but a {instance.name} has {have}: no instance can hold a node"
                )
    return lines


def _environment_state(environment: dict[str, Any] | None) -> list[str]:
    if environment is None:
        return ["the queue has no compute environment trainctl can read"]
    name = environment.get("computeEnvironmentName", "the compute environment")
    lines = []
    if environment.get("state") == "DISABLED":
        lines.append(f"compute environment {name} is DISABLED: it launches no instances until it is enabled")
    if environment.get("status") == "INVALID":
        lines.append(f"compute environment {name} is INVALID: {environment.get('statusReason', 'no reason given')}")
    elif environment.get("status") in ("CREATING", "UPDATING", "DELETING"):
        lines.append(f"compute environment {name} is {environment['status']}: jobs wait until it is VALID")
    return lines


def _queue_state(queue: dict[str, Any] | None) -> list[str]:
    if queue is None:
        return []
    lines = []
    if queue.get("state") == "DISABLED":
        lines.append(f"job queue {queue.get('jobQueueName')} is DISABLED: it schedules nothing")
    if queue.get("status") == "INVALID":
        lines.append(f"job queue {queue.get('jobQueueName')} is INVALID: {queue.get('statusReason', '')}")
    return lines


def _scaling(job: dict[str, Any], environment: dict[str, Any] | None) -> str:
    nodes = num_nodes(job)
    if environment is None:
        return f"nothing rules the job out: it waits for {nodes} instances"
    resources = environment.get("computeResources", {})
    return (
        f"nothing in the request or the compute environment rules the job out: a multi-node job waits until all "
        f"{nodes} nodes can be placed at once (the environment runs {resources.get('desiredvCpus', 0)} of at most "
        f"{resources.get('maxvCpus', 0)} vCPUs); new instances take a few minutes to launch"
    )


def _runnable_limit(job: dict[str, Any], queue: dict[str, Any] | None, now: datetime) -> list[str]:
    actions = [a for a in (queue or {}).get("jobStateTimeLimitActions", []) if a.get("state") == "RUNNABLE"]
    if not actions:
        return ["the queue has no RUNNABLE time limit: the job waits until it starts or is cancelled"]
    code = reason_code(str(job.get("statusReason", "")))
    matching = [a for a in actions if a.get("reason") == code]
    if not matching:
        limits = ", ".join(f"{a.get('reason')} ({_minutes(int(a['maxTimeSeconds']))})" for a in actions)
        return [
            f"the queue cancels a job RUNNABLE that long for one of these reasons: {limits}; "
            "Batch reports none of them for this job yet"
        ]
    limit = int(matching[0]["maxTimeSeconds"])
    # The clock starts when Batch sets the reason, which is never before the job was created.
    remaining = int(job.get("createdAt", 0)) / 1000 + limit - now.timestamp()
    when = f"in {_minutes(remaining)} at the earliest" if remaining > 0 else "at any moment"
    return [
        f"the queue will {str(matching[0].get('action', 'cancel')).lower()} the job after {_minutes(limit)} "
        f"RUNNABLE with {code}: {when}"
    ]
