"""Fleet-wide commands: status (and --watch), check, cost."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import typer
from rich.table import Table

from trainctl.commands import base
from trainctl.commands.base import POLL_SECONDS, PollOption, State, app, console, note, reports_errors, state_of
from trainctl.commands.submitting import check_share, follow
from trainctl.errors import ExitCode
from trainctl.fleet.capacity import NO_CAPACITY_WAIT
from trainctl.fleet.cost import GROUPINGS, finished_usages, parse_prices, parse_since, summarize, unpriced_types
from trainctl.fleet.status import fleet_status
from trainctl.fleet.verdict import HEALTHY, last_verdict, verdict_summary
from trainctl.inspecting.logs import StreamReader, node_streams
from trainctl.jobs import main_node
from trainctl.submitting.requests import submit_request


class CostGrouping(enum.StrEnum):
    share = "share"
    queue = "queue"
    name = "name"


assert tuple(CostGrouping) == GROUPINGS  # the option's choices are cost's groupings


# ----------------------------------------------------------------------------------------------- status
@app.command()
@reports_errors
def status(
    ctx: typer.Context,
    watch: Annotated[
        bool, typer.Option("--watch", help="Redraw every --interval seconds until interrupted (Ctrl-C).")
    ] = False,
    interval: Annotated[float, typer.Option(min=1.0, help="Seconds between redraws with --watch.")] = 10.0,
    rounds: Annotated[int, typer.Option("--rounds", hidden=True, min=0)] = 0,
) -> None:
    """Per fleet: instance type, queue and compute environment state, instances and vCPUs, jobs by state.

    Instances: the compute environment's desired vCPUs over one instance's vCPUs (what Batch is
    scaling to now).
    """
    state = state_of(ctx)
    if not watch:
        _show_status(state)
        return
    shown = 0
    try:
        while True:
            if not state.json and console().is_terminal:
                console().clear()
            _show_status(state)
            shown += 1
            if rounds and shown >= rounds:
                return
            base.sleep(interval)
    except KeyboardInterrupt:
        return


def _show_status(state: State) -> None:
    rows = [fleet_status(state.batch, fleet) for fleet in state.deployment().fleets.values()]
    if state.json:
        state.out(rows)
        return
    table = Table(title=f"Training fleets in {state.deployment().region}")
    for column in ("fleet", "type", "queue", "compute env", "instances", "vCPUs"):
        table.add_column(column, no_wrap=column in ("fleet", "type", "instances", "vCPUs"))
    table.add_column("jobs", min_width=14)
    for row in rows:
        jobs_text = " ".join(f"{s}={n}" for s, n in row["jobs"].items() if n) or "none"
        # A VALID environment's reason only says that it is available.
        healthy = row["environmentState"].endswith("/VALID")
        environment_text = _state_text(row["environmentState"]) + (
            f" ({row['environmentReason']})" if row["environmentReason"] and not healthy else ""
        )
        table.add_row(
            row["fleet"],
            str(row["instanceType"]),
            _state_text(row["queueState"]),
            environment_text,
            str(row["instances"] if row["instances"] is not None else "?"),
            f"{row['vcpus']} of {row['maxvCpus']}",
            jobs_text,
        )
    console().print(table)
    # Capacity waits under the table, one line per fleet that has one (trainctl/fleet/capacity.py).
    for row in rows:
        if row.get("capacity", NO_CAPACITY_WAIT) != NO_CAPACITY_WAIT:
            console().print(f"fleet {row['fleet']}: {row['capacity']}", highlight=False)


def _state_text(state_and_status: str) -> str:
    """ "ENABLED/VALID" reads "ENABLED"; anything else is shown whole."""
    state, _, status = state_and_status.partition("/")
    return state if status == "VALID" else f"{state} {status}"


# ----------------------------------------------------------------------------------------------- check
@app.command()
@reports_errors
def check(
    ctx: typer.Context,
    fleet_name: Annotated[str, typer.Argument(metavar="FLEET", help="Fleet to check.")],
    share: Annotated[str | None, typer.Option(metavar="ID", help="Fair-share identifier (fair-share queues).")] = None,
    poll_seconds: PollOption = POLL_SECONDS,
) -> None:
    """Run the fleet's all-reduce benchmark and report its verdict; exit non-zero unless healthy."""
    state = state_of(ctx)
    fleet = state.deployment().fleet(fleet_name)
    request = submit_request(
        name=f"{fleet.name}-check-{base.timestamp()}",
        queue=fleet.job_queue,
        definition=fleet.benchmark_definition,
        share=share,
    )
    check_share(state, fleet, share, new_share=False)
    job_id = str(state.batch.submit_job(**request)["jobId"])
    note(f"benchmark job {job_id} submitted to fleet {fleet.name}")
    job = follow(state, job_id, poll_seconds)
    result: dict[str, Any] = {"jobId": job_id, "fleet": fleet.name, "status": job.get("status")}
    failed = job.get("status") != "SUCCEEDED"
    if failed:
        result["statusReason"] = job.get("statusReason")
    # Read even when the job FAILED: the benchmark exits 1 after a wrong result, verdict printed.
    # Global rank 0 prints the report, and torch's c10d rendezvous gives rank 0 to the node whose address
    # sorts first (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py assigns ranks over
    # sorted(participants)), not necessarily to Batch's main node: read the main node, then the others.
    main = main_node(job)
    count = int(job.get("nodeProperties", {}).get("numNodes") or 1)
    logs = state.aws.client("logs")
    verdict = None
    for stream in node_streams(state.batch, job, [main, *(n for n in range(count) if n != main)], fleet.log_group):
        verdict = last_verdict(line.message for line in StreamReader(logs, stream).read())
        if verdict is not None:
            break
    if verdict is None:
        if failed:
            # A broken network can stop the cross-node phase before any verdict; each node named its
            # own verdict in its log first ("# node check" lines).
            reason = job.get("statusReason")
            message = f"benchmark job {job_id} FAILED: {reason}; per-node verdicts: `trainctl logs {job_id} --node all`"
            _finish_check(state, result, message, ExitCode.JOB_FAILED)
        _finish_check(
            state,
            result,
            f"benchmark job {job_id} printed no verdict line on any node: see `trainctl logs {job_id} --node all`",
            ExitCode.UNHEALTHY,
        )
        return
    result.update(
        verdict=verdict.get("verdict"),
        busbwGbps=verdict.get("busbw_gbps"),
        failingNodes=list(verdict.get("failing_nodes") or []),
        degradedNodes=list(verdict.get("degraded_nodes") or []),
        # The node(s) the benchmark's pairs phase bisected to (container/benchmark/node_bisect.py).
        slowNodes=list(verdict.get("slow_nodes") or []),
        # The benchmark's verdict line verbatim, named as docs/checkpoints.md lists its fields (data, as tags are).
        result=verdict,
    )
    summary = f"fleet {fleet.name}: {verdict_summary(verdict)}" + (
        f"; benchmark job {job_id} FAILED: {job.get('statusReason')}" if failed else ""
    )
    healthy = verdict.get("verdict") == HEALTHY and not failed
    _finish_check(state, result, summary, ExitCode.OK if healthy else ExitCode.UNHEALTHY)


