"""A fleet's fallback placements: the `fallback` field of a fleet and the rules it must meet.

A placement is where a fleet's jobs may run when its own place has no capacity: another AZ, a
capacity reservation or Capacity Block, or another instance type of the same shape. What a
placement leaves out is the fleet's own. Each placement gets its own compute path and job queue;
a job the capacity time limit cancels is submitted again to the next placement's queue
(training_constructs/jobs/capacity_fallback.py), so the nodes of one job never span two placements.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from config.catalog import CATALOG, InstanceSpec
from config.settings import CapacityReservation, CapacityWindow, FleetSettings, Placement

# Fallback placements per fleet: each adds a compute environment, a job queue and an EventBridge
# hop; three keep the stacks' resource and output counts well inside CloudFormation's limits.
MAX_FALLBACK = 3
# EC2 user guide, "Capacity Blocks for ML", Supported instance types and Regions (read November 2026).
CAPACITY_BLOCK_TYPES = frozenset(
    {"p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "trn1.32xlarge", "trn2.48xlarge"}
)

# The same patterns as config.context's fleet fields (that module imports this one).
_AZ = r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$"
_RESERVATION = r"^cr-[0-9a-f]{17}$"
_TIME = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?Z$"


def _optional(regex: str) -> object:
    return Annotated[
        Annotated[str, StringConstraints(pattern=regex)] | None,
        BeforeValidator(lambda v: None if v in ("", None) else v),
    ]


class PlacementModel(BaseModel):
    """One entry of a fleet's `fallback` list."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    availability_zone: _optional(_AZ) = Field(None, alias="availabilityZone")  # type: ignore[valid-type]
    instance_type: str | None = Field(None, alias="instanceType")
    capacity_reservation_id: _optional(_RESERVATION) = Field(None, alias="capacityReservationId")  # type: ignore[valid-type]
    capacity_reservation_type: Literal["odcr", "capacity-block"] | None = Field(None, alias="capacityReservationType")
    start: _optional(_TIME) = Field(None, alias="start")  # type: ignore[valid-type]
    end: _optional(_TIME) = Field(None, alias="end")  # type: ignore[valid-type]


FIELDS_TEXT = "up to 3 objects of availabilityZone, instanceType, capacityReservationId, capacityReservationType, "
FIELDS_TEXT += "start, end (UTC)"


class PlacementError(ValueError):
    """A placement the app cannot use: `path` is the field, `value` what was given, `problem` why."""

    def __init__(self, path: str, value: object, problem: str, allowed: str) -> None:
        super().__init__(problem)
        self.path, self.value, self.problem, self.allowed = path, value, problem, allowed


def shape(instance: InstanceSpec) -> tuple[str, int, int, int, int]:
    """What a job definition depends on: accelerator kind and count, vCPUs, memory and the EFA
    interfaces it maps as devices (training_constructs/multi_node_job.py)."""
    return (
        str(instance.accelerator_kind),
        instance.accelerator_count,
        instance.vcpus,
        instance.memory_gib,
        instance.efa_interfaces,
    )


def same_shape(instance: InstanceSpec) -> tuple[str, ...]:
    return tuple(name for name, spec in CATALOG.items() if shape(spec) == shape(instance) and spec.efa_supported)


def _time(text: str) -> datetime:
    stamp = text[:-1] + (":00" if len(text) == 17 else "")
    return datetime.fromisoformat(stamp).replace(tzinfo=UTC)


def ended(window: CapacityWindow, now: datetime) -> bool:
    """Whether the window's end is at or before `now`."""
    return _time(window.end) <= now


def fallback_placements(
    own: Placement,
    models: Sequence[PlacementModel],
    path: Callable[[int, str], str],
    region: str | None,
) -> tuple[Placement, ...]:
    """The fleet's placements after its own, in order. Raises PlacementError on the first bad one."""
    if len(models) > MAX_FALLBACK:
        raise PlacementError(path(-1, ""), f"{len(models)} placements", "too many", f"at most {MAX_FALLBACK}")
    seen = [own]
    for index, model in enumerate(models):
        seen.append(_placement(own, model, functools.partial(path, index), region, seen))
    return tuple(seen[1:])


