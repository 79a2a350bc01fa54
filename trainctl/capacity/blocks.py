"""The account's Capacity Blocks: DescribeCapacityBlocks (state, window, AZ, reservation ids),
DescribeCapacityBlockStatus (capacity in use) and DescribeCapacityReservations (type and count, which the
block calls do not carry), and which fleet placement of the deployment uses each.

A placement names its reservation in its label ("us-west-2c p5.48xlarge cr-... (capacity-block ...)",
config/settings.py Placement.label), which the jobs stack publishes only for fleets with fallback
placements (`<Fleet>Placements`, trainctl/deployment.py). A block used by a fleet without fallbacks is
therefore shown with "-".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainctl.capacity.rules import as_utc
from trainctl.deployment import Deployment

RESERVATION = re.compile(r"\bcr-[0-9a-f]+\b")


@dataclass(frozen=True, kw_only=True)
class Block:
    block_id: str
    state: str
    availability_zone: str
    start: datetime | None
    end: datetime | None
    reservation_ids: tuple[str, ...]
    instance_type: str = "-"
    instance_count: int = 0
    # From DescribeCapacityBlockStatus: instances of the block's capacity in use (total - available).
    in_use: int | None = None
    total: int | None = None
    used_by: tuple[str, ...] = ()

    @property
    def utilisation(self) -> str:
        if self.in_use is None or not self.total:
            return "-"
        return f"{self.in_use}/{self.total} ({100 * self.in_use / self.total:.0f}%)"

    def as_json(self) -> dict[str, Any]:
        return {
            "capacityBlockId": self.block_id,
            "state": self.state,
            "availabilityZone": self.availability_zone,
            "start": self.start.isoformat() if self.start else None,
            "end": self.end.isoformat() if self.end else None,
            "capacityReservationIds": list(self.reservation_ids),
            "instanceType": self.instance_type,
            "instanceCount": self.instance_count,
            "inUse": self.in_use,
            "totalCapacity": self.total,
            "usedBy": list(self.used_by),
        }


def placements_by_reservation(deployment: Deployment | None) -> dict[str, list[str]]:
    """Reservation id -> the placements that name it, as "<fleet> placement <n>" (0 is the fleet's own)."""
    users: dict[str, list[str]] = {}
    for fleet in deployment.fleets.values() if deployment else ():
        for number, ref in enumerate(fleet.placements):
            for reservation in RESERVATION.findall(ref.label):
                users.setdefault(reservation, []).append(f"{fleet.name} placement {number}")
    return users


def _pages(call: Any, key: str, **request: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while True:
        page = call(**request)
        items += page.get(key, [])
        if not page.get("NextToken"):
            return items
        request = {**request, "NextToken": page["NextToken"]}


def list_blocks(ec2: Any, deployment: Deployment | None) -> list[Block]:
    """The account's blocks in the region, earliest start first."""
    raw = _pages(ec2.describe_capacity_blocks, "CapacityBlocks")
    if not raw:
        return []
    ids = [item["CapacityBlockId"] for item in raw]
    statuses = {
        s["CapacityBlockId"]: s
        for s in _pages(ec2.describe_capacity_block_status, "CapacityBlockStatuses", CapacityBlockIds=ids)
    }
    reservation_ids = [r for item in raw for r in item.get("CapacityReservationIds", [])]
    reservations = {}
    if reservation_ids:
        found = _pages(
            ec2.describe_capacity_reservations, "CapacityReservations", CapacityReservationIds=reservation_ids
        )
        reservations = {r["CapacityReservationId"]: r for r in found}
    users = placements_by_reservation(deployment)
    blocks = []
    for item in raw:
        ids_of_block = tuple(item.get("CapacityReservationIds", []))
        mine = [reservations[r] for r in ids_of_block if r in reservations]
        status = statuses.get(item["CapacityBlockId"])
        total = status.get("TotalCapacity") if status else None
        available = status.get("TotalAvailableCapacity") if status else None
        blocks.append(
            Block(
                block_id=item["CapacityBlockId"],
                state=item.get("State", "-"),
                availability_zone=item.get("AvailabilityZone", "-"),
                start=as_utc(item["StartDate"]) if "StartDate" in item else None,
                end=as_utc(item["EndDate"]) if "EndDate" in item else None,
                reservation_ids=ids_of_block,
                instance_type=", ".join(sorted({r["InstanceType"] for r in mine})) or "-",
                instance_count=sum(r.get("TotalInstanceCount", 0) for r in mine),
                in_use=total - available if total is not None and available is not None else None,
                total=total,
                used_by=tuple(user for r in ids_of_block for user in users.get(r, [])),
            )
        )
    return sorted(blocks, key=lambda b: (b.start is None, b.start or datetime.min, b.block_id))


def block_rows(blocks: list[Block]) -> list[list[str]]:
    def when(moment: datetime | None) -> str:
        return f"{moment:%Y-%m-%d %H:%M}Z" if moment else "-"

    return [
        [
            b.block_id,
            b.state,
            f"{when(b.start)} .. {when(b.end)}",
            b.availability_zone,
            b.instance_type,
            str(b.instance_count or "-"),
            b.utilisation,
            ", ".join(b.reservation_ids) or "-",
            ", ".join(b.used_by) or "-",
        ]
        for b in blocks
    ]


BLOCK_COLUMNS = ("BLOCK", "STATE", "WINDOW", "AZ", "TYPE", "NODES", "IN USE", "RESERVATIONS", "USED BY")
