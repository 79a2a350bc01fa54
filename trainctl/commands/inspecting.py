"""Commands that read jobs: jobs (ps), show, logs, why, checkpoints."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from trainctl.commands import base
from trainctl.commands.base import POLL_SECONDS, PollOption, State, app, console, note, reports_errors, state_of
from trainctl.deployment import Fleet
from trainctl.display import human_size, parse_since, styled_state, when
from trainctl.errors import ExitCode, TrainctlError
from trainctl.fleet.compute import fleet_compute
from trainctl.fleet.cost import price_per_hour, usage_of
from trainctl.inspecting import listing, stragglers
from trainctl.inspecting.checkpoints import checkpoint_location, lineage_id, list_checkpoints, ready_folder
from trainctl.inspecting.checkpoints import download as download_checkpoints
from trainctl.inspecting.following import LogFollower, follow_to_end, new_stream_line, stopped_following
from trainctl.inspecting.handles import JOB_HELP, owned
from trainctl.inspecting.lineage import follow, lineage_lines
from trainctl.inspecting.listing import COLUMN_NAMES, JobFilter, list_jobs, parse_columns, parse_states, table_lines
from trainctl.inspecting.logs import LogLine, parse_nodes
from trainctl.inspecting.recovery import log_group, log_tail
from trainctl.inspecting.showing import node_rows
from trainctl.inspecting.why import explain
from trainctl.jobs import DONE, describe_jobs, main_node, node_job_id, num_nodes

# `jobs` lists jobs created this recently unless --since says otherwise.
DEFAULT_SINCE = timedelta(days=7)


# ----------------------------------------------------------------------------------------------- jobs
@app.command()
@reports_errors
def jobs(
    ctx: typer.Context,
    fleet: Annotated[str | None, typer.Option(help="Only this fleet's queue.")] = None,
    state_filter: Annotated[
        list[str] | None, typer.Option("--state", metavar="STATE", help="RUNNING, FAILED, ... (repeatable, or a,b).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(metavar="SPAN|DATE", help="Created since 30m, 12h, 7d, 2w or a date (default 7d).")
    ] = None,
    sweep: Annotated[str | None, typer.Option(metavar="TAG", help="Only the jobs of this sweep.")] = None,
    name: Annotated[str | None, typer.Option(metavar="PREFIX", help="Only jobs whose name starts so.")] = None,
    limit: Annotated[int, typer.Option(min=0, help="At most this many, newest first (0: all).")] = 50,
    wide: Annotated[bool, typer.Option("--wide", help="Every column, whole names: full id, started, ...")] = False,
    chosen: Annotated[
        str | None, typer.Option("--columns", "-o", metavar="COL,COL", help="These columns: " + ", ".join(COLUMN_NAMES))
    ] = None,
) -> None:
    """The deployment's jobs, newest first: short id, name, fleet, state, nodes, age (--wide: every column).

    The default columns fit 80 columns (or a wider terminal): a long name keeps its start and end around "…".
    --wide, -o and --json show whole names; ids are never cut and can be copied into the next command.
    """
    state = state_of(ctx)
    shown = parse_columns(chosen, wide=wide)
    wanted = JobFilter(
        since=parse_since(since, default=DEFAULT_SINCE),
        fleet=fleet,
        states=parse_states(state_filter or []),
        sweep=sweep,
        name_prefix=name,
        limit=limit,
    )
    now_ms = int(time.time() * 1000)
    rows = list_jobs(state.batch, state.deployment(), wanted, now_ms=now_ms)
    if state.json:
        state.out(rows)
        return
    if not rows:
        note("no jobs match: widen --since (default 7d) or drop a filter")
        return
    out = console()
    fit = None if wide or chosen else max(listing.FIT_COLUMNS, out.width) if out.is_terminal else listing.FIT_COLUMNS
    for line in table_lines(rows, shown, now_ms=now_ms, fit=fit):
        out.print(line, soft_wrap=True, overflow="ignore", crop=False)


app.command(name="ps", help="Same as `jobs`.")(jobs)


# ----------------------------------------------------------------------------------------------- show
@app.command()
@reports_errors
def show(ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="JOB", help=JOB_HELP)]) -> None:
    """Everything about one job: each node's instance, AZ, state, exit code and reason per attempt, its log
    streams, its checkpoints, its cost, and the jobs the capacity fallback resubmitted it as (its lineage)."""
    state = state_of(ctx)
    deployment = state.deployment()
    job_id, job, fleet = owned(state.batch, deployment, job_id)
    compute = fleet_compute(state.batch, fleet)
    cluster = (compute.environment or {}).get("ecsClusterArn")
    nodes = node_rows(state.batch, state.aws.client("ecs"), job, cluster, note)
    slow = straggler_notes(state, job)
    usage = usage_of(job, fleet=fleet.name, instance_type=compute.instance_type or "unknown")
    price = price_per_hour(usage.instance_type, {}) if usage else None
    bucket, prefix = checkpoint_location(job, fleet, deployment)
    files = list_checkpoints(state.aws.client("s3"), bucket, prefix)
    lineage = follow(state.batch, job)
    result: dict[str, Any] = {
        "jobId": job_id,
        "name": job.get("jobName"),
        "fleet": fleet.name,
        "status": job.get("status"),
        "statusReason": job.get("statusReason"),
        "share": job.get("shareIdentifier"),
        "tags": job.get("tags") or {},
        "createdAt": job.get("createdAt"),
        "startedAt": job.get("startedAt"),
        "stoppedAt": job.get("stoppedAt"),
        "numNodes": num_nodes(job),
        "nodes": nodes,
        "stragglers": slow,
        "checkpoints": {"uri": f"s3://{bucket}/{prefix}", "files": len(files), "bytes": sum(f.size for f in files)},
        "lineage": {"id": lineage_id(job), "jobs": lineage.summary(), "latest": lineage.latest.get("jobId")},
        "nodeHours": round(usage.node_hours, 4) if usage else None,
        "usdEstimate": round(usage.node_hours * price, 2) if usage and price is not None and job.get("status") in DONE
        else None,
    }  # fmt: skip
    if state.json:
        state.out(result)
        return
    out = console()
    reason = f" ({result['statusReason']})" if result["statusReason"] else ""
    out.print(f"{job_id} {result['name']} on fleet {fleet.name}: {styled_state(str(result['status']))}{reason}")
    out.print(
        f"created {when(result['createdAt'])}, started {when(result['startedAt'])}, "
        f"stopped {when(result['stoppedAt'])}; share {result['share'] or '-'}; "
        f"sweep {result['tags'].get('trainctl:sweep', '-')}"
    )
    for line in lineage_lines(lineage, job_id):
        out.print(line)
    table = Table(title=f"{result['numNodes']} nodes")
    for column in ("node", "state", "attempt", "instance", "AZ", "exit", "reason", "log stream"):
        table.add_column(column)
    for row in nodes:
        attempts = row["attempts"] or [{}]
        for attempt in attempts:
            table.add_row(
                str(row["node"]),
                styled_state(str(row["state"])),
                str(attempt.get("attempt", "-")),
                str(attempt.get("instance") or "-"),
                str(attempt.get("az") or "-"),
                str(attempt.get("exitCode") if attempt.get("exitCode") is not None else "-"),
                str(attempt.get("reason") or "-"),
                str(attempt.get("logStream") or "-"),
            )
    out.print(table)
    for line in slow:
        out.print(f"straggler: {line}")
    checkpoints = result["checkpoints"]
    out.print(f"checkpoints: {checkpoints['files']} files, {human_size(checkpoints['bytes'])} in {checkpoints['uri']}")
    if usage is not None:
        usd = f"~{result['usdEstimate']:,.2f} USD" if result["usdEstimate"] is not None else "no price"
        out.print(f"cost: {usage.node_hours:.2f} node-hours of {usage.instance_type}, {usd} (estimate)")


# ----------------------------------------------------------------------------------------------- logs
@app.command()
@reports_errors
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help=JOB_HELP)],
    node: Annotated[str, typer.Option(metavar="all|0,2", help="Which nodes' streams.")] = "all",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends; exit 1 if it ended FAILED.")
    ] = False,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="Each line with its UTC time.")] = False,
    poll_seconds: PollOption = POLL_SECONDS / 3,
) -> None:
    """Every node's log stream, interleaved in time, each line prefixed [n0], [n1], ..."""
    state = state_of(ctx)
    job_id, job, fleet = owned(state.batch, state.deployment(), job_id)
    chosen = parse_nodes(node, num_nodes(job))
    follower = LogFollower(
        state.batch, state.aws.client("logs"), fleet.log_group, nodes=chosen,
        on_new_stream=lambda stream: note(new_stream_line(stream)),
    )  # fmt: skip
    show_lines = functools.partial(print_lines, as_json=state.json, timestamps=timestamps)
    first = follower.poll(job)
    show_lines(first)
    if not follow:
        if not follower.any_stream:
            note(f"no node of job {job_id} has a log stream yet (it is {job.get('status')})")
        return
    if job.get("status") in DONE:
        # Nothing more will come: say so rather than end in silence.
        shown = "its logs are above" if first else "its nodes wrote no log lines"
        note(f"job {job_id} already ended {job.get('status')}: {shown}; nothing more to follow")
    else:
        with goes_on_if_interrupted(job_id):
            job = follow_to_end(state.batch, follower, job_id, show=show_lines, poll_seconds=poll_seconds,
                                sleep=base.sleep)  # fmt: skip
    # As submit --watch: the exit status says how the followed job ended.
    if job.get("status") != "SUCCEEDED":
        raise typer.Exit(int(ExitCode.JOB_FAILED))