def _placement(
    own: Placement, model: PlacementModel, path: Callable[[str], str], region: str | None, seen: list[Placement]
) -> Placement:
    instance = own.instance
    if model.instance_type:
        spec = CATALOG.get(model.instance_type)
        fits = same_shape(own.instance)
        if spec is None or shape(spec) != shape(own.instance) or not spec.efa_supported:
            a = own.instance
            problem = f"not the shape of {a.name} (accelerators, vCPUs, memory, EFA interfaces)"
            allowed = ", ".join(fits)
            raise PlacementError(path("instanceType"), model.instance_type, problem, allowed)
        instance = spec
    az = model.availability_zone or own.availability_zone
    if model.availability_zone and region and not model.availability_zone.startswith(region):
        problem = f"is not in the stack's region {region}"
        raise PlacementError(path("availabilityZone"), model.availability_zone, problem, f"an AZ of {region}")
    kind = model.capacity_reservation_type or "odcr"
    reservation = None
    if model.capacity_reservation_id:
        reservation = CapacityReservation(reservation_id=model.capacity_reservation_id, kind=kind)
    elif model.capacity_reservation_type:
        problem = "needs capacityReservationId, the reservation's cr- id"
        raise PlacementError(path("capacityReservationType"), kind, problem, "with capacityReservationId")
    window = _window(model, kind, path)
    if kind == "capacity-block" and reservation:
        _check_block(instance, az, model, path)
    placement = Placement(instance=instance, availability_zone=az, capacity_reservation=reservation, window=window)
    for number, other in enumerate(seen):
        if (other.instance.name, other.availability_zone, other.capacity_reservation) == (
            placement.instance.name,
            placement.availability_zone,
            placement.capacity_reservation,
        ):
            where = "the fleet's own" if number == 0 else f"fallback {number}"
            problem = f"the same place as {where} ({placement.label})"
            raise PlacementError(path(""), placement.label, problem, "another AZ, instance type or reservation")
    return placement


def own_window(
    instance: InstanceSpec,
    az: str | None,
    kind: str | None,
    times: tuple[str | None, str | None],
    path: Callable[[str], str],
) -> CapacityWindow | None:
    """The window of a fleet's own placement. A fleet's own block may leave it out (as before fallback
    placements existed; EC2's expiration warning still stops its jobs); given, it is checked as a fallback
    block's: both times, end after start, a type EC2 sells blocks of, a named AZ."""
    start, end = times
    if not (start or end):
        return None
    model = PlacementModel.model_validate({"capacityReservationType": kind, "start": start, "end": end})
    window = _window(model, kind or "odcr", path)
    _check_block(instance, az, model, path)
    return window


def _window(model: PlacementModel, kind: str, path: Callable[[str], str]) -> CapacityWindow | None:
    if kind != "capacity-block":
        for field in ("start", "end"):
            if getattr(model, field):
                allowed = "with capacityReservationType capacity-block"
                raise PlacementError(path(field), getattr(model, field), "only a capacity block has a window", allowed)
        return None
    if not (model.start and model.end):
        field = "end" if model.start else "start"
        problem = "a capacity block needs its window: jobs go there only between start and end"
        raise PlacementError(path(field), None, problem, "a UTC time such as 2026-12-01T11:30Z")
    start, end = _time(model.start), _time(model.end)
    if end <= start:
        raise PlacementError(path("end"), model.end, f"not after start {model.start}", "a time after start")
    return CapacityWindow(start=start.strftime("%Y-%m-%dT%H:%M:%SZ"), end=end.strftime("%Y-%m-%dT%H:%M:%SZ"))


def _check_block(instance: InstanceSpec, az: str | None, model: PlacementModel, path: Callable[[str], str]) -> None:
    """EC2 launches into a block only with its type, in its AZ (EC2 user guide, capacity-blocks-launch:
    an instance "can't launch in a subnet in a different Availability Zone" from the block's)."""
    if instance.name not in CAPACITY_BLOCK_TYPES:
        problem = "EC2 sells no capacity blocks of this type"
        raise PlacementError(path("instanceType"), instance.name, problem, ", ".join(sorted(CAPACITY_BLOCK_TYPES)))
    if az is None:
        problem = "a capacity block lives in one AZ: name it, so the placement's subnet is there"
        raise PlacementError(path("availabilityZone"), None, problem, "the block's AZ, such as us-east-2a")


# Lambda takes at most 4 KB of environment variables per function, all together (Lambda developer
# guide, "Lambda quotas": function environment variables, 4 KB); CloudFormation would refuse the
# resubmitter at deploy. Its ROUTES (training_constructs/jobs/capacity_fallback/routes.py) holds, for
# every placement's queue, the placements after it, so it grows with the square of a fleet's
# placements. Queue ARNs are only known at deploy: estimated at QUEUE_ARN_CHARS each
# ("arn:aws:batch:<region>:<account>:job-queue/" is about 50, CloudFormation's generated name about 60).
LAMBDA_ENVIRONMENT_BYTES = 4096
QUEUE_ARN_CHARS = 120


def routes_bytes(fleets: Sequence[FleetSettings]) -> int:
    """An estimate of the resubmitter's ROUTES for these fleets, shaped as routes.routes_document."""
    document: dict[str, object] = {}
    for fleet in fleets:
        if not fleet.fallback:
            continue
        entries = [
            {
                "queue": f"{fleet.name}-{number}".ljust(QUEUE_ARN_CHARS, "x"),
                "placement": str(number),
                "label": placement.label,
                "instanceType": placement.instance.name,
                **({"start": placement.window.start, "end": placement.window.end} if placement.window else {}),
            }
            for number, placement in enumerate(fleet.placements)
        ]
        for number, entry in enumerate(entries):
            document[entry["queue"]] = {
                "fleet": fleet.name,
                "placement": entry["placement"],
                "label": entry["label"],
                "next": entries[number + 1 :],
            }
    return len(json.dumps(document, separators=(",", ":"))) + len("ROUTES")
