"""One line per fleet for `trainctl status`: what runs, what waits, and the compute behind it."""

from __future__ import annotations

from typing import Any

from trainctl.deployment import Fleet
from trainctl.fleet.capacity import capacity_summary, fleet_capacity
from trainctl.fleet.compute import fleet_compute
from trainctl.jobs import STATES, list_job_ids


def fleet_status(batch: Any, fleet: Fleet) -> dict[str, Any]:
    compute = fleet_compute(batch, fleet)
    queue = compute.queue or {}
    environment = compute.environment or {}
    resources = environment.get("computeResources", {})
    # What the compute environment is scaled to now; an instance brings its type's vCPUs.
    desired = int(resources.get("desiredvCpus", 0))
    per_instance = compute.instance.vcpus if compute.instance else 0
    capacity = fleet_capacity(batch, fleet)
    return {
        "fleet": fleet.name,
        "instanceType": compute.instance_type,
        "queueState": f"{queue.get('state', '?')}/{queue.get('status', '?')}",
        "environmentState": f"{environment.get('state', '?')}/{environment.get('status', '?')}",
        "environmentReason": environment.get("statusReason", ""),
        "instances": desired // per_instance if per_instance else None,
        "vcpus": desired,
        "maxvCpus": int(resources.get("maxvCpus", 0)),
        # Jobs of every placement's queue (one queue without fallback).
        "jobs": {
            s: sum(1 for view in fleet.placement_views() for _ in list_job_ids(batch, view.job_queue, jobStatus=s))
            for s in STATES
        },
        # Per placement (the fleet's own first): whether Batch reports insufficient capacity now.
        "placements": [p.as_dict() for p in capacity],
        "capacity": capacity_summary(capacity),
    }
