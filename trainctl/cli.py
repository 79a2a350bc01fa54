"""The `trainctl` command line (typer): one function per command, the work in the modules beside it."""

from __future__ import annotations

import enum
import functools
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from trainctl.aws import Aws, aws_errors
from trainctl.checkpoints import checkpoint_location, list_checkpoints
from trainctl.checkpoints import download as download_checkpoints
from trainctl.compute import fleet_compute
from trainctl.cost import GROUPINGS, finished_usages, parse_prices, parse_since, summarize, unpriced_types
from trainctl.deployment import Deployment, Fleet, load_deployment
from trainctl.errors import ExitCode, TrainctlError
from trainctl.jobs import DONE, describe_jobs, main_node, num_nodes, owned_job
from trainctl.jobs import watch as watch_job
from trainctl.logs import StreamReader, interleave, node_streams, parse_nodes
from trainctl.requests import (
    SWEEP_TAG,
    check_flags,
    grid_points,
    parse_env,
    parse_grid,
    point_name,
    submit_request,
)
from trainctl.status import fleet_status
from trainctl.verdict import HEALTHY, last_verdict, verdict_summary
from trainctl.why import explain

EXIT_CODES_HELP = (
    "Exit status: 0 done (check: healthy); 1 the job FAILED (submit --watch, check); 2 bad input (a flag, "
    "an unknown fleet, a job that is not ours); 3 AWS could not be asked (credentials, region, no stacks); "
    "4 check: the benchmark's verdict is not healthy."
)

