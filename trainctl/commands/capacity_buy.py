"""`trainctl capacity buy` and `trainctl capacity extend`: a Capacity Block, or more of one, within the team's
budget (trainctl/capacity/buying.py does the work). `register(app)` adds both to the `capacity` sub-app."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from budget_ledger.ledger import TEAM_TAG, Budgets, Entry, fee_entry, money
from trainctl.capacity import buying
from trainctl.capacity.block_placement import placement_entry, write_placement
from trainctl.commands.base import note, reports_errors, sleep, state_of
from trainctl.errors import ExitCode, TrainctlError
from trainctl.fleet.budget import ledger_table, load_budgets

NO_BUDGETS = "no budgets in this deployment: the fee is not checked against a budget nor recorded in a ledger"

TeamOption = Annotated[
    str | None, typer.Option(metavar="TEAM", help="Team whose budget pays the fee (tag trainctl:team).")
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Buy without asking (a block cannot be cancelled).")]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Check the budget and EC2's DryRun of the purchase; buy nothing.")
]
DaysOption = Annotated[int | None, typer.Option("--days", min=1, help="Duration in days.")]
HoursOption = Annotated[int | None, typer.Option("--hours", min=1, help="Duration in hours.")]


def _hours(days: int | None, hours: int | None) -> int:
    if (days is None) == (hours is None):
        raise TrainctlError("give the duration once: --days DAYS or --hours HOURS")
    return days * 24 if days is not None else int(hours or 0)


def _on_terminal() -> bool:
    return sys.stdin.isatty()


def _confirm(what: str, fee: float, *, yes: bool) -> None:
    """Blocks cannot be cancelled: a person at a terminal agrees, a script passes --yes."""
    if yes:
        return
    if not _on_terminal():
        raise TrainctlError(f"{what} costs {money(fee)} and cannot be cancelled: pass --yes to buy from a script")
    if not typer.confirm(f"Buy {what} for {money(fee)}? It cannot be cancelled", default=False):
        raise TrainctlError("nothing bought")


Checked = tuple[Any, Entry | None, str | None]


def _check_budget(
    aws: Any, offer: buying.Offer, team: str | None, key: str, fleet: str | None, *, check: bool = True
) -> Checked:
    """The ledger table, the fee's entry and the team once the fee fits the team's budget (no table and no
    entry without budgets). `check` False: a fee already paid, recorded whatever the remainder."""
    budgets: Budgets | None = load_budgets(aws)
    chosen = buying.team_of(budgets, team)
    if budgets is None or chosen is None:
        note(NO_BUDGETS)
        return None, None, chosen
    if offer.currency != "USD":
        raise TrainctlError(f"the fee is in {offer.currency} and the budgets in USD: buy it without trainctl")
    entry = fee_entry(
        team=chosen,
        key=key,
        name=f"capacity block {offer.offering_id}",
        fleet=fleet or "",
        instance_type=offer.instance_type,
        count=offer.count,
        usd=offer.fee,
        window=offer.window_ms,
    )
    table = ledger_table(aws, budgets)
    refused = check and buying.fee_refusal(budgets, table, entry, offer.fee, int(time.time() * 1000))
    if refused:
        raise TrainctlError(refused)
    return table, entry, chosen


def _record(table: Any, entry: Entry | None, key: str) -> None:
    if table is not None and entry is not None:
        buying.record_fee(table, _rekeyed(entry, key), int(time.time() * 1000))
        note(f"ledger: the fee counts as team {entry.team}'s spend")


def _rekeyed(entry: Entry, key: str) -> Entry:
    return dataclasses.replace(entry, job_id=key)


def buy(
    ctx: typer.Context,
    offering: Annotated[str, typer.Argument(help="The offering id `trainctl capacity offers` lists.")],
    instance_type: Annotated[str, typer.Option("--instance-type", help="The type offers was run with.")],
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=64, help="The instance count offers was run with.")],
    days: DaysOption = None,
    hours: HoursOption = None,
    team: TeamOption = None,
    fleet: Annotated[str | None, typer.Option(help="Print the fleet placement entry for the block.")] = None,
    write: Annotated[bool, typer.Option("--write", help="With --fleet: add the entry to cdk.json.")] = False,
    cdk_json: Annotated[Path, typer.Option("--cdk-json", hidden=True)] = Path("cdk.json"),
    yes: YesOption = False,
    dry_run: DryRunOption = False,
) -> None:
    """Buy a Capacity Block offering within the team's budget, then wait until it is scheduled or active.
    EC2 looks offerings up by type, count and duration only: give the values `offers` listed it for."""
    if write and not fleet:
        raise TrainctlError("--write needs --fleet: the fleet whose cdk.json entry takes the block")
    state = state_of(ctx)
    ec2 = state.aws.client("ec2")
    offer = buying.find_offering(ec2, offering, instance_type=instance_type, count=nodes, hours=_hours(days, hours))
    what = f"Capacity Block {offer.shape()}"
    reservation = buying.bought_already(ec2, offer)
    if reservation is not None:
        # Bought by an earlier `buy` (perhaps one whose wait ran out): its fee is recorded once it is paid.
        held = str(reservation["CapacityReservationId"])
        note(f"offering {offering} was bought already: {held} is {reservation.get('State')}; nothing bought")
        paid_by = buying.tag_of(reservation, TEAM_TAG) or team
        table, entry, _ = _check_budget(state.aws, offer, paid_by, offering, fleet, check=False)
        if reservation.get("State") in buying.SETTLED:
            _record(table, entry, held)
    else:
        table, entry, chosen = _check_budget(state.aws, offer, team, offering, fleet)
        request = buying.purchase_request(offer, team=chosen, fleet=fleet)
        if dry_run:
            buying.dry_run(ec2.purchase_capacity_block, request, "the purchase")
            budget = "the budget holds it; " if entry is not None else ""
            typer.echo(f"dry run: EC2 would sell {what} for {money(offer.fee)}; {budget}nothing bought")
            return
        _confirm(what, offer.fee, yes=yes)
        buying.dry_run(ec2.purchase_capacity_block, request, "the purchase")
        bought = ec2.purchase_capacity_block(**request)["CapacityReservation"]
        reservation = buying.wait_settled(ec2, str(bought["CapacityReservationId"]), sleep=sleep)
        _record(table, entry, str(reservation["CapacityReservationId"]))
        held = str(reservation["CapacityReservationId"])
        typer.echo(f"bought {what} for {money(offer.fee)}: {held} is {reservation['State']}")
    if fleet:
        placement = placement_entry(reservation)
        typer.echo(json.dumps(placement))
        if write:
            note(write_placement(cdk_json, fleet, placement))


def extend(
    ctx: typer.Context,
    reservation: Annotated[str, typer.Argument(help="The block's reservation id (cr-...).")],
    days: DaysOption = None,
    hours: HoursOption = None,
    team: TeamOption = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
) -> None:
    """Extend a Capacity Block by the cheapest extension EC2 offers, within the team's budget."""
    state = state_of(ctx)
    ec2 = state.aws.client("ec2")
    offer = buying.find_extension(ec2, reservation, _hours(days, hours))
    key = f"{reservation}#{offer.offering_id}"
    table, entry, _ = _check_budget(state.aws, offer, team, key, None)
    request = {"CapacityBlockExtensionOfferingId": offer.offering_id, "CapacityReservationId": reservation}
    what = f"an extension of {reservation} ({offer.shape()})"
    if dry_run:
        buying.dry_run(ec2.purchase_capacity_block_extension, request, "the extension")
        typer.echo(f"dry run: EC2 would sell {what} for {money(offer.fee)}; nothing bought")
        return
    _confirm(what, offer.fee, yes=yes)
    buying.dry_run(ec2.purchase_capacity_block_extension, request, "the extension")
    extensions = ec2.purchase_capacity_block_extension(**request)["CapacityBlockExtensions"]
    status = str(extensions[0].get("CapacityBlockExtensionStatus")) if extensions else "unknown"
    if status == "payment-failed":
        raise TrainctlError(f"{reservation}: the extension's payment-failed: the block ends as before", ExitCode.AWS)
    _record(table, entry, key)
    typer.echo(f"extended {reservation} to {buying.utc(offer.end)} for {money(offer.fee)} ({status})")


def register(app: typer.Typer) -> None:
    """Add `buy` and `extend` to the `capacity` sub-app."""
    app.command()(reports_errors(buy))
    app.command()(reports_errors(extend))
