"""The `budgets`, `budgetPrices` and `budgetDefaultTeam` keys, read into BudgetSettings with one-line refusals.

A team is what identifies a job's owner here: its share identifier on fair-share queues (the `shares`
key's identifiers, a `prefix*` entry included as written), else the trainctl:team tag. Every placement of
every fleet needs a price: config/prices.py's on-demand figure or the fleet's `budgetPrices` entry (a
reservation's or a negotiated price); a type without a published price is refused rather than counted as free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from budget_ledger.ledger import QueuePrice, document
from config.context_keys import TEAM_PATTERN
from config.key_refusals import fail
from config.placements import LAMBDA_ENVIRONMENT_BYTES, QUEUE_ARN_CHARS
from config.prices import PRICE_REGION, PRICES
from config.settings import BudgetSettings, FleetSettings, Share, TeamBudget

# A month's budget above this is a typo (ten billion dollars), not a plan.
MAX_MONTHLY_USD = 10_000_000_000
# An instance-hour above this is a typo: the dearest type in config/prices.py is about $142.
MAX_USD_PER_HOUR = 10_000
# CloudFormation's generated table name (<stack>-<construct path>-<suffix>) and an SNS topic's ARN, at
# most about this long.
TABLE_NAME_CHARS = 80
TOPIC_ARN_CHARS = 120
# A benchmark job definition's ARN (its name is CloudFormation's, with a revision).
JOB_DEFINITION_ARN_CHARS = 120


def _amount(path: str, value: Any, ceiling: float, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(path, value, "not a number", f'a number of {unit} above 0 (20000, not "$20,000")')
    if not 0 < value <= ceiling:
        raise fail(path, value, "out of range", f"a number of {unit} above 0 and at most {ceiling:,.0f}")
    return float(value)


def _team(path: str, team: str, usd: Any, shares: tuple[Share, ...]) -> str:
    if shares:
        identifiers = [s.identifier for s in shares]
        if team not in identifiers:
            listed = ", ".join(identifiers)
            allowed = f"a shares identifier: {listed}" if len(listed) <= 80 else "an identifier of the shares key"
            raise fail(path, usd, "unknown share (fair-share queues: a team is a share identifier)", allowed)
    elif not re.fullmatch(TEAM_PATTERN, team):
        raise fail(
            path, usd, "malformed team name", "1 to 64 letters, digits, - and _, starting with a letter or digit"
        )
    return team


def _environment_bytes(
    teams: tuple[TeamBudget, ...], default_team: str | None, queues: list[tuple[str, str, float]], timeout: int
) -> int:
    """An estimate of the functions' environment (BUDGETS and the topic's ARN), with deploy-time names at
    their longest likely length (config/placements.py: Lambda's 4 KB for all variables together)."""
    shape = document(
        table="x" * TABLE_NAME_CHARS,
        teams={t.team: t.monthly_usd for t in teams},
        default_team=default_team,
        fair_share=True,
        queues=[
            QueuePrice(queue="x" * QUEUE_ARN_CHARS, fleet=fleet, instance_type=kind, usd_per_hour=usd)
            for fleet, kind, usd in queues
        ],
        timeout_seconds=timeout,
        attempts=10,
        check_definitions=["x" * JOB_DEFINITION_ARN_CHARS for _ in {fleet for fleet, _, _ in queues}],
    )
    return len("BUDGETS" + json.dumps(shape, separators=(",", ":"))) + len("ALERT_TOPIC_ARN") + TOPIC_ARN_CHARS


def read_budgets(
    budgets: Mapping[str, Any] | None,
    prices: Mapping[str, Any] | None,
    default_team: str | None,
    *,
    fleets: tuple[FleetSettings, ...],
    shares: tuple[Share, ...],
    timeout_seconds: int,
    region: str | None = None,
) -> BudgetSettings | None:
    """BudgetSettings, or None without budgets (then budgetPrices and budgetDefaultTeam are refused)."""
    if not budgets:
        for name, value in (("budgetPrices", prices), ("budgetDefaultTeam", default_team)):
            if value:
                raise fail(name, value, "only with budgets", "set budgets too, or leave this key out")
        return None
    teams = tuple(
        TeamBudget(
            team=_team(f"budgets.{team}", team, usd, shares),
            monthly_usd=_amount(f"budgets.{team}", usd, MAX_MONTHLY_USD, "US dollars a month"),
        )
        for team, usd in budgets.items()
    )
    if default_team is not None:
        if shares:
            raise fail("budgetDefaultTeam", default_team, "fair-share jobs name their team (share identifier)")
        if default_team not in budgets:
            raise fail("budgetDefaultTeam", default_team, "not a team of budgets", "one of " + ", ".join(budgets))
    names = {fleet.name for fleet in fleets}
    given: dict[str, float] = {}
    for name, usd in (prices or {}).items():
        if name not in names:
            raise fail(f"budgetPrices.{name}", usd, "no such fleet", "one of " + ", ".join(sorted(names)))
        given[name] = _amount(f"budgetPrices.{name}", usd, MAX_USD_PER_HOUR, "US dollars per instance-hour")
    if region is not None and region != PRICE_REGION:
        # config/prices.py's figures are us-east-1's, in US dollars: anywhere else (and in aws-cn, whose bill
        # is in CNY) every fleet's price must be given. A synth that knows no region cannot tell.
        missing = sorted(names - set(given))
        if missing:
            problem = f"the stack's region is {region}; config/prices.py has {PRICE_REGION} prices only"
            wanted = ", ".join(f'"{name}": N' for name in missing)
            raise fail("budgetPrices", dict(prices or {}), problem, f"budgetPrices {{{wanted}}}, N per instance-hour")
    table: dict[tuple[str, str], float] = {}
    # One queue per placement (training_constructs/jobs/training_jobs.py), each in the budgets document.
    queues: list[tuple[str, str, float]] = []
    for fleet in fleets:
        for placement in fleet.placements:
            kind = placement.instance.name
            listed = PRICES.get(kind)
            usd = given.get(fleet.name, listed.usd if listed else None)
            if usd is None:
                problem = f"fleet {fleet.name} runs {kind}, which has no on-demand price in config/prices.py"
                raise fail(
                    "budgetPrices",
                    dict(prices or {}),
                    problem,
                    f'budgetPrices {{"{fleet.name}": USD per instance-hour}}',
                )
            table[(fleet.name, kind)] = usd
            queues.append((fleet.name, kind, usd))
    size = _environment_bytes(teams, default_team, queues, timeout_seconds)
    if size > LAMBDA_ENVIRONMENT_BYTES:
        problem = f"the budgets document takes about {size} bytes of Lambda's 4 KB environment ({len(queues)} queues)"
        raise fail("budgets", f"{len(teams)} team(s)", problem, "fewer teams, fleets or fallback placements")
    return BudgetSettings(
        teams=teams,
        prices=tuple((fleet, kind, usd) for (fleet, kind), usd in table.items()),
        default_team=default_team,
        fair_share=bool(shares),
    )
