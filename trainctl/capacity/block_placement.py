"""A bought Capacity Block as a fleet's placement: the context entry `buy --fleet` prints and, with
`--write`, appends to the fleet's `fallback` list in cdk.json (docs/fleets.md, "Capacity fallback")."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from config.placements import MAX_FALLBACK
from trainctl.capacity.buying import utc
from trainctl.errors import TrainctlError, clip_path


def placement_entry(reservation: Mapping[str, Any]) -> dict[str, str]:
    """The placement a fleet takes for the block: its AZ, type, reservation id and window."""
    return {
        "availabilityZone": str(reservation["AvailabilityZone"]),
        "instanceType": str(reservation["InstanceType"]),
        "capacityReservationId": str(reservation["CapacityReservationId"]),
        "capacityReservationType": "capacity-block",
        "start": utc(reservation["StartDate"]),
        "end": utc(reservation["EndDate"]),
    }


def _queue_output(fleet: str, number: int) -> str:
    """The name docs/fleets.md gives a placement's job queue: `<Fleet>Fallback<n>`."""
    return f"{fleet[:1].upper()}{fleet[1:]}Fallback{number}"


def write_placement(path: Path, fleet: str, entry: Mapping[str, str]) -> str:
    """Append the entry to the fleet's fallback list in cdk.json's context; what the next deploy does."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise TrainctlError(f"--write: cannot read {clip_path(path)} as JSON ({error})") from None
    context = data.get("context") if isinstance(data, dict) else None
    fleets = context.get("fleets") if isinstance(context, dict) else None
    if isinstance(fleets, str):
        # `-c fleets='...'` style values may sit in cdk.json as a JSON string.
        fleets = json.loads(fleets)
    if not isinstance(fleets, dict) or not isinstance(fleets.get(fleet), dict):
        raise TrainctlError(
            f"--write: {clip_path(path)} has no fleet {fleet} in its context key fleets: describe the fleet "
            "there first (docs/fleets.md), or add the entry above by hand"
        )
    fallback = list(fleets[fleet].get("fallback") or [])
    where = f"fleets.{fleet}.fallback"
    if any(p.get("capacityReservationId") == entry["capacityReservationId"] for p in fallback):
        return f"{where} already holds {entry['capacityReservationId']}: {clip_path(path)} is unchanged"
    if len(fallback) >= MAX_FALLBACK:
        raise TrainctlError(
            f"--write: {where} already has {MAX_FALLBACK} placements, the most a fleet takes: remove one "
            "(an ended block's) first"
        )
    fallback.append(dict(entry))
    fleets[fleet] = {**fleets[fleet], "fallback": fallback}
    assert isinstance(context, dict)
    context["fleets"] = fleets
    path.write_text(json.dumps(data, indent=2) + "\n")
    number = len(fallback)
    return (
        f"{where}[{number - 1}] in {clip_path(path)} is the block {entry['capacityReservationId']}; the next "
        f"`make deploy` creates its compute path (launch template, compute environment, job queue "
        f"{_queue_output(fleet, number)}) and replaces nothing: the fleet's placement that was last before it "
        "now waits 10 minutes for capacity before its jobs move on"
    )
