"""Price before launch, and the budget's refusal at submit: what `submit`, `run` and `sweep` say and check
before a job leaves this machine.

The estimate is the most a job may cost: nodes x the instance-hour price x its attempt timeout (the one
the request or the job definition names; `--hours` sets it) x its attempts (the request's or the job
definition's retry strategy): Batch bills every attempt, and the ledger counts each one. The price
is the deployment's budget price for the fleet's queue where budgets are deployed (`budgetPrices`, else
config/prices.py), config/prices.py's on-demand figure otherwise.

On a terminal, a job whose most exceeds ASK_ABOVE_USD is confirmed first (`--yes` skips the question); in a
script (stdin not a terminal) the line is printed and the job goes. With budgets, a job whose most exceeds
its team's remainder this month is refused in one line with the figures (budget_ledger/ledger.py words it).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from budget_ledger.ledger import TEAM_TAG, Budgets, Estimate, TeamSpend, money, refusal, unknown_team
from trainctl.commands.base import State, note
from trainctl.deployment import Fleet
from trainctl.errors import ExitCode, TrainctlError
from trainctl.fleet.budget import load_budgets, team_spends
from trainctl.fleet.compute import fleet_compute
from trainctl.fleet.cost import price_per_hour
from trainctl.submitting.preflight import describe_definition
from trainctl.submitting.requests import MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS

# On a terminal, a job (or sweep) that may cost more than this is confirmed before it is submitted.
ASK_ABOVE_USD = 1000.0
# --hours becomes the attempt timeout, so it spans what --timeout accepts: 1 minute to about 68 years.
MAX_HOURS = MAX_TIMEOUT_SECONDS // 3600

HoursOption = Annotated[
    float | None,
    typer.Option(
        "--hours",
        metavar="HOURS",
        help="Hours an attempt may run: sets the attempt timeout the estimate and the budget count "
        "(not beside --timeout or a task file's timeout:).",
    ),
]
TeamOption = Annotated[
    str | None,
    typer.Option(metavar="TEAM", help="Team whose budget the job counts against (FIFO fleets; tag trainctl:team)."),
]
YesOption = Annotated[
    bool,
    typer.Option("--yes", "-y", help=f"Submit without asking when the most it may cost is over ${ASK_ABOVE_USD:,.0f}."),
]


def on_terminal() -> bool:
    return sys.stdin.isatty()


def hours_timeout(hours: float) -> int:
    """--hours as the attempt timeout in seconds (at least Batch's minimum), or a one-line refusal."""
    if not (math.isfinite(hours) and 1 / 60 <= hours <= MAX_HOURS):
        raise TrainctlError(f"--hours {hours:g}: an attempt may run 1/60 (a minute) to {MAX_HOURS:,} hours")
    return max(MIN_TIMEOUT_SECONDS, math.ceil(hours * 3600))


def one_timeout(hours: float | None, timeout: int | None, *, named: str) -> None:
    """--hours checked, and refused beside another attempt timeout (`named`: --timeout, a task file's
    `timeout:`), which it would otherwise replace without a word."""
    if hours is None:
        return
    hours_timeout(hours)
    if timeout is not None:
        raise TrainctlError(
            f"--hours {hours:g} and {named} {timeout} both set the attempt timeout: give one of them "
            "(--hours in hours, or the timeout in seconds)"
        )


@dataclass(frozen=True, kw_only=True)
class PreSubmit:
    """What trainctl knows before submitting: the estimate (None: no price for the type), the team and
    its spend this month (None: no budget applies)."""

    estimate: Estimate | None
    team: str | None
    spend: TeamSpend | None
    # Why there is no estimate.
    unknown: str = ""

    def line(self) -> str:
        """estimate: $220.16/hour (4 x p5.48xlarge at $55.04); at most $440 (4 x p5.48xlarge x 2 h); ..."""
        if self.estimate is None:
            text = f"estimate: none: {self.unknown}"
        else:
            e = self.estimate
            jobs = f"{e.jobs} jobs of " if e.jobs > 1 else ""
            text = (
                f"estimate: {money(e.hourly)}/hour ({jobs}{e.nodes} x {e.instance_type} at {money(e.usd_per_hour)}); "
                f"at most {money(e.most)} ({e.shape()})"
            )
        if self.spend is not None:
            s = self.spend
            text += f"; team {s.team} has {money(max(s.remaining, 0))} left of {money(s.budget)} this month"
        return text


def _estimate(
    state: State, fleet: Fleet, requests: Sequence[dict[str, Any]], budgets: Budgets | None
) -> Estimate | str:
    """The estimate, or why there is none."""
    request = requests[0]
    named = str(request["jobDefinition"])
    # A dry run names a revision it would register in words; the request's nodeOverrides carry its node
    # count, and it copies the deployed definition's timeout (trainctl/submitting/revisions.py).
    definition = describe_definition(state.batch, named if named.startswith("arn:") else fleet.training_definition)
    nodes = int(
        (request.get("nodeOverrides") or {}).get("numNodes")
        or (definition.get("nodeProperties") or {}).get("numNodes")
        or 1
    )
    seconds = (request.get("timeout") or definition.get("timeout") or {}).get("attemptDurationSeconds")
    # As the arrival check judges it (training_constructs/budgets/budget_functions.py): else the deployment's
    # job timeout.
    seconds = seconds or (budgets.timeout_seconds if budgets else None)
    if seconds is None:
        return "the job has no timeout, so the most it may cost has no bound (pass --hours to set one)"
    # SubmitJob's retryStrategy replaces the definition's (API SubmitJob, retryStrategy).
    attempts = int((request.get("retryStrategy") or definition.get("retryStrategy") or {}).get("attempts") or 1)
    queue_price = budgets.price_of(fleet.job_queue) if budgets else None
    instance_type = queue_price.instance_type if queue_price else fleet_compute(state.batch, fleet).instance_type
    usd = queue_price.usd_per_hour if queue_price else price_per_hour(instance_type or "", {})
    if usd is None or instance_type is None:
        return f"no price for {instance_type or 'the fleet'}'s instance-hour in config/prices.py"
    return Estimate(
        nodes=nodes,
        instance_type=instance_type,
        usd_per_hour=usd,
        hours=int(seconds) / 3600,
        jobs=len(requests),
        attempts=attempts,
    )


def _team(budgets: Budgets, request: dict[str, Any], team: str | None) -> str | None:
    if team is not None:
        if budgets.fair_share:
            raise TrainctlError(f"--team {team}: on fair-share fleets a job counts against its --share's budget")
        if team not in budgets.teams:
            raise TrainctlError(f"--team {team}: no budget of that name; the teams are {', '.join(budgets.teams)}")
    detail = {"shareIdentifier": request.get("shareIdentifier"), "tags": request.get("tags") or {}}
    # The arrival check would stop it (training_constructs/budgets/budget_functions.py): refuse it here,
    # before it leaves.
    unknown = unknown_team(detail, budgets)
    if unknown:
        raise TrainctlError(f"{unknown} ({'--share' if budgets.fair_share else '--team'})")
    return budgets.team_of(detail)


def before_submit(
    state: State,
    fleet: Fleet,
    requests: Sequence[dict[str, Any]],
    *,
    hours: float | None,
    team: str | None,
    yes: bool,
    dry_run: bool,
) -> PreSubmit:
    """Tag the requests with the team, make --hours their attempt timeout, print the estimate on stderr,
    refuse what the team's budget cannot hold, and on a terminal confirm a job over ASK_ABOVE_USD. A dry
    run prints and asks nothing."""
    # --hours binds: Batch stops an attempt at its timeout (API SubmitJob, timeout), so the estimate is a bound.
    seconds = hours_timeout(hours) if hours is not None else None
    for request in requests:
        if team:
            request["tags"] = {**(request.get("tags") or {}), TEAM_TAG: team}
        if seconds is not None:
            request["timeout"] = {"attemptDurationSeconds": seconds}
    budgets = load_budgets(state.aws)
    found = _estimate(state, fleet, requests, budgets)
    estimate = found if isinstance(found, Estimate) else None
    owner = _team(budgets, requests[0], team) if budgets else None
    spend = team_spends(state.aws, budgets)[owner] if budgets and owner else None
    checked = PreSubmit(estimate=estimate, team=owner, spend=spend, unknown=found if isinstance(found, str) else "")
    refused = refusal(spend, estimate) if spend and estimate else None
    if dry_run:
        note(checked.line())
        if refused:
            note(f"would be refused: {refused}")
        return checked
    if refused:
        raise TrainctlError(refused)
    note(checked.line())
    ask = estimate is not None and estimate.most > ASK_ABOVE_USD and not yes and on_terminal()
    if ask and estimate and not typer.confirm(f"This may cost up to {money(estimate.most)}. Submit?"):
        raise typer.Exit(int(ExitCode.USAGE))
    return checked
