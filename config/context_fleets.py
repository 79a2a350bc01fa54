"""The fleets' context keys read into FleetSettings: `fleets` (named fleets, each with its fallback
placements) or the flat gpu*/trainium* keys, checked against the instance catalog, the AZ table, the
stacks' construct ids and Lambda's environment size. config/context.py calls read_fleets and shares the
instance and AZ checks with its other keys.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from config import limits, refusals, zones
from config.catalog import CATALOG, AcceleratorKind, InstanceSpec
from config.context_keys import (
    EFA_TYPES,
    FLAT_FIELDS,
    FLAT_FLEET_KEYS,
    FLAT_FLEETS,
    RESERVED_NAMES,
    ConfigError,
    FleetModel,
    snake,
    upper_first,
)
from config.key_refusals import fail
from config.placements import (
    LAMBDA_ENVIRONMENT_BYTES,
    PlacementError,
    ended,
    fallback_placements,
    own_window,
    routes_bytes,
)
from config.settings import FLEET_ID_SUFFIXES, CapacityReservation, FleetSettings, fleet_construct_id


def instance_of(path: str, name: str, allowed: tuple[str, ...], family: str) -> InstanceSpec:
    """The catalog's spec of `name`, an EFA-capable type in `allowed`; else a refusal of the key at `path`."""
    spec = CATALOG.get(name)
    if spec is not None and spec.efa_supported and name in allowed:
        return spec
    listed = ", ".join(allowed)
    # A short list in full; otherwise the closest names and where the catalog is.
    choices = listed if len(listed) <= 60 else refusals.did_you_mean(name, allowed, "docs/reference/catalog.md")
    if spec is None:
        problem = "not in the instance catalog"
    elif not spec.efa_supported:
        problem = "has no EFA (multi-node training needs it)"
    else:
        problem = f"a {spec.accelerator_kind} type, not {family}"
    raise fail(path, name, problem, f"{family} types; {choices}")


def _fleet(
    name: str,
    model: FleetModel,
    path: Callable[[str], str],
    allowed: tuple[str, ...],
    family: str,
    region: str | None,
    skipped: frozenset[str],
) -> FleetSettings:
    instance = instance_of(path("instanceType"), model.instance_type, allowed, family)
    max_nodes = max(model.nodes, 4) if model.max_nodes is None else model.max_nodes
    if max_nodes < model.nodes:
        raise fail(path("maxNodes"), model.max_nodes, f"out of range {model.nodes}..{limits.MAX_NODES}")
    if model.capacity_reservation_type == "capacity-block" and not model.capacity_reservation_id:
        problem = f"needs {path('capacityReservationId')}, the block's cr- id"
        raise fail(path("capacityReservationType"), model.capacity_reservation_type, problem)
    az = model.availability_zone
    check_az(path("availabilityZone"), az, region, skipped)
    if model.ami_id and instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        problem = "GPU fleets take AWS's current ECS GPU AMI through Batch (docs/fleets.md)"
        raise fail(path("amiId"), model.ami_id, problem)
    reservation = model.capacity_reservation_id and CapacityReservation(
        reservation_id=model.capacity_reservation_id, kind=model.capacity_reservation_type
    )
    try:
        kind = model.capacity_reservation_type if model.capacity_reservation_id else None
        window = own_window(instance, az, kind, (model.start, model.end), path)
    except PlacementError as error:
        raise fail(error.path, error.value, error.problem, error.allowed) from None
    fleet = FleetSettings(
        name=name,
        instance=instance,
        nodes=model.nodes,
        max_nodes=max_nodes,
        availability_zone=az,
        image_uri=model.image,
        capacity_reservation=reservation,
        ami_id=model.ami_id,
        window=window,
    )
    if not model.fallback:
        return fleet
    try:
        where = lambda i, f: path("fallback") + (f"[{i}]" if i >= 0 else "") + (f".{f}" if f else "")  # noqa: E731
        fallback = fallback_placements(fleet.own_placement, model.fallback, where, region)
    except PlacementError as error:
        raise fail(error.path, error.value, error.problem, error.allowed) from None
    return dataclasses.replace(fleet, fallback=fallback)


def refuse_ended_windows(fleets: tuple[FleetSettings, ...], now: datetime) -> None:
    """A Capacity Block placement whose window lies wholly in the past can never take a job."""
    for fleet in fleets:
        for number, placement in enumerate(fleet.placements):
            if placement.window and ended(placement.window, now):
                # Only `fleets` takes windows.
                where = f".fallback[{number - 1}]" if number else ""
                path, end = f"fleets.{fleet.name}{where}.end", placement.window.end
                problem = f"the Capacity Block's window ended before this synth ({now:%Y-%m-%dT%H:%MZ})"
                raise fail(path, end, problem, "a window that has not ended; remove the placement")


