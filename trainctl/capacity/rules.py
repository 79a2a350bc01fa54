"""What EC2 accepts for a Capacity Block search, checked before any call so a bad value costs one line.

Sources (read 2026-11):
- Duration: "You must specify reservation durations in 1-day increments up to 14 days, and in 7-day
  increments up to 182 days" (EC2 user guide, "Find and purchase Capacity Blocks",
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html; the same rule is the
  CapacityDurationHours documentation in botocore's EC2 model, DescribeCapacityBlockOfferings). The API
  takes hours, so `--hours` must still be a whole number of days on that grid: 24, 48, ... 336, 504, ... 4368.
  Blocks that start today may come back shorter (they end at 11:30 UTC, CapacityBlockOffering's
  capacityBlockDurationHours/Minutes), but the requested duration is always on the grid.
- Size: "Each Capacity Block can have up to 64 instances, and you can have up to 256 instances across
  Capacity Blocks" (same page).
- Start: up to 8 weeks ahead (issue 55, from the EC2 user guide "Capacity Blocks for ML"; the stored copy of
  the guide read here did not state the figure, so it is kept as the issue gives it).
- Types: the types EC2 sells blocks of are the project's one list, config/placements.CAPACITY_BLOCK_TYPES
  (EC2 user guide, "Capacity Blocks for ML", Supported instance types and Regions; the synth refuses a block
  placement of any other type with the same list). A new type EC2 starts selling is added there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from config.placements import CAPACITY_BLOCK_TYPES
from trainctl.errors import ExitCode, TrainctlError

DAILY_DAYS = tuple(range(1, 15))
WEEKLY_DAYS = tuple(range(21, 183, 7))
GRID_DAYS = DAILY_DAYS + WEEKLY_DAYS
MAX_INSTANCES = 64
HORIZON = timedelta(weeks=8)
GRID_TEXT = "1-14 days in 1-day steps, then 21, 28, ... 182 days in 7-day steps"


@dataclass(frozen=True, kw_only=True)
class OfferSearch:
    """One search, already checked: what DescribeCapacityBlockOfferings is asked, per type."""

    instance_types: tuple[str, ...]
    nodes: int
    hours: int
    start_after: datetime | None = None
    start_before: datetime | None = None
    all_zones: bool = False


def bad(message: str) -> TrainctlError:
    return TrainctlError(message, ExitCode.USAGE)


def duration_hours(*, days: int | None, hours: int | None) -> int:
    """The duration in hours from `--days` or `--hours` (exactly one), refused when off EC2's grid."""
    if (days is None) == (hours is None):
        raise bad("give the block's length as exactly one of --days or --hours")
    if hours is not None:
        if hours % 24 or hours // 24 not in GRID_DAYS:
            raise bad(
                f"--hours {hours} is not a Capacity Block duration: {GRID_TEXT} (24, 48, ... 336, 504 ... 4368 h)"
            )
        return hours
    assert days is not None
    if days not in GRID_DAYS:
        raise bad(f"--days {days} is not a Capacity Block duration: {GRID_TEXT}")
    return days * 24


def as_utc(moment: datetime) -> datetime:
    """A date typed without a zone is UTC, as every Capacity Block time is."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def check_search(
    *,
    instance_types: list[str],
    nodes: int,
    days: int | None,
    hours: int | None,
    start_after: datetime | None,
    start_before: datetime | None,
    all_zones: bool,
    now: datetime,
) -> OfferSearch:
    """Every value EC2 would refuse, refused here in one line; `now` is the clock (tests freeze it)."""
    if not instance_types:
        raise bad("give at least one --instance-type, e.g. --instance-type p5.48xlarge")
    for name in instance_types:
        if name not in CAPACITY_BLOCK_TYPES:
            known = ", ".join(sorted(CAPACITY_BLOCK_TYPES))
            raise bad(f"--instance-type {name}: EC2 sells no Capacity Blocks of it; it does of {known}")
    if not 1 <= nodes <= MAX_INSTANCES:
        raise bad(f"--nodes {nodes}: a Capacity Block holds 1 to {MAX_INSTANCES} instances")
    length = duration_hours(days=days, hours=hours)
    after = as_utc(start_after) if start_after else None
    before = as_utc(start_before) if start_before else None
    latest = as_utc(now) + HORIZON
    for flag, moment in (("--start-after", after), ("--start-before", before)):
        if moment is not None and moment > latest:
            shown = moment.strftime("%Y-%m-%d %H:%M")
            raise bad(f"{flag} {shown}Z is beyond 8 weeks from now: blocks start by {latest:%Y-%m-%d %H:%M}Z")
    if after and before and after > before:
        raise bad(f"--start-after {after:%Y-%m-%d %H:%M}Z is later than --start-before {before:%Y-%m-%d %H:%M}Z")
    return OfferSearch(
        instance_types=tuple(dict.fromkeys(instance_types)),
        nodes=nodes,
        hours=length,
        start_after=after,
        start_before=before,
        all_zones=all_zones,
    )
