"""`trainctl jobs`: the deployment's jobs across its queues, newest first, with what a person asks
first (state, nodes, how long, attempts, share, sweep, cost)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainctl.compute import fleet_compute
from trainctl.cost import price_per_hour, usage_of
from trainctl.deployment import Deployment
from trainctl.errors import TrainctlError
from trainctl.jobs import DONE, STATES, describe_jobs, list_job_ids, num_nodes
from trainctl.requests import SWEEP_TAG


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    since: datetime
    fleet: str | None = None
    states: frozenset[str] = frozenset()
    sweep: str | None = None
    name_prefix: str | None = None
    limit: int = 0  # 0: every job


def parse_states(values: list[str]) -> frozenset[str]:
    states = frozenset(s.strip().upper() for value in values for s in value.split(",") if s.strip())
    unknown = sorted(states - set(STATES))
    if unknown:
        raise TrainctlError(f"--state {', '.join(unknown)}: a job state is one of {', '.join(STATES)}")
    return states


def list_jobs(batch: Any, deployment: Deployment, wanted: JobFilter, *, now_ms: int) -> list[dict[str, Any]]:
    """One row per job, newest first. ListJobs pages through each queue (with a filter it returns jobs
    in every status: API ListJobs, jobStatus); DescribeJobs, 100 ids a call, adds attempts, share and tags."""
    fleets = [deployment.fleet(wanted.fleet)] if wanted.fleet else list(deployment.fleets.values())
    since_ms = int(wanted.since.timestamp() * 1000)
    picked: list[tuple[dict[str, Any], str, str]] = []
    # Every placement's queue: a job the capacity fallback sent on waits or runs there.
    for fleet in (view for f in fleets for view in f.placement_views()):
        instance_type = fleet_compute(batch, fleet).instance_type or "unknown"
        for summary in list_job_ids(
            batch, fleet.job_queue, filters=[{"name": "AFTER_CREATED_AT", "values": [str(since_ms)]}]
        ):
            if int(summary.get("createdAt", 0)) < since_ms:
                continue
            if wanted.states and summary.get("status") not in wanted.states:
                continue
            if wanted.name_prefix and not str(summary.get("jobName", "")).startswith(wanted.name_prefix):
                continue
            picked.append((summary, fleet.name, instance_type))
    picked.sort(key=lambda p: int(p[0].get("createdAt", 0)), reverse=True)
    if wanted.limit and not wanted.sweep:
        picked = picked[: wanted.limit]
    details = {str(j["jobId"]): j for j in describe_jobs(batch, [str(s["jobId"]) for s, _, _ in picked])}
    rows = []
    for summary, fleet_name, instance_type in picked:
        job = details.get(str(summary["jobId"]), summary)
        tags = job.get("tags") or {}
        if wanted.sweep and tags.get(SWEEP_TAG) != wanted.sweep:
            continue
        rows.append(job_row(job, fleet=fleet_name, instance_type=instance_type, now_ms=now_ms))
        if wanted.limit and len(rows) == wanted.limit:
            break
    return rows


def job_row(job: dict[str, Any], *, fleet: str, instance_type: str, now_ms: int) -> dict[str, Any]:
    status = str(job.get("status", "?"))
    started = job.get("startedAt")
    stopped = job.get("stoppedAt") if status in DONE else None
    duration = None
    if started:
        duration = int(stopped or now_ms) - int(started)
    cost = None
    if status in DONE:
        usage = usage_of(job, fleet=fleet, instance_type=instance_type)
        price = price_per_hour(usage.instance_type, {}) if usage else None
        cost = round(usage.node_hours * price, 2) if usage and price is not None else None
    return {
        "jobId": job.get("jobId"),
        "name": job.get("jobName"),
        "fleet": fleet,
        "state": status,
        "nodes": num_nodes(job),
        "createdAt": job.get("createdAt"),
        "startedAt": started,
        "duration_ms": duration,
        "attempts": len(job.get("attempts") or []),
        "share": job.get("shareIdentifier"),
        "sweep": (job.get("tags") or {}).get(SWEEP_TAG),
        "usd_estimate": cost,
    }