def check_az(path: str, az: str | None, region: str | None, skipped: frozenset[str]) -> None:
    found = az and zones.az_problem(az, region, skipped)
    if found:
        raise fail(path, az, *found)


def zone_table_skips(ctx: Any) -> frozenset[str]:
    """The regions skipZoneTable names, each region-shaped."""
    names = [n.strip() for n in ctx.skip_zone_table.split(",") if n.strip()]
    for name in names:
        if not zones.REGION.fullmatch(name):
            raise fail("skipZoneTable", ctx.skip_zone_table, f"{refusals.shown(name)} is not a region name")
    return frozenset(names)


def read_fleets(ctx: Any, given: Mapping[str, Any], region: str | None) -> tuple[FleetSettings, ...]:
    skipped = zone_table_skips(ctx)
    if ctx.fleets is not None:
        flat = next((k for k in FLAT_FLEET_KEYS if k in given), None)
        if flat:
            raise ConfigError(f"context keys fleets and {flat} cannot be mixed: describe every fleet in fleets")
        if not ctx.fleets:
            raise fail("fleets", {}, "no fleet")
        if len(ctx.fleets) > limits.MAX_FLEETS:
            raise fail("fleets", f"{len(ctx.fleets)} fleets", f"at most {limits.MAX_FLEETS}")
        seen: dict[str, str] = {}
        for name in ctx.fleets:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,31}", name):
                raise fail("fleets", name, "a fleet name is a letter, then up to 31 letters and digits")
            if fleet_construct_id(name).lower() in RESERVED_NAMES:
                problem = f"{name!r} is taken by the stacks' own {RESERVED_NAMES[name.lower()]!r}"
                allowed = "a fleet name that is not one of the stacks' own ids (in any case)"
                raise fail("fleets", name, problem, allowed)
            if name.lower() in seen:
                raise fail("fleets", name, f"names {seen[name.lower()]!r} and {name!r} differ only in case")
            seen[name.lower()] = name
        _check_fleet_ids(tuple(ctx.fleets))
        built = tuple(
            _fleet(name, m, lambda f, n=name: f"fleets.{n}.{f}", EFA_TYPES, "EFA-capable", region, skipped)
            for name, m in ctx.fleets.items()
        )
        size = routes_bytes(built)
        if size > LAMBDA_ENVIRONMENT_BYTES:
            placements = sum(len(f.fallback) for f in built)
            problem = f"the capacity fallback's routes take about {size} bytes of Lambda's 4 KB environment"
            raise fail("fleets", f"{placements} fallback placements", problem, "fewer fallback placements")
        return built
    fleets = []
    for prefix, (family, types, _) in FLAT_FLEETS.items():
        if getattr(ctx, f"{prefix}_purchase_option") == "spot":
            # Batch user guide, multi-node-parallel-jobs: MNP jobs are not supported on Spot.
            problem = "AWS Batch multi-node parallel jobs do not run on Spot compute environments"
            raise fail(f"{prefix}PurchaseOption", "spot", problem)
        if getattr(ctx, f"{prefix}_instance_type") == "none":
            continue
        fields = {f: getattr(ctx, f"{prefix}_{snake(f)}") for f in FLAT_FIELDS}
        model = FleetModel.model_validate(fields)
        fleets.append(_fleet(prefix, model, lambda f, p=prefix: p + upper_first(f), types, family, region, skipped))
    if not fleets:
        raise ConfigError("context keys gpuInstanceType=none and trainiumInstanceType=none leave no fleet to deploy")
    return tuple(fleets)


def _check_fleet_ids(names: tuple[str, ...]) -> None:
    """Refuse two fleets whose stack-level ids meet: a fleet's construct id plus any suffix the stacks
    add (FLEET_ID_SUFFIXES) must not be another fleet's, in any case (like the names themselves).
    No stack's own id ends in a suffix (tests/test_context.py), so the reserved check covers those."""
    claimed: dict[str, tuple[str, str]] = {}  # lower-case id -> (fleet, suffix)
    for name in names:
        for suffix in FLEET_ID_SUFFIXES:
            child = fleet_construct_id(name) + suffix
            other, _ = claimed.setdefault(child.lower(), (name, suffix))
            if other != name:
                problem = f"fleets {other!r} and {name!r} both make the construct id {child!r}"
                raise fail("fleets", name, problem, "another name for one of them")
