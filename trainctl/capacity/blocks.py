"""The account's Capacity Blocks: DescribeCapacityBlocks (state, window, AZ, reservation ids),
DescribeCapacityBlockStatus (capacity in use) and DescribeCapacityReservations (type and count, which the
block calls do not carry), and which fleet placement of the deployment uses each.

The EC2 API reference does not say whether DescribeCapacityBlocks returns instance Capacity Blocks (a
`cr-` reservation of ReservationType `capacity-block`) or only UltraServer ones (a `cb-` block holding
reservations). So a `capacity-block` reservation no block names is listed as a block of its own, its
utilisation from the reservation's total and available instance counts.

A placement names its reservation in its label ("us-west-2c p5.48xlarge cr-... (capacity-block ...)",
config/settings.py Placement.label), which the jobs stack publishes only for fleets with fallback
placements (`<Fleet>Placements`, trainctl/deployment.py). A block used by a fleet without fallbacks is
therefore shown with "-".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
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
    statuses = {}
    if raw:
        ids = [item["CapacityBlockId"] for item in raw]
        found = _pages(ec2.describe_capacity_block_status, "CapacityBlockStatuses", CapacityBlockIds=ids)
        statuses = {s["CapacityBlockId"]: s for s in found}
    reservations = {
        r["CapacityReservationId"]: r for r in _pages(ec2.describe_capacity_reservations, "CapacityReservations")
    }
    users = placements_by_reservation(deployment)
    blocks = []
    in_blocks: set[str] = set()
    for item in raw:
        ids_of_block = tuple(item.get("CapacityReservationIds", []))
        in_blocks.update(ids_of_block)
        mine = [reservations[r] for r in ids_of_block if r in reservations]
        status = statuses.get(item["CapacityBlockId"], {})
        total, available = status.get("TotalCapacity"), status.get("TotalAvailableCapacity")
        blocks.append(
            Block(
                block_id=item["CapacityBlockId"],
                state=item.get("State", "-"),
                availability_zone=item.get("AvailabilityZone", "-"),
                start=_utc(item.get("StartDate")),
                end=_utc(item.get("EndDate")),
                reservation_ids=ids_of_block,
                instance_type=", ".join(sorted({r["InstanceType"] for r in mine if "InstanceType" in r})) or "-",
                instance_count=sum(r.get("TotalInstanceCount", 0) for r in mine),
                in_use=total - available if total is not None and available is not None else None,
                total=total,
                used_by=tuple(user for r in ids_of_block for user in users.get(r, [])),
            )
        )
    for rid, r in reservations.items():
        if r.get("ReservationType") != "capacity-block" or rid in in_blocks:
            continue
        total, available = r.get("TotalInstanceCount"), r.get("AvailableInstanceCount")
        blocks.append(
            Block(
                block_id=rid,
                state=r.get("State", "-"),
                availability_zone=r.get("AvailabilityZone", "-"),
                start=_utc(r.get("StartDate")),
                end=_utc(r.get("EndDate")),
                reservation_ids=(rid,),
                instance_type=r.get("InstanceType", "-"),
                instance_count=total or 0,
                in_use=total - available if total is not None and available is not None else None,
                total=total,
                used_by=tuple(users.get(rid, [])),
            )
        )
    return sorted(blocks, key=lambda b: (b.start is None, b.start or datetime.min.replace(tzinfo=UTC), b.block_id))


def _utc(moment: datetime | None) -> datetime | None:
    return as_utc(moment) if moment else None


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
