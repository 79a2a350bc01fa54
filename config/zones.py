"""AZ names checked at synth against a dated table of each region's zone letters
(config/availability_zones.json, with its sources), so that `us-east-1z` stops `cdk synth` instead
of failing at deploy when EC2 refuses the subnet. With a region at synth the AZ must be one of that
region's; without one (an environment-agnostic app) its region part must be a region of the table
and its letter one of that region's. The table can be older than AWS: every refusal says so, and
how to skip the table for that region (skipZoneTable, which synth warns about).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent / "availability_zones.json"
REGION = re.compile(r"[a-z]{2,4}(-[a-z]+)+-\d")
_AZ = re.compile(rf"(?P<region>{REGION.pattern})(?P<letter>[a-z])")


@functools.cache
def _table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TABLE.read_text())
    return data


def zones() -> dict[str, str]:
    """Region -> the letters of its zone names."""
    table: dict[str, str] = _table()["zones"]
    return table


def read_on() -> str:
    date: str = _table()["read_on"]
    return date


def az_problem(az: str, region: str | None, skipped: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """(problem, allowed) when `az` is no zone of its region per the table, else None. Regions in
    `skipped` (skipZoneTable) are not looked up: any letter passes."""
    match = _AZ.fullmatch(az)
    if not match:
        return "malformed", "an AZ name such as us-east-1a"
    if region and match["region"] != region:
        return f"is not in the stack's region {region}", f"{_names(region)} (table of {read_on()})"
    if match["region"] in skipped:
        return None
    letters = zones().get(match["region"])
    if letters is None and region:
        return None  # a region newer than the table, named at synth: nothing to check against
    if letters is None:
        near = ", ".join(sorted(r for r in zones() if r.split("-")[0] == match["region"].split("-")[0])[:2])
        allowed = f"a zone of a known region{' such as ' + near if near else ''} {_stale(match['region'])}"
        return f"no region {match['region']}", allowed
    if match["letter"] not in letters:
        return (
            f"{match['region']} has no zone {match['letter']}",
            f"{_names(match['region'])} {_stale(match['region'])}",
        )
    return None


def _names(region: str) -> str:
    letters = zones().get(region)
    return f"{region} + one of {', '.join(letters)}" if letters else f"a zone of {region}"


def _stale(region: str) -> str:
    """How to get past a table older than AWS, for the refusal's allowed part."""
    return f"(table of {read_on()}; if AWS has it: -c skipZoneTable={region})"


def skip_warning(region: str) -> str:
    """The synth warning for a region skipZoneTable names."""
    return (
        f"skipZoneTable={region}: AZ names of {region} are not checked against the zone table of {read_on()}; "
        f"a zone {region} lacks fails only at deploy"
    )
