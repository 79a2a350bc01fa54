"""On-demand price per instance-hour, us-east-1, Linux: what `trainctl cost` multiplies node-hours by.

ESTIMATES, not a bill. They ignore Savings Plans, reservations, Capacity Blocks, Spot, other regions,
EBS, data transfer and the minutes an instance runs outside a job, and AWS changes list prices.
`trainctl cost --price TYPE=USD` replaces any figure for one run, for instance with a negotiated rate.

Every row names where its figure comes from and when it was read. A row whose price is None says that
no on-demand figure was found for the type (sold through Capacity Blocks, or too new for the sources
read here); `trainctl cost` then reports node-hours without a price instead of inventing one.
"""

from __future__ import annotations

from dataclasses import dataclass

# AWS's own list: https://aws.amazon.com/ec2/pricing/on-demand/ (Linux, US East (N. Virginia)). That
# page could not be read from the machine these figures were written on: they are the list prices as
# last seen there, to be checked against it before anyone budgets with them.
AWS_ON_DEMAND = "aws.amazon.com/ec2/pricing/on-demand, us-east-1 Linux (not re-read offline: check)"
# Third-party pages that quote AWS's list price, used where they were what could be read offline.
USAGE_AI_TRAINIUM = "usage.ai/blogs/aws/ai-ml-cost/trainium-vs-gpu-instances (quotes AWS on-demand)"
NOT_PUBLISHED = "no on-demand list price found (Capacity Blocks or not yet listed); pass --price"


@dataclass(frozen=True, kw_only=True)
class HourlyPrice:
    """One instance type's on-demand price: USD per instance-hour (None: not published)."""

    usd: float | None
    source: str
    # When the figure was read (YYYY-MM).
    as_of: str


def _listed(usd: float, as_of: str = "2025-11", source: str = AWS_ON_DEMAND) -> HourlyPrice:
    return HourlyPrice(usd=usd, source=source, as_of=as_of)


def _unpublished(as_of: str = "2026-11") -> HourlyPrice:
    return HourlyPrice(usd=None, source=NOT_PUBLISHED, as_of=as_of)


PRICES: dict[str, HourlyPrice] = {
    "g5.48xlarge": _listed(16.288),
    "g6.4xlarge": _listed(1.3232),
    "g6.8xlarge": _listed(2.0144),
    "g6.12xlarge": _listed(4.6016),
    "g6.16xlarge": _listed(3.3968),
    "g6.24xlarge": _listed(6.6752),
    "g6.48xlarge": _listed(13.3504),
    "g6e.8xlarge": _listed(4.52856),
    "g6e.12xlarge": _listed(10.49264),
    "g6e.16xlarge": _listed(7.57616),
    "g6e.24xlarge": _listed(15.06559),
    "g6e.48xlarge": _listed(30.13118),
    # P4d/P4de/P5/P5en: AWS cut these on-demand prices in June 2025 (AWS What's New, "up to 45%");
    # third-party pages from 2026 still quote the older figures, so the list page is the reference.
    "p4d.24xlarge": _listed(21.96),
    "p4de.24xlarge": _listed(27.447),
    "p5.48xlarge": _listed(55.04),
    "p5e.48xlarge": _unpublished(),
    "p5en.48xlarge": _listed(63.296),
    "trn1.32xlarge": _listed(21.50, "2026-06", USAGE_AI_TRAINIUM),
    "trn1n.32xlarge": _listed(24.78),
    "trn2.48xlarge": _unpublished(),
    # Types the catalog is gaining (issue 23): Blackwell P6 sold through Capacity Blocks at launch,
    # G7e and the one-GPU P5 too new for the sources read here.
    "p6-b200.48xlarge": _unpublished(),
    "p6-b300.48xlarge": _unpublished(),
    "g7e.8xlarge": _unpublished(),
    "g7e.12xlarge": _unpublished(),
    "g7e.24xlarge": _unpublished(),
    "g7e.48xlarge": _unpublished(),
    "p5.4xlarge": _unpublished(),
}
