"""AZ names checked at synth against a dated table of each region's zone letters
(config/availability_zones.json, with its sources), so that `us-east-1z` stops `cdk synth` instead
of failing at deploy when EC2 refuses the subnet. With a region at synth the AZ must be one of that
region's; without one (an environment-agnostic app) its region part must be a region of the table
and its letter one of that region's. The table can be older than AWS: every refusal says so.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent / "availability_zones.json"
_AZ = re.compile(r"(?P<region>[a-z]{2,4}(-[a-z]+)+-\d)(?P<letter>[a-z])")


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


def az_problem(az: str, region: str | None) -> tuple[str, str] | None:
    """(problem, allowed) when `az` is no zone of its region per the table, else None."""
    match = _AZ.fullmatch(az)
    if not match:
        return "malformed", "an AZ name such as us-east-1a"
    stale = f"(zone table of {read_on()}; AWS may have added more)"
    if region and match["region"] != region:
        return f"is not in the stack's region {region}", f"{_names(region)} {stale}"
    letters = zones().get(match["region"])
    if letters is None and region:
        return None  # a region newer than the table, named at synth: nothing to check against
    if letters is None:
        near = ", ".join(sorted(r for r in zones() if r.split("-")[0] == match["region"].split("-")[0])[:2])
        allowed = f"a zone of a known region{' such as ' + near if near else ''} {stale}"
        return f"no region {match['region']}", allowed
    if match["letter"] not in letters:
        return f"{match['region']} has no zone {match['letter']}", f"{_names(match['region'])} {stale}"
    return None


def _names(region: str) -> str:
    letters = zones().get(region)
    return f"{region} + one of {', '.join(letters)}" if letters else f"a zone of {region}"