def _finish_check(state: State, result: dict[str, Any], summary: str, code: ExitCode) -> None:
    if state.json:
        state.out(result)
    else:
        typer.echo(summary)
    if code is not ExitCode.OK:
        raise typer.Exit(int(code))


# ----------------------------------------------------------------------------------------------- cost
@app.command()
@reports_errors
def cost(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option(metavar="SPAN|DATE", help="Jobs created since 7d, 12h, or YYYY-MM-DD (UTC; default: 7d)."),
    ] = None,
    by: Annotated[CostGrouping, typer.Option(help="Group by fair-share identifier, queue (fleet) or job name.")] = (
        CostGrouping.queue
    ),
    price: Annotated[
        list[str] | None, typer.Option(metavar="TYPE=USD", help="Price per instance-hour to use instead of the table.")
    ] = None,
) -> None:
    """Estimated cost of finished jobs: node-hours times the on-demand price per instance-hour.

    Prices are us-east-1 on-demand list prices from config/prices.py, each with its source and date:
    an estimate, not your bill (no Savings Plans, reservations or Spot; boot and idle time not counted).
    """
    state = state_of(ctx)
    start = parse_since(since)
    overrides = parse_prices(price or [])
    usages = finished_usages(state.batch, state.deployment(), start)
    rows = summarize(usages, by=by.value, overrides=overrides)
    unpriced = unpriced_types(usages, overrides)
    if state.json:
        state.out(
            {
                "since": start.isoformat(),
                "by": by.value,
                "estimate": True,
                "rows": [r.as_dict() for r in rows],
                "unpricedInstanceTypes": unpriced,
            }
        )
        return
    table = Table(title=f"Estimated cost of jobs finished since {start:%Y-%m-%d %H:%M} UTC, by {by.value}")
    for column in (by.value, "jobs", "node-hours", "USD (estimate)"):
        table.add_column(column)
    for row in rows:
        usd = f"{row.usd:,.2f}" + (f" + {row.unpriced_node_hours:.2f} h unpriced" if row.unpriced_node_hours else "")
        table.add_row(row.key, str(row.jobs), f"{row.node_hours:.2f}", usd)
    console().print(table)
    typer.echo(
        "Estimate: node-hours x us-east-1 on-demand list price (config/prices.py, with sources and dates); "
        "not your bill."
    )
    for name in unpriced:
        typer.echo(f"No price for {name}: pass --price {name}=USD_PER_HOUR.")
