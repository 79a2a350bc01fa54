"""Buying a Capacity Block and extending one: what `trainctl capacity buy` and `extend` do (docs/fleets.md,
"Buying a Capacity Block").

EC2 describes no offering by its id (DescribeCapacityBlockOfferings takes a type, a count, a duration and a
start range, and no id or filter), so `buy` asks again for the values `offers` was run with and looks the id
up among the offerings they list; the fee is the offering's UpfrontFee. PurchaseCapacityBlock takes no
idempotency token (its input is the offering id, the platform, tags and DryRun), so a purchase tags the
reservation with the offering id (OFFERING_TAG) and a second `buy` of the same offering finds that
reservation and buys nothing. The fee counts as the team's spend in the months the block spans
(budget_ledger/ledger.py fee_entry), checked against each month's remainder before the purchase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from budget_ledger.ledger import (
    REASON_PREFIX,
    TEAM_TAG,
    Budgets,
    Entry,
    dollars,
    money,
    month_bounds,
    month_name,
    months_touched,
    read_entries,
    team_spends,
)
from trainctl.errors import ExitCode, TrainctlError

# Capacity Blocks are sold for Linux only (PurchaseCapacityBlock, InstancePlatform).
INSTANCE_PLATFORM = "Linux/UNIX"
FLEET_TAG = "trainctl:fleet"
OFFERING_TAG = "trainctl:offering"
# The reservation's states (EC2 API, CapacityReservation State): bought and paid, still being paid, or not.
SETTLED = frozenset({"scheduled", "active"})
WAITING = frozenset({"payment-pending", "pending", "assessing", "delayed"})
WAIT_SECONDS = 600.0
POLL_SECONDS = 15.0
REMEDY = "a smaller or shorter block, or a bigger budget"


@dataclass(frozen=True, kw_only=True)
class Offer:
    """A block or an extension on sale: what it holds, its window (UTC) and its up-front fee."""

    offering_id: str
    instance_type: str
    zone: str
    count: int
    start: datetime
    end: datetime
    fee: float
    currency: str

    @property
    def window_ms(self) -> tuple[int, int]:
        return int(self.start.timestamp() * 1000), int(self.end.timestamp() * 1000)

    def shape(self) -> str:
        hours = (self.end - self.start).total_seconds() / 3600
        return f"{self.count} x {self.instance_type} x {hours:g} h from {utc(self.start)} in {self.zone}"


def utc(moment: datetime) -> str:
    """2026-12-01T11:30Z: the form a placement's start and end take (config/placements.py)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def _offer(item: Mapping[str, Any], *, start_key: str, end_key: str, id_key: str) -> Offer:
    return Offer(
        offering_id=str(item[id_key]),
        instance_type=str(item["InstanceType"]),
        zone=str(item["AvailabilityZone"]),
        count=int(item["InstanceCount"]),
        start=item[start_key],
        end=item[end_key],
        fee=float(item["UpfrontFee"]),
        currency=str(item.get("CurrencyCode") or "USD"),
    )


def find_offering(
    ec2: Any,
    offering_id: str,
    *,
    instance_type: str,
    count: int,
    hours: int,
    start_after: datetime | None = None,
    start_before: datetime | None = None,
) -> Offer:
    """The offering with this id among those EC2 lists for the type, count and duration (every AZ)."""
    request: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": count,
        "CapacityDurationHours": hours,
        "AllAvailabilityZones": True,
    }
    if start_after is not None:
        request["StartDateRange"] = start_after
    if start_before is not None:
        request["EndDateRange"] = start_before
    while True:
        page = ec2.describe_capacity_block_offerings(**request)
        for item in page.get("CapacityBlockOfferings", []):
            if item.get("CapacityBlockOfferingId") == offering_id:
                return _offer(item, start_key="StartDate", end_key="EndDate", id_key="CapacityBlockOfferingId")
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    raise TrainctlError(
        f"offering {offering_id} is not among EC2's offerings of {count} x {instance_type} for {hours} h "
        "(sold, expired, or other values): run `trainctl capacity offers` again with the values you buy with"
    )


def tag_of(resource: Mapping[str, Any], key: str) -> str | None:
    return next((str(t["Value"]) for t in resource.get("Tags") or [] if t.get("Key") == key), None)


def bought_already(ec2: Any, offer: Offer) -> Mapping[str, Any] | None:
    """The reservation an earlier `buy` of this offering made (tagged with its id), if any."""
    request: dict[str, Any] = {"Filters": [{"Name": "instance-type", "Values": [offer.instance_type]}]}
    while True:
        page = ec2.describe_capacity_reservations(**request)
        for reservation in page.get("CapacityReservations", []):
            if tag_of(reservation, OFFERING_TAG) == offer.offering_id:
                return dict(reservation)
        if not page.get("NextToken"):
            return None
        request["NextToken"] = page["NextToken"]