def print_lines(lines: list[LogLine], *, as_json: bool, timestamps: bool = False) -> None:
    for line in lines:
        if as_json:
            typer.echo(json.dumps({"node": line.node, "timestamp": line.timestamp, "message": line.message}))
        elif timestamps:
            stamp = datetime.fromtimestamp(line.timestamp / 1000, UTC).isoformat(timespec="milliseconds")
            typer.echo(f"{stamp.replace('+00:00', 'Z')} {line.render()}")
        else:
            typer.echo(line.render())


@contextmanager
def goes_on_if_interrupted(job_id: str) -> Iterator[None]:
    """Ctrl-C while following stops the following, never the job: one line saying so, exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        note(stopped_following(job_id))
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def follow_launched(
    state: State,
    fleet: Fleet,
    job_id: str,
    job_name: str,
    *,
    poll_seconds: float,
    on_state: Callable[[dict[str, Any]], None],
) -> None:
    """submit/run --follow: every node's log, prefixed by node, until the job ends (each state on stderr
    through `on_state`), then why's summary; exits 0 when it SUCCEEDED, 1 (JOB_FAILED) when it FAILED. First
    the job id; with --json, stdout is JSON Lines: the submission, each log line as `logs --json` prints it,
    then why's answer."""
    submitted = {"jobId": job_id, "jobName": job_name, "fleet": fleet.name}
    typer.echo(json.dumps(submitted) if state.json else job_id)
    follower = LogFollower(state.batch, state.aws.client("logs"), fleet.log_group,
                           on_new_stream=lambda stream: note(new_stream_line(stream)))  # fmt: skip
    show_lines = functools.partial(print_lines, as_json=state.json)
    with goes_on_if_interrupted(job_id):
        job = follow_to_end(state.batch, follower, job_id, show=show_lines, poll_seconds=poll_seconds,
                            sleep=base.sleep, on_state=on_state)  # fmt: skip
    answer = why_answer(state, job_id, job, fleet)
    if state.json:
        typer.echo(json.dumps(answer, default=str))
    else:
        for line in why_lines(answer, job):
            typer.echo(line)
    if job.get("status") != "SUCCEEDED":
        raise typer.Exit(int(ExitCode.JOB_FAILED))


