"""Batch jobs as trainctl reads them: which fleet a job belongs to, its nodes, following its states."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainctl.aws import aws_errors
from trainctl.deployment import Deployment, Fleet
from trainctl.errors import ExitCode, TrainctlError

# Job states in the order a job moves through them (API JobDetail, status).
STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
DONE = frozenset({"SUCCEEDED", "FAILED"})
# DescribeJobs takes at most 100 job ids per call (API DescribeJobs, jobs).
DESCRIBE_BATCH = 100


def describe_jobs(batch: Any, job_ids: Sequence[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for start in range(0, len(job_ids), DESCRIBE_BATCH):
        with aws_errors():
            found += batch.describe_jobs(jobs=list(job_ids[start : start + DESCRIBE_BATCH]))["jobs"]
    return found


def owned_job(batch: Any, deployment: Deployment, job_id: str) -> tuple[dict[str, Any], Fleet]:
    """The job and its fleet; an error when the id is unknown or the job ran in another queue."""
    jobs = describe_jobs(batch, [job_id])
    if not jobs:
        raise TrainctlError(f"no job {job_id!r} in {deployment.region}: check the id, or pass the --region it ran in")
    job = jobs[0]
    fleet = deployment.fleet_of_queue(str(job.get("jobQueue", "")))
    if fleet is None:
        # A queue ARN ends in job-queue/<name> (Batch user guide, "Supported resource-level permissions for AWS
        # Batch API actions"): the name says enough, and keeps the line short.
        queue = str(job.get("jobQueue", "")).rsplit("/", 1)[-1]
        raise TrainctlError(
            f"job {job_id} is in queue {queue}, not one of this deployment's (fleets {deployment.fleet_names()}): "
            "trainctl only handles its own jobs"
        )
    return job, fleet


def num_nodes(job: dict[str, Any]) -> int:
    return int(job.get("nodeProperties", {}).get("numNodes") or 1)


def main_node(job: dict[str, Any]) -> int:
    return int(job.get("nodeProperties", {}).get("mainNode") or 0)


def node_job_id(job_id: str, node: int) -> str:
    """A node of a multi-node job is the job `<id>#<node index>` (Batch user guide, mnp-env-vars)."""
    return f"{job_id}#{node}"


def node_requirements(job: dict[str, Any]) -> dict[str, int]:
    """What one node asks for (VCPU, MEMORY in MiB, GPU), from the job's first node range."""
    ranges = job.get("nodeProperties", {}).get("nodeRangeProperties") or [{"container": job.get("container", {})}]
    container = ranges[0].get("container", {})
    asked = {r["type"]: int(float(r["value"])) for r in container.get("resourceRequirements", [])}
    if "VCPU" not in asked and container.get("vcpus"):
        asked["VCPU"] = int(container["vcpus"])
    if "MEMORY" not in asked and container.get("memory"):
        asked["MEMORY"] = int(container["memory"])
    return asked


def job_environment(job: dict[str, Any]) -> dict[str, str]:
    ranges = job.get("nodeProperties", {}).get("nodeRangeProperties") or [{"container": job.get("container", {})}]
    environment = ranges[0].get("container", {}).get("environment", [])
    return {e["name"]: e["value"] for e in environment}


def watch(
    batch: Any,
    job_id: str,
    *,
    on_state: Callable[[dict[str, Any]], None],
    poll_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Follow a job until it is SUCCEEDED or FAILED, calling `on_state` at every change of state."""
    last = None
    while True:
        jobs = describe_jobs(batch, [job_id])
        if not jobs:
            raise TrainctlError(f"job {job_id} disappeared while being watched", ExitCode.AWS)
        job = jobs[0]
        if job.get("status") != last:
            last = job.get("status")
            on_state(job)
        if last in DONE:
            return job
        sleep(poll_seconds)


def list_job_ids(batch: Any, queue: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every job summary ListJobs returns for the queue, page by page."""
    with aws_errors():
        for page in batch.get_paginator("list_jobs").paginate(jobQueue=queue, **kwargs):
            yield from page.get("jobSummaryList", [])
