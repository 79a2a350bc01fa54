"""The dashboard's spend-against-budget row: per team, what it has used this month (the enforcement's
metric, training_constructs/budgets/budget_functions.py) against its budget and the 80% alert line."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw

from budget_ledger.ledger import ALERT_FRACTIONS
from config.metrics import NAMESPACE
from config.settings import BudgetSettings
from training_constructs.budgets.budget_functions import ENFORCE_MINUTES, SPENT_METRIC, TEAM_DIMENSION

WIDTH = 24
# Up to four teams side by side, then another row.
PER_ROW = 4


def budget_widgets(budgets: BudgetSettings) -> list[cw.IWidget]:
    """A title, then one graph per team with its budget and its alert fraction drawn as lines."""
    width = max(WIDTH // min(len(budgets.teams), PER_ROW), WIDTH // PER_ROW)
    widgets: list[cw.IWidget] = [
        cw.TextWidget(
            markdown="# Team budgets: spent this month (ended and running jobs), `trainctl budget` for the figures",
            width=WIDTH,
            height=1,
        )
    ]
    for team in budgets.teams:
        widgets.append(
            cw.GraphWidget(
                title=f"Team {team.team}: USD this month of ${team.monthly_usd:,.0f}",
                left=[
                    cw.Metric(
                        namespace=NAMESPACE,
                        metric_name=SPENT_METRIC,
                        dimensions_map={TEAM_DIMENSION: team.team},
                        statistic="Maximum",
                        period=Duration.minutes(ENFORCE_MINUTES),
                        label="spent",
                    )
                ],
                left_annotations=[
                    cw.HorizontalAnnotation(value=fraction * team.monthly_usd, label=f"{fraction:.0%}")
                    for fraction in ALERT_FRACTIONS
                ],
                left_y_axis=cw.YAxisProps(min=0),
                width=width,
            )
        )
    return widgets
