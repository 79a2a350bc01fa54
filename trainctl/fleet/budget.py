"""The deployment's budgets as trainctl reads them: the jobs stack's `Budgets` output (the document the
budget functions run with, budget_ledger/ledger.py) and the ledger table it names."""

from __future__ import annotations

import json
import time
from typing import Any

from budget_ledger.ledger import Budgets, TeamSpend
from trainctl.aws import Aws, aws_errors
from trainctl.deployment import JOBS_STACK, outputs_of
from trainctl.errors import ExitCode, TrainctlError

BUDGETS_OUTPUT = "Budgets"


def load_budgets(aws: Aws) -> Budgets | None:
    """The budgets document, or None when the deployment has no budgets (no `Budgets` output)."""
    outputs = outputs_of(aws.client("cloudformation"), JOBS_STACK) or {}
    document = outputs.get(BUDGETS_OUTPUT)
    if document is None:
        return None
    try:
        return Budgets.parse(json.loads(document))
    except (ValueError, KeyError, TypeError) as error:
        raise TrainctlError(
            f"the {JOBS_STACK} stack's {BUDGETS_OUTPUT} output is not a budgets document ({error}): redeploy it",
            ExitCode.AWS,
        ) from None


def ledger_table(aws: Aws, budgets: Budgets) -> Any:
    with aws_errors():
        return aws.session.resource("dynamodb", region_name=aws.region).Table(budgets.table)


def team_spends(aws: Aws, budgets: Budgets, now_ms: int | None = None) -> dict[str, TeamSpend]:
    """Every budgeted team's spend this month, from the ledger."""
    with aws_errors():
        return budgets.spends(ledger_table(aws, budgets), now_ms if now_ms is not None else int(time.time() * 1000))