# ----------------------------------------------------------------------------------------------- why
@app.command()
@reports_errors
def why(ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="JOB", help=JOB_HELP)]) -> None:
    """Why a job is not running, in plain words; a job the capacity fallback resubmitted names its successor."""
    state = state_of(ctx)
    job_id, job, fleet = owned(state.batch, state.deployment(), job_id)
    answer = why_answer(state, job_id, job, fleet)
    if state.json:
        state.out(answer)
        return
    for line in why_lines(answer, job):
        typer.echo(line)


def why_answer(state: State, job_id: str, job: dict[str, Any], fleet: Fleet) -> dict[str, Any]:
    """What `why --json` prints (and `why_lines` words): the job's status, the reasons, its lineage."""
    compute = fleet_compute(state.batch, fleet)
    explanation = explain(
        job,
        queue=compute.queue,
        environment=compute.environment,
        instance=compute.instance,
        now=datetime.now(UTC),
        # Each failed attempt's node line, read from the end of its log stream (trainctl/inspecting/recovery.py).
        tail=log_tail(state.aws.client("logs")),
    )
    lineage = follow(state.batch, job)
    return {
        "jobId": job_id,
        "fleet": fleet.name,
        "status": explanation.status,
        # Last: the slow nodes its straggler watch named (trainctl/inspecting/stragglers.py).
        "reasons": lineage_lines(lineage, job_id) + explanation.reasons + straggler_notes(state, job),
        "lineage": lineage.summary(),
    }