app = typer.Typer(
    name="trainctl",
    help=(
        "Run, watch and account for multi-node training jobs on the fleets `cdk deploy --all` built. "
        "Everything is found from the stacks' outputs in the region: there is no configuration file. " + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help text is plain: "[n0]" is a log prefix, not rich markup.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

P = ParamSpec("P")
R = TypeVar("R")
# How often --watch, --follow and check ask Batch for news (hidden option; tests use 0).
POLL_SECONDS = 15.0
# Between polls of --follow (a test stands in for the time that passes).
_sleep = time.sleep


class JobKind(enum.StrEnum):
    training = "training"
    benchmark = "benchmark"


class CostGrouping(enum.StrEnum):
    share = "share"
    queue = "queue"
    name = "name"


assert tuple(CostGrouping) == GROUPINGS  # the option's choices are cost's groupings


class State:
    """What every command shares: the AWS session, --json, and the deployment (read once)."""

    def __init__(self, *, aws: Aws, json_output: bool) -> None:
        self.aws = aws
        self.json = json_output
        self._deployment: Deployment | None = None

    @property
    def batch(self) -> Any:
        return self.aws.client("batch")

    def deployment(self) -> Deployment:
        if self._deployment is None:
            self._deployment = load_deployment(self.aws.client("cloudformation"), self.aws.region)
        return self._deployment

    def out(self, value: Any) -> None:
        typer.echo(json.dumps(value, indent=2, default=str))


def reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Show a TrainctlError as one line on stderr and exit with its code."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with aws_errors():
                return command(*args, **kwargs)
        except TrainctlError as error:
            typer.echo(f"trainctl: {error.message}", err=True)
            raise typer.Exit(int(error.code)) from None

    return run


def _state(ctx: typer.Context) -> State:
    state = ctx.obj
    assert isinstance(state, State)  # set by the callback below
    return state


def _console() -> Console:
    # Piped or captured output gets wide tables rather than rich's 80-column default.
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def _note(message: str) -> None:
    typer.echo(message, err=True)


@app.callback()
def options(
    ctx: typer.Context,
    region: Annotated[
        str | None, typer.Option(help="AWS region of the stacks (default: AWS_REGION or the profile's region).")
    ] = None,
    profile: Annotated[str | None, typer.Option(help="AWS profile to use (default: AWS_PROFILE).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Options every command takes. AWS_ENDPOINT_URL and the rest of the AWS environment apply too."""
    ctx.obj = State(aws=Aws(region=region, profile=profile), json_output=json_output)


PollOption = Annotated[float, typer.Option("--poll-seconds", hidden=True, min=0.0)]


# ----------------------------------------------------------------------------------------------- status
@app.command()
@reports_errors
def status(ctx: typer.Context) -> None:
    """Per fleet: instance type, queue and compute environment state, instances and vCPUs, jobs by state.

    Instances: the compute environment's desired vCPUs over one instance's vCPUs (what Batch is
    scaling to now).
    """
    state = _state(ctx)
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
        healthy = row["environment_state"].endswith("/VALID")
        environment_text = _state_text(row["environment_state"]) + (
            f" ({row['environment_reason']})" if row["environment_reason"] and not healthy else ""
        )
        table.add_row(
            row["fleet"],
            str(row["instance_type"]),
            _state_text(row["queue_state"]),
            environment_text,
            str(row["instances"] if row["instances"] is not None else "?"),
            f"{row['vcpus']} of {row['max_vcpus']}",
            jobs_text,
        )
    _console().print(table)


def _state_text(state_and_status: str) -> str:
    """ "ENABLED/VALID" reads "ENABLED"; anything else is shown whole."""
    state, _, status = state_and_status.partition("/")
    return state if status == "VALID" else f"{state} {status}"


# ----------------------------------------------------------------------------------------------- submit
def _check_share(state: State, fleet: Fleet, share: str | None) -> None:
    """A fair-share queue refuses jobs without a share identifier; a FIFO queue takes none."""
    queue = fleet_compute(state.batch, fleet).queue or {}
    if queue.get("schedulingPolicyArn") and share is None:
        raise TrainctlError(
            f"fleet {fleet.name}'s queue uses fair share: pass --share ID (a deployed share identifier)"
        )
    if not queue.get("schedulingPolicyArn") and share is not None:
        raise TrainctlError(
            f"fleet {fleet.name}'s queue is first in, first out: drop --share "
            "(deploy with -c shares=... for fair share)"
        )


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def _state_line(job: dict[str, Any]) -> str:
    reason = f" ({job['statusReason']})" if job.get("statusReason") else ""
    return f"{datetime.now(UTC).strftime('%H:%M:%S')} {job.get('jobId')} {job.get('status')}{reason}"


def _follow(state: State, job_id: str, poll_seconds: float) -> dict[str, Any]:
    """Follow a job to its end, each change of state on stderr; a live spinner on a terminal."""
    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        return watch_job(state.batch, job_id, on_state=lambda j: _note(_state_line(j)), poll_seconds=poll_seconds)
    with console.status(f"{job_id}: submitted") as spinner:

        def on_state(job: dict[str, Any]) -> None:
            console.print(_state_line(job))
            spinner.update(f"{job_id}: {job.get('status')}")

        return watch_job(state.batch, job_id, on_state=on_state, poll_seconds=poll_seconds)


@app.command()
@reports_errors
def submit(
    ctx: typer.Context,
    fleet_name: Annotated[str, typer.Argument(metavar="FLEET", help="Fleet to run on (`trainctl status` lists them).")],
    job: Annotated[
        JobKind, typer.Option(help="Which job definition: the training job or the all-reduce benchmark.")
    ] = (JobKind.training),
    nodes: Annotated[int | None, typer.Option(min=1, help="Nodes (default: the job definition's).")] = None,
    env: Annotated[
        list[str] | None, typer.Option(metavar="K=V", help="Environment variable on every node; repeatable.")
    ] = None,
    timeout: Annotated[int | None, typer.Option(metavar="S", help="Seconds an attempt may run (at least 60).")] = None,
    share: Annotated[str | None, typer.Option(metavar="ID", help="Fair-share identifier (fair-share queues).")] = None,
    name: Annotated[str | None, typer.Option(help="Job name (default: <fleet>-<job>-<UTC time>).")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Follow the job's states; exit with its outcome.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the exact SubmitJob request and submit nothing.")
    ] = False,
    poll_seconds: PollOption = POLL_SECONDS,
) -> None:
    """Submit one multi-node job to a fleet's queue."""
    state = _state(ctx)
    # The flags first: a typo is reported before any AWS call.
    environment = parse_env(env or [])
    check_flags(name=name, timeout_seconds=timeout)
    fleet = state.deployment().fleet(fleet_name)
    request = submit_request(
        name=name or f"{fleet.name}-{job.value}-{_timestamp()}",
        queue=fleet.job_queue,
        definition=fleet.training_definition if job is JobKind.training else fleet.benchmark_definition,
        nodes=nodes,
        environment=environment,
        timeout_seconds=timeout,
        share=share,
    )
    _check_share(state, fleet, share)
    if dry_run:
        state.out(request)
        return
    with aws_errors():
        job_id = str(state.batch.submit_job(**request)["jobId"])
    if state.json and not watch:
        state.out({"jobId": job_id, "jobName": request["jobName"], "fleet": fleet.name})
    elif not state.json:
        typer.echo(job_id)
    if watch:
        final = _follow(state, job_id, poll_seconds)
        if state.json:
            state.out({"jobId": job_id, "status": final.get("status"), "statusReason": final.get("statusReason")})
        if final.get("status") != "SUCCEEDED":
            raise typer.Exit(int(ExitCode.JOB_FAILED))


# ----------------------------------------------------------------------------------------------- sweep
@app.command()
@reports_errors
def sweep(
    ctx: typer.Context,
    fleet_name: Annotated[str, typer.Argument(metavar="FLEET", help="Fleet to run on.")],
    grid: Annotated[
        list[str], typer.Option(metavar="K=v1,v2", help="An environment variable and its values; repeatable.")
    ],
    share: Annotated[str | None, typer.Option(metavar="ID", help="Fair-share identifier for every job.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the SubmitJob requests and submit nothing.")
    ] = False,
) -> None:
    """One multi-node training job per point of the grid, named after the point, tagged with one sweep id.

    Not an array job: AWS documents array jobs only as collections of single-node child jobs.
    """
    state = _state(ctx)
    points = grid_points(parse_grid(grid))
    fleet = state.deployment().fleet(fleet_name)
    sweep_id = f"{fleet.name}-{_timestamp()}"
    requests = [
        submit_request(
            name=point_name(fleet.name, point),
            queue=fleet.job_queue,
            definition=fleet.training_definition,
            environment=point,
            share=share,
            tags={SWEEP_TAG: sweep_id},
        )
        for point in points
    ]
    _check_share(state, fleet, share)
    if dry_run:
        state.out(requests)
        return
    submitted = []
    for request in requests:
        with aws_errors():
            job_id = str(state.batch.submit_job(**request)["jobId"])
        submitted.append({"jobName": request["jobName"], "jobId": job_id})
    if state.json:
        state.out({"sweep": sweep_id, "jobs": submitted})
        return
    table = Table(title=f"sweep {sweep_id} (tag {SWEEP_TAG})")
    table.add_column("job name")
    table.add_column("job id")
    for row in submitted:
        table.add_row(row["jobName"], row["jobId"])
    _console().print(table)


# ----------------------------------------------------------------------------------------------- logs
@app.command()
@reports_errors
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")],
    node: Annotated[str, typer.Option(metavar="all|0,2", help="Which nodes' streams.")] = "all",
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing until the job ends.")] = False,
    poll_seconds: PollOption = POLL_SECONDS / 3,
) -> None:
    """Every node's log stream, interleaved in time, each line prefixed [n0], [n1], ..."""
    state = _state(ctx)
    job, fleet = owned_job(state.batch, state.deployment(), job_id)
    chosen = parse_nodes(node, num_nodes(job))
    logs_client = state.aws.client("logs")
    readers = {s.node: StreamReader(logs_client, s) for s in node_streams(state.batch, job, chosen, fleet.log_group)}

    def show(lines: list[Any]) -> None:
        for line in lines:
            if state.json:
                typer.echo(json.dumps({"node": line.node, "timestamp": line.timestamp, "message": line.message}))
            else:
                typer.echo(line.render())

    show(interleave(r.read() for r in readers.values()))
    if not follow:
        if all(r.source.stream is None for r in readers.values()):
            _note(f"no node of job {job_id} has a log stream yet (it is {job.get('status')})")
        return
    while job.get("status") not in DONE:
        _sleep(poll_seconds)
        job = describe_jobs(state.batch, [job_id])[0]
        waiting = [n for n, r in readers.items() if r.source.stream is None]
        if waiting:
            for stream in node_streams(state.batch, job, waiting, fleet.log_group):
                readers[stream.node] = StreamReader(logs_client, stream)
        show(interleave(r.read() for r in readers.values()))


# ----------------------------------------------------------------------------------------------- why
@app.command()
@reports_errors
def why(ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")]) -> None:
    """Why a job is not running, in plain words."""
    state = _state(ctx)
    job, fleet = owned_job(state.batch, state.deployment(), job_id)
    compute = fleet_compute(state.batch, fleet)
    explanation = explain(
        job, queue=compute.queue, environment=compute.environment, instance=compute.instance, now=datetime.now(UTC)
    )
    if state.json:
        state.out({"jobId": job_id, "fleet": fleet.name, "status": explanation.status, "reasons": explanation.reasons})
        return
    typer.echo(f"{job_id} ({job.get('jobName')}) on fleet {fleet.name}: {explanation.status}")
    for reason in explanation.reasons:
        typer.echo(f"- {reason}")


# ----------------------------------------------------------------------------------------------- cancel
@app.command()
@reports_errors
def cancel(ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")]) -> None:
    """Stop a job in any state (TerminateJob: queued jobs are cancelled, running ones stopped)."""
    state = _state(ctx)
    job, fleet = owned_job(state.batch, state.deployment(), job_id)
    status_now = str(job.get("status"))
    if status_now in DONE:
        message = f"job {job_id} already ended {status_now}: nothing to cancel"
    else:
        with aws_errors():
            state.batch.terminate_job(jobId=job_id, reason="cancelled with trainctl cancel")
        message = f"job {job_id} on fleet {fleet.name} ({status_now}) is being terminated"
    if state.json:
        state.out({"jobId": job_id, "status": status_now, "terminated": status_now not in DONE})
    else:
        typer.echo(message)


# ----------------------------------------------------------------------------------------------- checkpoints
@app.command()
@reports_errors
def checkpoints(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="Job id.")],
    download: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Copy the versions the manifests name into DIR/node-<i>/.", file_okay=False),
    ] = None,
) -> None:
    """List (or download) per node the checkpoint files a training job's manifests name."""
    state = _state(ctx)
    deployment = state.deployment()
    job, fleet = owned_job(state.batch, deployment, job_id)
    bucket, prefix = checkpoint_location(job, fleet, deployment)
    s3 = state.aws.client("s3")
    files = list_checkpoints(s3, bucket, prefix)
    if not files:
        _note(
            f"no checkpoint manifests under s3://{bucket}/{prefix} yet: the launcher uploads them while and after "
            "the job runs"
        )
    if download is not None:
        download_checkpoints(s3, bucket, prefix, files, download)
    rows = [
        {
            "node": f.node,
            "file": f.name,
            "bytes": f.size,
            "modified": datetime.fromtimestamp(f.mtime_ns / 1e9, UTC).isoformat(timespec="seconds"),
            "version_id": f.version_id,
        }
        for f in files
    ]
    if state.json:
        copied_to = str(download) if download else None
        state.out({"uri": f"s3://{bucket}/{prefix}", "files": rows, "downloaded_to": copied_to})
        return
    table = Table(title=f"s3://{bucket}/{prefix} (what each node's manifest names)")
    for column in ("node", "file", "bytes", "modified", "version"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["node"]), str(row["file"]), str(row["bytes"]), str(row["modified"]), str(row["version_id"] or "-")
        )
    _console().print(table)
    if download is not None:
        typer.echo(f"{len(rows)} files copied into {download}/node-<i>/")


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
    state = _state(ctx)
    fleet = state.deployment().fleet(fleet_name)
    request = submit_request(
        name=f"{fleet.name}-check-{_timestamp()}",
        queue=fleet.job_queue,
        definition=fleet.benchmark_definition,
        share=share,
    )
    _check_share(state, fleet, share)
    with aws_errors():
        job_id = str(state.batch.submit_job(**request)["jobId"])
    _note(f"benchmark job {job_id} submitted to fleet {fleet.name}")
    job = _follow(state, job_id, poll_seconds)
    result: dict[str, Any] = {"jobId": job_id, "fleet": fleet.name, "status": job.get("status")}
    failed = job.get("status") != "SUCCEEDED"
    if failed:
        result["statusReason"] = job.get("statusReason")
    # Read even when the job FAILED: the benchmark exits 1 after a wrong result, verdict printed.
    main = main_node(job)
    streams = node_streams(state.batch, job, [main], fleet.log_group)
    verdict = last_verdict(line.message for line in StreamReader(state.aws.client("logs"), streams[0]).read())
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
            f"benchmark job {job_id} printed no verdict line on its main node: see `trainctl logs {job_id}`",
            ExitCode.UNHEALTHY,
        )
        return
    result.update(
        verdict=verdict.get("verdict"),
        busbw_gbps=verdict.get("busbw_gbps"),
        failing_nodes=list(verdict.get("failing_nodes") or []),
        degraded_nodes=list(verdict.get("degraded_nodes") or []),
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
        str | None, typer.Option(metavar="DATE", help="Jobs created since (YYYY-MM-DD, UTC; default: 7 days ago).")
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
    state = _state(ctx)
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
                "unpriced_instance_types": unpriced,
            }
        )
        return
    table = Table(title=f"Estimated cost of jobs finished since {start:%Y-%m-%d %H:%M} UTC, by {by.value}")
    for column in (by.value, "jobs", "node-hours", "USD (estimate)"):
        table.add_column(column)
    for row in rows:
        usd = f"{row.usd:,.2f}" + (f" + {row.unpriced_node_hours:.2f} h unpriced" if row.unpriced_node_hours else "")
        table.add_row(row.key, str(row.jobs), f"{row.node_hours:.2f}", usd)
    _console().print(table)
    typer.echo(
        "Estimate: node-hours x us-east-1 on-demand list price (config/prices.py, with sources and dates); "
        "not your bill."
    )
    for name in unpriced:
        typer.echo(f"No price for {name}: pass --price {name}=USD_PER_HOUR.")


def main() -> None:
    """Console script entry point."""
    app(prog_name="trainctl")
