"""A fleet's job queue and the compute environment behind it, as Batch describes them now."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.catalog import CATALOG, InstanceSpec
from trainctl.aws import aws_errors
from trainctl.deployment import Fleet
from trainctl.fleet.capacity import queue_with_placement


@dataclass(frozen=True)
class FleetCompute:
    queue: dict[str, Any] | None
    environment: dict[str, Any] | None

    @property
    def instance_type(self) -> str | None:
        types = (self.environment or {}).get("computeResources", {}).get("instanceTypes") or []
        return str(types[0]) if types else None

    @property
    def instance(self) -> InstanceSpec | None:
        return CATALOG.get(self.instance_type or "")


def fleet_compute(batch: Any, fleet: Fleet) -> FleetCompute:
    with aws_errors():
        queues = batch.describe_job_queues(jobQueues=[fleet.job_queue]).get("jobQueues", [])
    queue = queues[0] if queues else None
    order = sorted((queue or {}).get("computeEnvironmentOrder", []), key=lambda o: int(o.get("order", 0)))
    environment = None
    if order:
        with aws_errors():
            environments = batch.describe_compute_environments(
                computeEnvironments=[order[0]["computeEnvironment"]]
            ).get("computeEnvironments", [])
        environment = environments[0] if environments else None
    return FleetCompute(queue_with_placement(queue, fleet), environment)