def team_of(budgets: Budgets | None, team: str | None) -> str | None:
    """The team whose budget pays: --team, else the deployment's default team; refused when unknown."""
    if budgets is None:
        return team
    chosen = team or budgets.default_team
    if chosen is None or chosen not in budgets.teams:
        named = f"--team {chosen} has no budget" if chosen else "no --team and no default team"
        raise TrainctlError(f"{named}: the teams are {', '.join(budgets.teams)}")
    return chosen


def fee_refusal(budgets: Budgets, table: Any, entry: Entry, fee: float, now: int) -> str | None:
    """The one line refusing a fee that one of the months it spans cannot hold; None when it fits."""
    for month in months_touched(entry.spans, now):
        share = dollars(
            entry.spans, nodes=entry.nodes, usd_per_hour=entry.usd_per_hour, window=month_bounds(month), now=now
        )
        spend = team_spends(read_entries(table, month), budgets.teams, month=month, now=now)[entry.team]
        if share > spend.remaining + 0.005:
            left = max(spend.remaining, 0.0)
            return (
                f"{REASON_PREFIX} team {entry.team} has {money(left)} of {money(spend.budget)} left in "
                f"{month_name(month)}; the fee puts {money(share)} of its {money(fee)} there: {REMEDY}"
            )
    return None


def record_fee(table: Any, entry: Entry, now: int) -> None:
    """The fee in the ledger, once per month it spans (a repeat writes the same items again)."""
    for month in months_touched(entry.spans, now):
        table.put_item(Item=entry.item(month))


def dry_run(call: Callable[..., Any], request: Mapping[str, Any], what: str) -> None:
    """The purchase with DryRun: EC2's DryRunOperation says it would succeed; anything else is one line."""
    try:
        call(DryRun=True, **request)
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code == "DryRunOperation":
            return
        message = str(error.response.get("Error", {}).get("Message", "")).splitlines()
        reason = f"{code}: {message[0]}" if message else code
        raise TrainctlError(f"EC2 would refuse {what} ({reason}); nothing bought", ExitCode.AWS) from None
    raise TrainctlError(f"EC2 answered the DryRun of {what} without DryRunOperation; nothing bought", ExitCode.AWS)


def purchase_request(offer: Offer, *, team: str | None, fleet: str | None) -> dict[str, Any]:
    tags = [{"Key": OFFERING_TAG, "Value": offer.offering_id}]
    tags += [{"Key": TEAM_TAG, "Value": team}] if team else []
    tags += [{"Key": FLEET_TAG, "Value": fleet}] if fleet else []
    return {
        "CapacityBlockOfferingId": offer.offering_id,
        "InstancePlatform": INSTANCE_PLATFORM,
        "TagSpecifications": [{"ResourceType": "capacity-reservation", "Tags": tags}],
    }


def wait_settled(
    ec2: Any,
    reservation_id: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    limit_s: float = WAIT_SECONDS,
    poll_s: float = POLL_SECONDS,
) -> Mapping[str, Any]:
    """The reservation once it is scheduled or active; payment-failed and other ends are one line each."""
    deadline = clock() + limit_s
    while True:
        found = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])["CapacityReservations"]
        state = str(found[0].get("State")) if found else "unknown"
        if state in SETTLED:
            return dict(found[0])
        if state == "payment-failed":
            raise TrainctlError(
                f"{reservation_id}: payment-failed: EC2 could not take the fee, so nothing is reserved and the "
                "ledger counts nothing; check the account's payment method and buy again",
                ExitCode.AWS,
            )
        if state not in WAITING:
            raise TrainctlError(f"{reservation_id} is {state}, not scheduled or active: nothing to use", ExitCode.AWS)
        if clock() >= deadline:
            raise TrainctlError(
                f"{reservation_id} is still {state} after {limit_s / 60:g} min: `trainctl capacity list` shows "
                "it once it is scheduled; `trainctl capacity buy` of the same offering again records it",
                ExitCode.AWS,
            )
        sleep(poll_s)


def find_extension(ec2: Any, reservation_id: str, hours: int) -> Offer:
    """The cheapest extension EC2 offers for the reservation by `hours`."""
    request: dict[str, Any] = {"CapacityReservationId": reservation_id, "CapacityBlockExtensionDurationHours": hours}
    offers: list[Offer] = []
    while True:
        page = ec2.describe_capacity_block_extension_offerings(**request)
        offers += [
            _offer(
                item,
                start_key="CapacityBlockExtensionStartDate",
                end_key="CapacityBlockExtensionEndDate",
                id_key="CapacityBlockExtensionOfferingId",
            )
            for item in page.get("CapacityBlockExtensionOfferings", [])
        ]
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    if not offers:
        raise TrainctlError(
            f"EC2 offers no {hours} h extension of {reservation_id}: a shorter one, or a new block "
            "(`trainctl capacity offers`)"
        )
    return min(offers, key=lambda o: o.fee)
