"""On-demand price per instance-hour, us-east-1, Linux: what `trainctl cost` multiplies node-hours by.

ESTIMATES, not a bill. They ignore Savings Plans, reservations, Capacity Blocks, Spot, other regions,
EBS, data transfer and the minutes an instance runs outside a job, and AWS changes list prices.
`trainctl cost --price TYPE=USD` replaces any figure for one run, for instance with a negotiated rate.

Every row names where its figure comes from and when (the price list's date, or the month a table was
read). A row whose price is None is a type AWS sells in us-east-1 only through Capacity Blocks (no
on-demand SKU); `trainctl cost` then reports its node-hours without a price instead of inventing one.
"""

from __future__ import annotations

from dataclasses import dataclass

# The region every figure below is for.
PRICE_REGION = "us-east-1"

# AWS's own figures: the Price List bulk API's us-east-1 EC2 offer file, filtered to OnDemand, Linux,
# Shared tenancy (Last-Modified 2026-07-28), as quoted in a public instance audit read in 2026-11.
PRICE_LIST = "AWS Price List API, us-east-1 EC2 offer of 2026-07-28 (OnDemand, Linux, Shared)"
# Where only public price tables were found: figures that two independent tables agree on.
PRICE_TABLES = "AWS on-demand list price, us-east-1 Linux, as kept in public price tables (two agree)"
# One public table, rounded to 4 decimals; g7e.24xlarge agrees with a us-east-2 table checked
# against Cost Explorer.
G7E_TABLE = "AWS on-demand list price, us-east-1 Linux, as kept in a public price table (4 decimals)"
NOT_PUBLISHED = "no on-demand SKU in AWS's us-east-1 price list (Capacity Blocks only); pass --price"
# Types with an on-demand SKU whose us-east-1 figure this release could not find in any source it
# trusts (no Price List quote, fewer than two agreeing tables): reported unpriced, like NOT_PUBLISHED.
NOT_FOUND = "no us-east-1 on-demand figure found in a source this release trusts (read 2026-11); pass --price"


@dataclass(frozen=True, kw_only=True)
class HourlyPrice:
    """One instance type's on-demand price: USD per instance-hour (None: not published)."""

    usd: float | None
    source: str
    # When the figure was read (YYYY-MM).
    as_of: str


def _listed(usd: float, source: str) -> HourlyPrice:
    return HourlyPrice(usd=usd, source=source, as_of="2026-07" if source == PRICE_LIST else "2026-11")


def _unpublished() -> HourlyPrice:
    return HourlyPrice(usd=None, source=NOT_PUBLISHED, as_of="2026-07")


def _not_found() -> HourlyPrice:
    return HourlyPrice(usd=None, source=NOT_FOUND, as_of="2026-11")


PRICES: dict[str, HourlyPrice] = {
    "g5.48xlarge": _listed(16.288, PRICE_TABLES),
    "g6.4xlarge": _listed(1.3232, PRICE_TABLES),
    "g6.8xlarge": _listed(2.0144, PRICE_TABLES),
    "g6.12xlarge": _listed(4.6016, PRICE_TABLES),
    "g6.16xlarge": _listed(3.3968, PRICE_TABLES),
    "g6.24xlarge": _listed(6.6752, PRICE_TABLES),
    "g6.48xlarge": _listed(13.3504, PRICE_TABLES),
    "g6e.8xlarge": _listed(4.52856, PRICE_TABLES),
    "g6e.12xlarge": _listed(10.49264, PRICE_TABLES),
    "g6e.16xlarge": _listed(7.57719, PRICE_TABLES),
    "g6e.24xlarge": _listed(15.06559, PRICE_TABLES),
    "g6e.48xlarge": _listed(30.13118, PRICE_LIST),
    # AWS cut the P4d/P4de/P5/P5en on-demand prices in June 2025; pages that still quote $98.32
    # for p5.48xlarge predate the cut.
    "p4d.24xlarge": _listed(21.957642, PRICE_LIST),
    "p4de.24xlarge": _listed(27.44705, PRICE_LIST),
    "p5.48xlarge": _listed(55.04, PRICE_LIST),
    "p5e.48xlarge": _unpublished(),
    "p5en.48xlarge": _listed(63.296, PRICE_LIST),
    "trn1.32xlarge": _listed(21.50, PRICE_LIST),
    "trn1n.32xlarge": _listed(24.78, PRICE_LIST),
    "trn2.48xlarge": _unpublished(),
    # Types the catalog is gaining (issue 23).
    "p6-b200.48xlarge": _listed(113.9328, PRICE_LIST),
    "p6-b300.48xlarge": _listed(142.416, PRICE_LIST),
    "p5.4xlarge": _listed(6.88, PRICE_LIST),
    "g7e.8xlarge": _listed(5.2682, G7E_TABLE),
    "g7e.12xlarge": _listed(8.2861, G7E_TABLE),
    "g7e.24xlarge": _listed(16.57216, G7E_TABLE),
    "g7e.48xlarge": _listed(33.14432, PRICE_LIST),
    # The rest of the EFA-capable NVIDIA types (issue 23 follow-up). G4dn, G5 and P3dn: list prices
    # unchanged for years (g5.24xlarge is half of g5.48xlarge, as the list has it).
    "g4dn.8xlarge": _listed(2.176, PRICE_TABLES),
    "g4dn.12xlarge": _listed(3.912, PRICE_TABLES),
    "g4dn.16xlarge": _listed(4.352, PRICE_TABLES),
    "g4dn.metal": _listed(7.824, PRICE_TABLES),
    "g5.8xlarge": _listed(2.448, PRICE_TABLES),
    "g5.12xlarge": _listed(5.672, PRICE_TABLES),
    "g5.16xlarge": _listed(4.096, PRICE_TABLES),
    "g5.24xlarge": _listed(8.144, PRICE_TABLES),
    "p3dn.24xlarge": _listed(31.212, PRICE_TABLES),
    # G7 (new in 2026) and Gr6: no figure found that two sources agree on.
    "gr6.8xlarge": _not_found(),
    "g7.8xlarge": _not_found(),
    "g7.12xlarge": _not_found(),
    "g7.24xlarge": _not_found(),
    "g7.48xlarge": _not_found(),
}