def straggler_notes(state: State, job: dict[str, Any]) -> list[str]:
    """The slow nodes the job's straggler watch named, from the main node's log stream of each attempt."""
    group = log_group(job)
    if group is None or job.get("status") not in ("RUNNING", "SUCCEEDED", "FAILED"):
        return []
    main = None
    if "nodeProperties" in job:
        try:
            found = describe_jobs(state.batch, [node_job_id(str(job["jobId"]), main_node(job))])
        except TrainctlError as error:  # the rest of the answer stands without the running attempt's stream
            note(f"the running attempt's log is not searched for stragglers: {error.message}")
            found = []
        main = found[0] if found else None
    return stragglers.notes(stragglers.main_streams(job, main), group, stragglers.log_finder(state.aws.client("logs")))


def why_lines(answer: dict[str, Any], job: dict[str, Any]) -> list[str]:
    head = f"{answer['jobId']} ({job.get('jobName')}) on fleet {answer['fleet']}: {answer['status']}"
    return [head, *(f"- {reason}" for reason in answer["reasons"])]


# ----------------------------------------------------------------------------------------------- checkpoints
@app.command()
@reports_errors
def checkpoints(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help=JOB_HELP)],
    download: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Copy the versions the manifests name into DIR/node-<i>/.", file_okay=False),
    ] = None,
) -> None:
    """List (or download) per node the checkpoint files a training job's manifests name (its lineage's: the same
    for a job and the jobs the capacity fallback resubmitted it as)."""
    state = state_of(ctx)
    if download is not None:
        ready_folder(download)
    deployment = state.deployment()
    job_id, job, fleet = owned(state.batch, deployment, job_id)
    bucket, prefix = checkpoint_location(job, fleet, deployment)
    s3 = state.aws.client("s3")
    files = list_checkpoints(s3, bucket, prefix)
    if not files:
        note(
            f"no checkpoint manifests under s3://{bucket}/{prefix} yet: the launcher uploads them while and after "
            "the job runs"
        )
    if download is not None:
        total = sum(f.size for f in files)
        columns = (*Progress.get_default_columns()[:1], BarColumn(), DownloadColumn(binary_units=True),
                   TransferSpeedColumn())  # fmt: skip
        # On stderr, and only where it is a terminal (rich draws nothing otherwise).
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(f"{len(files)} files", total=total)
            download_checkpoints(s3, bucket, prefix, files, download, lambda n: progress.advance(task, n))
    rows: list[dict[str, Any]] = [
        {
            "node": f.node,
            "file": f.name,
            "bytes": f.size,
            "modified": datetime.fromtimestamp(f.mtime_ns / 1e9, UTC).isoformat(timespec="seconds"),
            "versionId": f.version_id,
        }
        for f in files
    ]
    if state.json:
        copied_to = str(download) if download else None
        state.out({"uri": f"s3://{bucket}/{prefix}", "files": rows, "downloadedTo": copied_to})
        return
    table = Table(title=f"s3://{bucket}/{prefix} (what each node's manifest names)")
    for column in ("node", "file", "size", "modified", "version"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["node"]),
            str(row["file"]),
            human_size(int(row["bytes"])),
            str(row["modified"]),
            str(row["versionId"] or "-"),
        )
    console().print(table)
    if download is not None:
        size = human_size(sum(int(r["bytes"]) for r in rows))
        typer.echo(f"{len(rows)} files ({size}) copied into {download}/node-<i>/")
