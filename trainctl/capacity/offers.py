"""Capacity Block offerings (EC2 DescribeCapacityBlockOfferings), priced per accelerator-hour and sorted."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from config.catalog import CATALOG, AcceleratorKind
from trainctl.capacity.rules import OfferSearch, as_utc

# The API's upper bound for one page.
PAGE_SIZE = 1000


@dataclass(frozen=True, kw_only=True)
class Offering:
    offering_id: str
    instance_type: str
    availability_zone: str
    instance_count: int
    start: datetime
    end: datetime
    # The block's actual length: a block starting today ends at 11:30 UTC and may be shorter than asked.
    hours: float
    upfront_fee: Decimal
    currency: str

    @property
    def accelerators(self) -> int:
        return self.instance_count * CATALOG[self.instance_type].accelerator_count

    @property
    def accelerator_word(self) -> str:
        """GPU for NVIDIA types, accelerator for Trainium (per Neuron device)."""
        kind = CATALOG[self.instance_type].accelerator_kind
        return "accelerator" if kind is AcceleratorKind.NEURON else "GPU"

    @property
    def per_accelerator_hour(self) -> Decimal:
        return self.upfront_fee / (Decimal(self.accelerators) * Decimal(str(self.hours)))

    def as_json(self) -> dict[str, Any]:
        return {
            "offeringId": self.offering_id,
            "instanceType": self.instance_type,
            "availabilityZone": self.availability_zone,
            "instanceCount": self.instance_count,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "durationHours": self.hours,
            "upfrontFee": str(self.upfront_fee),
            "currency": self.currency,
            "accelerators": self.accelerators,
            "pricePerAcceleratorHour": str(self.per_accelerator_hour.quantize(Decimal("0.0001"))),
        }


def request_for(search: OfferSearch, instance_type: str) -> dict[str, Any]:
    """DescribeCapacityBlockOfferings' parameters for one type. The API filters on the latest *end*
    (EndDateRange); a start bound is that end less the duration, so the end range gets a day's slack for the
    11:30 UTC alignment and the start is checked again on the answer (`fits`)."""
    request: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": search.nodes,
        "CapacityDurationHours": search.hours,
        "MaxResults": PAGE_SIZE,
    }
    if search.start_after:
        request["StartDateRange"] = search.start_after
    if search.start_before:
        request["EndDateRange"] = search.start_before + timedelta(hours=search.hours + 24)
    if search.all_zones:
        request["AllAvailabilityZones"] = True
    return request


def offering_of(item: dict[str, Any]) -> Offering | None:
    try:
        fee = Decimal(str(item["UpfrontFee"]))
    except (KeyError, InvalidOperation):
        return None
    start, end = as_utc(item["StartDate"]), as_utc(item["EndDate"])
    hours = item.get("CapacityBlockDurationHours", 0) + item.get("CapacityBlockDurationMinutes", 0) / 60
    return Offering(
        offering_id=item["CapacityBlockOfferingId"],
        instance_type=item["InstanceType"],
        availability_zone=item["AvailabilityZone"],
        instance_count=item["InstanceCount"],
        start=start,
        end=end,
        hours=hours or (end - start).total_seconds() / 3600,
        upfront_fee=fee,
        currency=item.get("CurrencyCode", "USD"),
    )


def fits(offering: Offering, search: OfferSearch, zones: frozenset[str] | None) -> bool:
    if search.start_after and offering.start < search.start_after:
        return False
    if search.start_before and offering.start > search.start_before:
        return False
    return zones is None or offering.availability_zone in zones


def find_offerings(ec2: Any, search: OfferSearch, zones: frozenset[str] | None = None) -> list[Offering]:
    """Every fitting offering of every type, every page read, cheapest per accelerator-hour first
    (then earliest start). `zones` narrows to those AZs; None keeps all."""
    found: list[Offering] = []
    for instance_type in search.instance_types:
        request = request_for(search, instance_type)
        while True:
            page = ec2.describe_capacity_block_offerings(**request)
            for item in page.get("CapacityBlockOfferings", []):
                offering = offering_of(item)
                if offering and offering.instance_type in CATALOG and fits(offering, search, zones):
                    found.append(offering)
            token = page.get("NextToken")
            if not token:
                break
            request = {**request, "NextToken": token}
    return sorted(found, key=lambda o: (o.per_accelerator_hour, o.start, o.availability_zone))


def offering_rows(offerings: list[Offering]) -> list[list[str]]:
    rows = []
    for o in offerings:
        rows.append(
            [
                o.offering_id,
                o.instance_type,
                str(o.instance_count),
                o.availability_zone,
                f"{o.start:%Y-%m-%d %H:%M}Z",
                f"{o.end:%Y-%m-%d %H:%M}Z",
                f"{o.hours:g} h",
                f"{o.upfront_fee:,.2f} {o.currency}",
                f"{o.per_accelerator_hour:.4f} /{o.accelerator_word}-h",
            ]
        )
    return rows


OFFERING_COLUMNS = ("OFFERING", "TYPE", "NODES", "AZ", "START", "END", "DURATION", "UP-FRONT FEE", "PER ACCEL-HOUR")
