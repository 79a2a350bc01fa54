"""What finished jobs cost: node-hours times the on-demand price per instance-hour (config.prices).

An estimate. A job is counted from each attempt's start to its end (a retried job ran, and billed, every
attempt), on every node: child nodes start a little later, and instances also run (and bill) while they
boot and pull the image before an attempt starts and until the compute environment scales them in after
it ends. Jobs are priced at the instance type their definition names, else the fleet's type now: a job
that ran before the fleet changed type is priced at the new one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from config.prices import PRICES
from trainctl import display
from trainctl.deployment import Deployment
from trainctl.errors import TrainctlError
from trainctl.fleet.compute import fleet_compute
from trainctl.jobs import DONE, describe_jobs, list_job_ids

GROUPINGS = ("share", "queue", "name")
MS_PER_HOUR = 3_600_000


@dataclass(frozen=True, kw_only=True)
class JobUsage:
    job_id: str
    name: str
    fleet: str
    share: str
    instance_type: str
    nodes: int
    # Milliseconds run, summed over the job's attempts.
    run_ms: int

    @property
    def node_hours(self) -> float:
        return self.nodes * self.run_ms / MS_PER_HOUR


def _spans(job: dict[str, Any]) -> list[tuple[int, int]]:
    """(start, stop) in ms of every attempt that ran: DescribeJobs' attempts[] (AttemptDetail startedAt,
    stoppedAt: RUNNING to a terminal state); the job's own startedAt/stoppedAt where it lists none."""
    attempts = [a for a in job.get("attempts") or [] if "startedAt" in a and "stoppedAt" in a]
    if attempts:
        return [(int(a["startedAt"]), int(a["stoppedAt"])) for a in attempts]
    if "startedAt" in job and "stoppedAt" in job:
        return [(int(job["startedAt"]), int(job["stoppedAt"]))]
    return []


def usage_of(job: dict[str, Any], *, fleet: str, instance_type: str) -> JobUsage | None:
    """A finished job's usage; None for one that never ran (no attempt with a start and stop time)."""
    spans = _spans(job)
    if not spans:
        return None
    ranges = job.get("nodeProperties", {}).get("nodeRangeProperties", [])
    named_type = next((r.get("container", {}).get("instanceType") for r in ranges if r.get("container")), None)
    return JobUsage(
        job_id=str(job["jobId"]),
        name=str(job.get("jobName", "")),
        fleet=fleet,
        share=str(job.get("shareIdentifier") or "(none)"),
        instance_type=str(named_type or instance_type),
        nodes=int(job.get("nodeProperties", {}).get("numNodes") or 1),
        run_ms=sum(max(0, stop - start) for start, stop in spans),
    )


@dataclass(kw_only=True)
class CostRow:
    key: str
    jobs: int = 0
    node_hours: float = 0.0
    usd: float = 0.0
    # Node-hours on types without a known price: not in `usd`.
    unpriced_node_hours: float = 0.0
    instance_types: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "jobs": self.jobs,
            "nodeHours": round(self.node_hours, 4),
            "usd": round(self.usd, 2),
            "unpricedNodeHours": round(self.unpriced_node_hours, 4),
            "instanceTypes": sorted(self.instance_types),
        }


def price_per_hour(instance_type: str, overrides: dict[str, float]) -> float | None:
    if instance_type in overrides:
        return overrides[instance_type]
    listed = PRICES.get(instance_type)
    return listed.usd if listed else None


def summarize(usages: Iterable[JobUsage], *, by: str, overrides: dict[str, float]) -> list[CostRow]:
    """One row per share, queue (fleet) or job name, most expensive first."""
    rows: dict[str, CostRow] = {}
    for usage in usages:
        key = {"share": usage.share, "queue": usage.fleet, "name": usage.name}[by]
        row = rows.setdefault(key, CostRow(key=key))
        row.jobs += 1
        row.node_hours += usage.node_hours
        row.instance_types.add(usage.instance_type)
        price = price_per_hour(usage.instance_type, overrides)
        if price is None:
            row.unpriced_node_hours += usage.node_hours
        else:
            row.usd += usage.node_hours * price
    return sorted(rows.values(), key=lambda r: (-r.usd, -r.node_hours, r.key))


def parse_since(text: str | None) -> datetime:
    """`--since`: a span (7d) or a date or date-time, UTC unless it says otherwise; default 7 days ago."""
    return display.parse_since(text, default=timedelta(days=7))


def parse_prices(pairs: Iterable[str]) -> dict[str, float]:
    """`--price TYPE=USD` options."""
    prices: dict[str, float] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            prices[name] = float(value)
        except ValueError:
            raise TrainctlError(f"--price {pair!r} is not TYPE=USD_PER_HOUR (for example p5.48xlarge=55.04)") from None
    return prices


def finished_usages(batch: Any, deployment: Deployment, since: datetime) -> list[JobUsage]:
    """Every job of the deployment's queues created since `since` that ran and finished."""
    since_ms = int(since.timestamp() * 1000)
    usages = []
    # Every placement of every fleet: a job the capacity fallback moved ran on its placement's type.
    views = [view for fleet in deployment.fleets.values() for view in fleet.placement_views()]
    for fleet in views:
        compute = fleet_compute(batch, fleet)
        # With a filter, ListJobs returns jobs in every status (API ListJobs, jobStatus).
        summaries = list_job_ids(
            batch, fleet.job_queue, filters=[{"name": "AFTER_CREATED_AT", "values": [str(since_ms)]}]
        )
        finished = [
            str(s["jobId"]) for s in summaries if s.get("status") in DONE and int(s.get("createdAt", 0)) >= since_ms
        ]
        for job in describe_jobs(batch, finished):
            usage = usage_of(job, fleet=fleet.name, instance_type=compute.instance_type or "unknown")
            if usage is not None:
                usages.append(usage)
    return usages


def unpriced_types(usages: Iterable[JobUsage], overrides: dict[str, float]) -> list[str]:
    return sorted({u.instance_type for u in usages if price_per_hour(u.instance_type, overrides) is None})
