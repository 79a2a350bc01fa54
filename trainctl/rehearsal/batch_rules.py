"""What AWS Batch decides for a multi-node parallel job, as its documentation states it. Each rule cites
its source; ../shared/BATCH_MNP.md in the project's shared notes has the longer list.

UG: AWS Batch User Guide; API: the AWS Batch API reference; ECS: the Amazon ECS API reference.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainctl.fleet.capacity import CAPACITY_CANCEL
from trainctl.rehearsal.definition import RetryRule

# ECS StopTask is "the equivalent of docker stop": the stop signal, then SIGKILL after 30 s
# (ECS_CONTAINER_STOP_TIMEOUT's default); UG "Job timeouts" states the same sequence for a timeout.
STOP_GRACE_SECONDS = 30.0
# UG "Automated job retries" / "Job timeouts": a job that timed out is never retried. The reason is the
# one seen on timed-out jobs (not stated in AWS's pages: BATCH_MNP.md, UNCONFIRMED).
TIMEOUT_REASON = "Job attempt duration exceeded timeout"
# ECS TaskStopCode EssentialContainerExited: what a node whose container exited reports.
EXITED_REASON = "Essential container in task exited"
# UG "Best practices" / "Automated job retries": a lost or terminated host; job definitions match it
# with "Host EC2*". The exit code is absent.
HOST_LOST_REASON = "Host EC2 (instance {instance}) terminated."
# API CreateJobQueue jobStateTimeLimitActions: the reason of a job the queue cancelled while it waited
# for capacity (trainctl/fleet/capacity.py holds it). The rehearsal cancels at once where Batch waits the queue's
# limit (10 minutes at least).
CAPACITY_CANCEL_REASON = CAPACITY_CANCEL
# A container whose image could not be pulled: the container's reason (CDK's Reason.CANNOT_PULL_CONTAINER
# matches "CannotPullContainerError:*") and the node job's status reason, "Task failed to start" (the Batch
# user guide's retry example; the job definitions retry it).
CANNOT_PULL_REASON = "CannotPullContainerError: rehearsal: this node's image could not be pulled"
FAILED_TO_START_REASON = "Task failed to start"


def _glob(pattern: str, value: str) -> bool:
    """API EvaluateOnExit: a pattern matches exactly, or, ending in '*', by its start."""
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return value == pattern


def retry_decision(
    rules: tuple[RetryRule, ...], *, exit_code: int | None, reason: str, status_reason: str
) -> tuple[bool, str]:
    """(retry?, why) for an attempt whose main node ended as given (UG "Multi-node parallel jobs": the
    job's status and exit come from the main node, and only a main-node failure retries).

    API RetryStrategy.evaluateOnExit: an entry applies when every pattern it gives matches, and when none
    matches, the job is retried. Inferred, not stated by AWS: that the first matching entry decides (AWS's
    examples are written that way), and that an absent field matches as empty text, so "*" matches it (UG
    "Automated job retries" shows {"onReason": "*", "action": "EXIT"} as the catch-all that ends retries).
    """
    fields = {"exit": "" if exit_code is None else str(exit_code), "reason": reason, "status": status_reason}
    for number, rule in enumerate(rules, start=1):
        checks = [
            (rule.on_exit_code, fields["exit"]),
            (rule.on_reason, fields["reason"]),
            (rule.on_status_reason, fields["status"]),
        ]
        given = [(pattern, value) for pattern, value in checks if pattern is not None]
        if given and all(_glob(pattern, value) for pattern, value in given):
            described = ", ".join(f"{p!r}" for p, _ in given)
            return rule.action == "RETRY", f"evaluateOnExit entry {number} ({rule.action} on {described})"
    return True, "no evaluateOnExit entry matched (Batch retries)"


def node_environment(
    *,
    job_id: str,
    attempt: int,
    index: int,
    nodes: int,
    main: int,
    main_address: str,
    queue: str,
    environment_name: str,
) -> Mapping[str, str]:
    """The variables Batch sets on node `index` (UG "Environment variables", "Multi-node parallel jobs"):
    AWS_BATCH_JOB_ID is "<job id>#<node index>" in a node (AWS ParallelCluster's MNP helper strips the
    suffix), AWS_BATCH_JOB_ATTEMPT counts from 1, and the main node's private address is set only on the
    children ("This variable isn't present on the main node")."""
    variables = {
        "AWS_BATCH_JOB_ID": f"{job_id}#{index}",
        "AWS_BATCH_JOB_ATTEMPT": str(attempt),
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_NUM_NODES": str(nodes),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main),
        "AWS_BATCH_CE_NAME": environment_name,
        "AWS_BATCH_JQ_NAME": queue,
    }
    if index != main:
        variables["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_address
    return variables
