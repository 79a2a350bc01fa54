"""`trainctl budget`: each team's monthly budget against what it has spent, what accrues now and where
the month ends at the current rate (docs/budgets.md)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from budget_ledger.ledger import TeamSpend, money, month_name
from trainctl.commands.base import app, console, reports_errors, state_of
from trainctl.errors import TrainctlError
from trainctl.fleet.budget import load_budgets, team_spends

NO_BUDGETS = "no budgets in this deployment: set the budgets context key and redeploy (docs/budgets.md)"


def as_json(spend: TeamSpend) -> dict[str, Any]:
    return {
        "team": spend.team,
        "month": spend.month,
        "budgetUsd": round(spend.budget, 2),
        "spentUsd": round(spend.spent, 2),
        "accruingUsd": round(spend.accruing, 2),
        "remainingUsd": round(spend.remaining, 2),
        "forecastUsd": round(spend.forecast, 2),
        "usdPerHourNow": round(spend.rate, 2),
        "usedFraction": round(spend.used / spend.budget, 4),
    }


@app.command()
@reports_errors
def budget(ctx: typer.Context) -> None:
    """Each team's budget this month: spent (jobs that ended), accruing (jobs running now), remaining, and
    the forecast to the month's end at the current rate."""
    state = state_of(ctx)
    budgets = load_budgets(state.aws)
    if budgets is None:
        raise TrainctlError(NO_BUDGETS)
    spends = sorted(team_spends(state.aws, budgets).values(), key=lambda s: (-s.used / s.budget, s.team))
    if state.json:
        state.out([as_json(s) for s in spends])
        return
    month = month_name(spends[0].month) if spends else ""
    table = Table(title=f"Team budgets, {month} (UTC): estimates from the ledger, not the bill")
    for column in ("team", "budget", "spent", "accruing now", "remaining", "used", "$/hour now", "forecast"):
        table.add_column(column, justify="left" if column == "team" else "right")
    for s in spends:
        remaining = money(s.remaining) if s.remaining >= 0 else f"-{money(-s.remaining)}"
        table.add_row(
            s.team,
            money(s.budget),
            money(s.spent),
            money(s.accruing),
            remaining,
            f"{s.used / s.budget:.0%}",
            money(s.rate),
            money(s.forecast),
        )
    console().print(table)
