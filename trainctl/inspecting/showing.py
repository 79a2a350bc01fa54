"""`trainctl show JOB`: one job whole: every node with its instance, AZ, state, exit code and reason per
attempt, its log streams, its checkpoints and its cost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainctl.aws import aws_errors
from trainctl.errors import TrainctlError
from trainctl.jobs import describe_jobs, node_job_id, num_nodes


def node_jobs(batch: Any, job: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each node's own job `<id>#<i>` (Batch user guide, multi-node parallel jobs: nodes are described
    with the #N notation); a job without nodeProperties is its own node 0."""
    if "nodeProperties" not in job:
        return {0: job}
    job_id = str(job["jobId"])
    found = {str(j["jobId"]): j for j in describe_jobs(batch, [node_job_id(job_id, n) for n in range(num_nodes(job))])}
    return {n: found[node_job_id(job_id, n)] for n in range(num_nodes(job)) if node_job_id(job_id, n) in found}


def _attempts(node_job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every attempt (AttemptDetail), and the one running now from the node's container (not yet listed)."""
    attempts = [dict(a) for a in node_job.get("attempts") or []]
    container = node_job.get("container") or {}
    running_task = container.get("taskArn")
    if running_task and all((a.get("container") or {}).get("taskArn") != running_task for a in attempts):
        attempts.append({"container": container, "startedAt": node_job.get("startedAt"), "current": True})
    return attempts


def cluster_of_task(task_arn: str) -> str | None:
    """The cluster a task ARN names: arn:aws:ecs:<region>:<account>:task/<cluster>/<id> (the old
    format, task/<id>, names none)."""
    parts = task_arn.split(":", 5)[-1].split("/")
    return parts[1] if len(parts) == 3 else None


def instances(
    ecs: Any, cluster: str | None, container_instances: list[str], warn: Callable[[str], None]
) -> dict[str, dict[str, str]]:
    """Container instance ARN -> EC2 instance id and AZ (ECS DescribeContainerInstances, attribute
    ecs.availability-zone). An instance already deregistered is simply not found (a `failures` entry)."""
    if not cluster or not container_instances:
        return {}
    try:
        with aws_errors():
            found = ecs.describe_container_instances(cluster=cluster, containerInstances=container_instances)
    except TrainctlError as error:
        # The rest of `show` stands without it; say why the instance columns are empty.
        warn(f"instances and AZs unknown: {error.message}")
        return {}
    result: dict[str, dict[str, str]] = {}
    for item in found.get("containerInstances", []):
        attributes = {a.get("name"): a.get("value") for a in item.get("attributes", [])}
        result[str(item["containerInstanceArn"])] = {
            "instance": str(item.get("ec2InstanceId", "-")),
            "az": str(attributes.get("ecs.availability-zone") or "-"),
        }
    return result


def node_rows(
    batch: Any, ecs: Any, job: dict[str, Any], cluster: str | None, warn: Callable[[str], None]
) -> list[dict[str, Any]]:
    nodes = node_jobs(batch, job)
    attempts = {n: _attempts(j) for n, j in nodes.items()}
    arns = sorted(
        {str(a["container"]["containerInstanceArn"]) for al in attempts.values() for a in al
         if (a.get("container") or {}).get("containerInstanceArn")}
    )  # fmt: skip
    tasks = [str(a["container"]["taskArn"]) for al in attempts.values() for a in al
             if (a.get("container") or {}).get("taskArn")]  # fmt: skip
    where = instances(ecs, cluster or next((c for c in map(cluster_of_task, tasks) if c), None), arns, warn)
    rows = []
    for node, node_job in sorted(nodes.items()):
        listed = []
        for number, attempt in enumerate(attempts[node], start=1):
            container = attempt.get("container") or {}
            place = where.get(str(container.get("containerInstanceArn")), {})
            listed.append(
                {
                    "attempt": number,
                    "instance": place.get("instance"),
                    "az": place.get("az"),
                    "exitCode": container.get("exitCode"),
                    "reason": container.get("reason") or attempt.get("statusReason"),
                    "logStream": container.get("logStreamName"),
                    "taskArn": container.get("taskArn"),
                }
            )
        rows.append({"node": node, "state": node_job.get("status"), "attempts": listed})
    return rows
