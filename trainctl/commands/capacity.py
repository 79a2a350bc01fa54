"""`trainctl capacity`: EC2 Capacity Blocks for ML, found and listed (trainctl/capacity/). `buy` and
`extend` are added to the same `app` by trainctl/commands/capacity_buy.py."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from trainctl.capacity.blocks import BLOCK_COLUMNS, block_rows, list_blocks
from trainctl.capacity.offers import OFFERING_COLUMNS, find_offerings, offering_rows
from trainctl.capacity.rules import check_search
from trainctl.commands import capacity_buy
from trainctl.commands.base import GLOBAL_HELP, State, console, human_names, note, reports_errors, state_of
from trainctl.commands.base import app as root_app
from trainctl.deployment import Deployment
from trainctl.errors import TrainctlError


class CapacityGroup(TyperGroup):
    """The sub-commands' arguments and values shown by name, as the top-level commands' are."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            human_names(command.params)
            command.epilog = command.epilog or GLOBAL_HELP


app = typer.Typer(
    name="capacity",
    cls=CapacityGroup,
    help=(
        "EC2 Capacity Blocks for ML: find offerings priced per GPU-hour, buy and extend one within a team's "
        "budget, list the account's blocks."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
)
root_app.add_typer(app)


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


OutputOption = Annotated[Output, typer.Option("--output", "-o", help="table, or json (as the global --json).")]


def now() -> datetime:
    """The clock the 8-week horizon is measured from (tests freeze it)."""
    return datetime.now(UTC)


def deployment_or_none(state: State) -> Deployment | None:
    """The deployment when there is one; the capacity commands need only EC2 read access."""
    try:
        return state.deployment()
    except TrainctlError:
        return None


def deployment_zones(deployment: Deployment | None, instance_types: tuple[str, ...]) -> frozenset[str] | None:
    """The AZs the deployment's placements of these types are in (first word of a placement's label);
    None (every AZ) without a deployment or when no placement names an AZ for them."""
    zones = set()
    for fleet in deployment.fleets.values() if deployment else ():
        for ref in fleet.placements:
            words = ref.label.split()
            if len(words) >= 2 and words[1] in instance_types and words[0] != "default-AZ":
                zones.add(words[0])
    return frozenset(zones) or None


@app.command("offers")
@reports_errors
def offers(
    ctx: typer.Context,
    instance_type: Annotated[
        list[str],
        typer.Option("--instance-type", metavar="TYPE", help="EC2 instance type; repeat to compare types."),
    ],
    nodes: Annotated[int, typer.Option(metavar="N", help="Instances in the block (1-64).")],
    days: Annotated[int | None, typer.Option(metavar="DAYS", help="Length: 1-14 days, then 21, 28, ... 182.")] = None,
    hours: Annotated[int | None, typer.Option(metavar="HOURS", help="Length in hours: 24 x a --days value.")] = None,
    start_after: Annotated[
        datetime | None, typer.Option(metavar="DATE", help="Earliest start, UTC (e.g. 2026-12-01 or 2026-12-01T11:30).")
    ] = None,
    start_before: Annotated[
        datetime | None, typer.Option(metavar="DATE", help="Latest start, UTC; at most 8 weeks from now.")
    ] = None,
    all_zones: Annotated[
        bool,
        typer.Option(
            "--all-zones",
            help="Every AZ of the region, Local Zones and zones not opted into included; "
            "default: the deployment's AZs for these types when its placements name them, else every AZ.",
        ),
    ] = False,
    output: OutputOption = Output.TABLE,
) -> None:
    """Every Capacity Block offering that fits, cheapest per GPU-hour (per accelerator for Trainium) first.
    Values EC2 would refuse are refused before any call. Needs only EC2 read access, no deployment."""
    state = state_of(ctx)
    search = check_search(
        instance_types=instance_type,
        nodes=nodes,
        days=days,
        hours=hours,
        start_after=start_after,
        start_before=start_before,
        all_zones=all_zones,
        now=now(),
    )
    zones = None if all_zones else deployment_zones(deployment_or_none(state), search.instance_types)
    found = find_offerings(state.aws.client("ec2"), search, zones)
    if state.json or output is Output.JSON:
        state.out([o.as_json() for o in found])
        return
    if not found:
        note(
            f"no Capacity Block offerings for {search.nodes} x {', '.join(search.instance_types)} "
            f"for {search.hours} h" + (f" in {', '.join(sorted(zones))}" if zones else "")
        )
        return
    table = Table(title=f"Capacity Block offerings, {search.nodes} instances, {search.hours} h")
    for column in OFFERING_COLUMNS:
        table.add_column(column, no_wrap=True)
    for row in offering_rows(found):
        table.add_row(*row)
    console().print(table)
    if zones:
        note(f"only {', '.join(sorted(zones))} (the deployment's AZs for these types); --all-zones shows every AZ")


@app.command("list")
@reports_errors
def list_(ctx: typer.Context, output: OutputOption = Output.TABLE) -> None:
    """The account's Capacity Blocks in the region: state, window, AZ, type and count, capacity in use, and
    the fleet placement that uses each ("-": none, or a fleet without fallback placements, whose
    reservation the stacks do not publish)."""
    state = state_of(ctx)
    blocks = list_blocks(state.aws.client("ec2"), deployment_or_none(state))
    if state.json or output is Output.JSON:
        state.out([b.as_json() for b in blocks])
        return
    if not blocks:
        note("no Capacity Blocks in this region")
        return
    table = Table(title="Capacity Blocks")
    for column in BLOCK_COLUMNS:
        table.add_column(column, no_wrap=column not in ("RESERVATIONS", "USED BY"))
    for row in block_rows(blocks):
        table.add_row(*row)
    console().print(table)


# `buy` and `extend` live beside (trainctl/commands/capacity_buy.py), after `offers` and `list` in the help.
capacity_buy.register(app)
