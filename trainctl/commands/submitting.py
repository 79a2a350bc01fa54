"""Commands that start jobs: submit, run (a task file), sweep."""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from trainctl.commands import base
from trainctl.commands.base import POLL_SECONDS, PollOption, State, app, console, note, reports_errors, state_of
from trainctl.commands.inspecting import follow_launched
from trainctl.deployment import Fleet
from trainctl.errors import ExitCode, TrainctlError, clip_path
from trainctl.fleet.compute import fleet_compute
from trainctl.fleet.plugin_knobs import gin_refusal, plugin_knob_warning
from trainctl.inspecting.following import check_follow
from trainctl.jobs import watch as watch_job
from trainctl.submitting import estimate
from trainctl.submitting.estimate import ASK_ABOVE_USD, HoursOption, TeamOption, YesOption, before_submit, hours_timeout
from trainctl.submitting.preflight import (
    FLAGS,
    SWEEP,
    Inputs,
    capacity,
    check_nodes,
    describe_definition,
    retry_with_attempts,
)
from trainctl.submitting.preflight import check_share as check_share_of
from trainctl.submitting.requests import (
    SWEEP_TAG,
    check_flags,
    grid_points,
    parse_env,
    parse_env_file,
    parse_grid,
    point_name,
    submit_request,
)
from trainctl.submitting.revisions import job_definition
from trainctl.submitting.secrets import (
    AllowEnvSecretsOption,
    SecretOption,
    check_covered,
    deployment_access,
    parse_secrets,
    refuse_env_file_secrets,
    refuse_in_both,
    refuse_secret_looking,
)
from trainctl.submitting.taskfile import MAX_ATTEMPTS, Task, load_task, make_task
from trainctl.submitting.workdir import check_definition_script
from trainctl.submitting.workdir import environment as workdir_environment
from trainctl.submitting.workdir import prepare as prepare_workdir
from trainctl.submitting.workdir import stage as stage_workdir

# sweep asks before submitting more jobs than this (each one is a whole multi-node job).
SWEEP_CAP = 20


class JobKind(enum.StrEnum):
    training = "training"
    benchmark = "benchmark"


def check_share(state: State, fleet: Fleet, share: str | None, *, new_share: bool) -> None:
    queue = fleet_compute(state.batch, fleet).queue or {}
    check_share_of(state.batch, fleet, queue, share, new_share=new_share)


def _state_line(job: dict[str, Any]) -> str:
    reason = f" ({job['statusReason']})" if job.get("statusReason") else ""
    return f"{datetime.now(UTC).strftime('%H:%M:%S')} {job.get('jobId')} {job.get('status')}{reason}"


def follow(state: State, job_id: str, poll_seconds: float) -> dict[str, Any]:
    """Follow a job to its end, each change of state on stderr; a live spinner on a terminal."""
    err = Console(stderr=True, highlight=False)
    if not err.is_terminal:
        return watch_job(state.batch, job_id, on_state=lambda j: note(_state_line(j)), poll_seconds=poll_seconds)
    with err.status(f"{job_id}: submitted") as spinner:

        def on_state(job: dict[str, Any]) -> None:
            err.print(_state_line(job))
            spinner.update(f"{job_id}: {job.get('status')}")

        return watch_job(state.batch, job_id, on_state=on_state, poll_seconds=poll_seconds)


def build_request(
    state: State,
    task: Task,
    *,
    new_share: bool,
    dry_run: bool,
    inputs: Inputs = FLAGS,
    check: Callable[[Fleet, dict[str, Any]], object] | None = None,
) -> tuple[Fleet, dict[str, Any]]:
    """The SubmitJob request for a task, after every refusal that needs no submission: the fleet's
    capacity, the share, `check` (the price and the budget: trainctl/submitting/estimate.py), and only then the
    job definition revision that carries the job (trainctl/submitting/revisions.py) and the workdir's upload,
    so that a refused or declined job leaves neither behind. `inputs` says whether the task came from options or
    a task file, for the refusals to name the right one."""
    check_flags(name=task.name, timeout_seconds=task.timeout)
    packed = prepare_workdir(task)
    fleet = state.deployment().fleet(task.fleet)
    access = deployment_access(state.aws.client("cloudformation")) if task.secrets else None
    if access:
        check_covered(task.secrets, access)
    deployed = fleet.training_definition if task.job == "training" else fleet.benchmark_definition
    definition = describe_definition(state.batch, deployed)
    if packed:
        check_definition_script(packed, task.command or [], definition)
    compute = fleet_compute(state.batch, fleet)
    nodes = task.nodes or int(definition.get("nodeProperties", {}).get("numNodes") or 1)
    check_nodes(fleet, nodes, capacity(compute, definition), inputs=inputs)
    check_share_of(state.batch, fleet, compute.queue or {}, task.share, new_share=new_share, inputs=inputs)
    bucket = state.deployment().dataset_bucket
    environment = {**task.env, **workdir_environment(bucket or "", packed, task.setup)}
    if warning := plugin_knob_warning(definition, task.env):
        note(warning)
    if refusal := gin_refusal(definition, task.env):
        raise TrainctlError(refusal)
    request = submit_request(
        name=task.name or f"{fleet.name}-{task.job}-{base.timestamp()}",
        queue=fleet.job_queue,
        definition=deployed,
        nodes=task.nodes,
        environment=environment,
        timeout_seconds=task.timeout,
        share=task.share,
        command=task.full_command(),
        retry_strategy=retry_with_attempts(definition, task.attempts) if task.attempts else None,
    )
    # The job's own image, command, environment and nodes go into a revision it runs on, so that DescribeJobs
    # shows them whether or not it merges the overrides in (trainctl/submitting/revisions.py); its secrets too,
    # which only a definition can carry. Described, not registered, until the checks pass (a revision that
    # exists is named by its ARN).
    revision = functools.partial(job_definition, state.batch, definition, image=task.image, nodes=task.nodes,
                                 command=task.full_command(), environment=environment, secrets=task.secrets,
                                 execution_role=access.execution_role if access else None)  # fmt: skip
    request["jobDefinition"] = revision(register=False)
    if check is not None:
        check(fleet, request)
    if packed:  # stored before the revision is registered: it and the request pin the version stored
        note(stage_workdir(packed, bucket=bucket, s3=state.aws.client("s3"), dry_run=dry_run,
                           environment=environment, request=request))  # fmt: skip
    if not dry_run:
        request["jobDefinition"] = revision(register=True)
    return fleet, request


def _submit_and_report(
    state: State, fleet: Fleet, request: dict[str, Any], *, watch: bool, poll: float, follow_logs: bool = False
) -> None:
    job_id = str(state.batch.submit_job(**request)["jobId"])
    if follow_logs:
        # As often as `logs -f` polls: a third of --watch's interval.
        follow_launched(state, fleet, job_id, request["jobName"], poll_seconds=poll / 3,
                        on_state=lambda job: note(_state_line(job)))  # fmt: skip
        return
    if state.json and not watch:
        state.out({"jobId": job_id, "jobName": request["jobName"], "fleet": fleet.name})
    elif not state.json:
        typer.echo(job_id)
    if watch:
        final = follow(state, job_id, poll)
        if state.json:
            state.out({"jobId": job_id, "status": final.get("status"), "statusReason": final.get("statusReason")})
        if final.get("status") != "SUCCEEDED":
            raise typer.Exit(int(ExitCode.JOB_FAILED))


WatchOption = Annotated[bool, typer.Option("--watch", help="Follow the job's states; exit with its outcome.")]
FollowOption = Annotated[
    bool,
    typer.Option(
        "--follow",
        "-f",
        help="Print every node's log, prefixed [n0], [n1], ..., until the job ends (its states on stderr, as --watch), "
        "then `why`'s summary; exit 0 if it SUCCEEDED, 1 if it FAILED. Ctrl-C stops following, not the job.",
    ),
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the exact SubmitJob request; submit nothing.")]
EnvFileOption = Annotated[
    Path | None,
    typer.Option(
        "--env-file", metavar="FILE", help="NAME=VALUE lines for every node (# comments); the job's own env wins."
    ),
]
NewShareOption = Annotated[
    bool, typer.Option("--new-share", help="Allow a share identifier the queue's fair-share policy does not list.")
]


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
        list[str] | None, typer.Option(metavar="NAME=VALUE", help="Environment variable on every node; repeatable.")
    ] = None,
    env_file: EnvFileOption = None,
    secret: SecretOption = None,
    allow_env_secrets: AllowEnvSecretsOption = False,
    timeout: Annotated[
        int | None, typer.Option(metavar="SECONDS", help="Seconds an attempt may run (60 to 2147483647).")
    ] = None,
    share: Annotated[str | None, typer.Option(metavar="ID", help="Fair-share identifier (fair-share queues).")] = None,
    name: Annotated[str | None, typer.Option(help="Job name (default: <fleet>-<job>-<UTC time>).")] = None,
    command: Annotated[
        str | None, typer.Option(metavar="CMD", help="Command on every node, after the launcher (shell words).")
    ] = None,
    no_launcher: Annotated[bool, typer.Option("--no-launcher", help="Run --command without the launcher.")] = False,
    image: Annotated[
        str | None, typer.Option(help="Another image (registers a job definition revision, see docs/jobs.md).")
    ] = None,
    attempts: Annotated[
        int | None, typer.Option(min=1, max=MAX_ATTEMPTS, help="Attempts (infrastructure failures only).")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="A folder every node fetches and runs --command in (docs/workdir.md)."),
    ] = None,
    setup: Annotated[
        str | None,
        typer.Option(metavar="CMD", help="A shell command every node runs before training (docs/workdir.md)."),
    ] = None,
    new_share: NewShareOption = False,
    watch: WatchOption = False,
    follow_logs: FollowOption = False,
    dry_run: DryRunOption = False,
    hours: HoursOption = None,
    team: TeamOption = None,
    yes: YesOption = False,
    poll_seconds: PollOption = POLL_SECONDS,
) -> None:
    """Submit one multi-node job to a fleet's queue."""
    state = state_of(ctx)
    check_follow(follow_logs, dry_run=dry_run)
    # The flags first: a typo is reported before any AWS call.
    from_file = parse_env_file(env_file) if env_file else {}
    from_flags = parse_env(env or [])
    if not allow_env_secrets:
        refuse_env_file_secrets(from_file, env_file)
        refuse_secret_looking(from_flags, named=lambda name: f"--env {name}")
    environment = from_file | from_flags
    secrets = parse_secrets(secret or [])
    refuse_in_both(environment, secrets, named="--secret")
    check_flags(name=name, timeout_seconds=timeout)
    estimate.one_timeout(hours, timeout, named="--timeout")
    task = _task(
        fleet=fleet_name, job=job.value, nodes=nodes, name=name, command=command, launcher=not no_launcher,
        image=image, env=environment, share=share, timeout=timeout, attempts=attempts, workdir=workdir, setup=setup,
        secrets=secrets or None, allow_env_secrets=allow_env_secrets or None,
    )  # fmt: skip
    check = _checker(state, hours=hours, team=team, yes=yes, dry_run=dry_run)
    fleet, request = build_request(state, task, new_share=new_share, dry_run=dry_run, check=check)
    if dry_run:
        state.out(request)
        return
    _submit_and_report(state, fleet, request, watch=watch, poll=poll_seconds, follow_logs=follow_logs)


def _checker(
    state: State, *, hours: float | None, team: str | None, yes: bool, dry_run: bool
) -> Callable[[Fleet, dict[str, Any]], object]:
    """build_request's check: the price line, the budget's refusal and the question (trainctl.submitting.estimate)."""
    return lambda fleet, request: before_submit(
        state, fleet, [request], hours=hours, team=team, yes=yes, dry_run=dry_run
    )


def _task(**fields: Any) -> Task:
    """A Task from submit's options: the same checks as a task file's fields."""
    return make_task({k: v for k, v in fields.items() if v is not None}, where="--")


@app.command()
@reports_errors
def run(
    ctx: typer.Context,
    task_file: Annotated[Path, typer.Argument(metavar="TASK.yaml", help="The job, described in a YAML file.")],
    env_file: EnvFileOption = None,
    allow_env_secrets: AllowEnvSecretsOption = False,
    new_share: NewShareOption = False,
    watch: WatchOption = False,
    follow_logs: FollowOption = False,
    dry_run: DryRunOption = False,
    hours: HoursOption = None,
    team: TeamOption = None,
    yes: YesOption = False,
    poll_seconds: PollOption = POLL_SECONDS,
) -> None:
    """Submit the job a task file describes: fleet (required), job, nodes, name, command, launcher, image,
    env, secrets, allow_env_secrets, share, timeout, attempts, workdir, setup (docs/jobs.md, docs/workdir.md)."""
    state = state_of(ctx)
    check_follow(follow_logs, dry_run=dry_run)
    task = load_task(task_file, allow_env_secrets=allow_env_secrets)
    estimate.one_timeout(hours, task.timeout, named=f"{clip_path(task_file)}'s timeout:")
    if env_file:
        from_file = parse_env_file(env_file)
        if not (allow_env_secrets or task.allow_env_secrets):
            refuse_env_file_secrets(from_file, env_file)
        refuse_in_both(from_file, task.secrets, named=f"{clip_path(task_file)}: secret")
        task = task.model_copy(update={"env": from_file | task.env})
    check = _checker(state, hours=hours, team=team, yes=yes, dry_run=dry_run)
    fleet, request = build_request(
        state, task, new_share=new_share, dry_run=dry_run, inputs=Inputs(task_file=str(task_file)), check=check
    )
    if dry_run:
        state.out(request)
        return
    _submit_and_report(state, fleet, request, watch=watch, poll=poll_seconds, follow_logs=follow_logs)


@app.command()
@reports_errors
def sweep(
    ctx: typer.Context,
    fleet_name: Annotated[str, typer.Argument(metavar="FLEET", help="Fleet to run on.")],
    grid: Annotated[
        list[str], typer.Option(metavar="NAME=V1,V2", help="An environment variable and its values; repeatable.")
    ],
    share: Annotated[str | None, typer.Option(metavar="ID", help="Fair-share identifier for every job.")] = None,
    env_file: EnvFileOption = None,
    allow_env_secrets: AllowEnvSecretsOption = False,
    new_share: NewShareOption = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help=f"Submit without asking (over {SWEEP_CAP} jobs, or over ${ASK_ABOVE_USD:,.0f} at most)."
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the SubmitJob requests and submit nothing.")
    ] = False,
    hours: HoursOption = None,
    team: TeamOption = None,
) -> None:
    """One multi-node training job per point of the grid, named after the point, tagged with one sweep id.

    Not an array job: AWS documents array jobs only as collections of single-node child jobs.
    """
    state = state_of(ctx)
    if hours is not None:
        hours_timeout(hours)
    parsed = parse_grid(grid)
    common = parse_env_file(env_file) if env_file else {}
    if not allow_env_secrets:
        refuse_env_file_secrets(common, env_file)
        refuse_secret_looking((name for name, _ in parsed), named=lambda name: f"--grid {name}")
    points = grid_points(parsed)
    fleet, template = build_request(
        state,
        make_task({"fleet": fleet_name, "share": share}, where="--"),
        new_share=new_share,
        dry_run=dry_run,
        inputs=SWEEP,
    )
    sweep_id = f"{fleet.name}-{base.timestamp()}"
    # Each point's environment goes into the revision its job runs on (trainctl/submitting/revisions.py).
    revision = functools.partial(
        job_definition, state.batch, describe_definition(state.batch, template["jobDefinition"])
    )
    requests = [
        submit_request(
            name=point_name(fleet.name, point),
            queue=fleet.job_queue,
            definition=revision(environment=common | point, register=False),
            environment=common | point,
            share=share,
            tags={SWEEP_TAG: sweep_id},
        )
        for point in points
    ]
    if dry_run:
        before_submit(state, fleet, requests, hours=hours, team=team, yes=yes, dry_run=True)
        state.out(requests)
        return
    if len(requests) > SWEEP_CAP and not yes:
        question = f"Submit {len(requests)} multi-node jobs to fleet {fleet.name}?"
        if not sys.stdin.isatty():
            raise TrainctlError(
                f"sweep of {len(requests)} jobs is over {SWEEP_CAP}: pass --yes to submit them all (or --dry-run)"
            )
        if not typer.confirm(question):
            raise typer.Exit(int(ExitCode.USAGE))
    # --yes answers both questions: the sweep's size and its price.
    before_submit(state, fleet, requests, hours=hours, team=team, yes=yes, dry_run=False)
    submitted = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task_id = progress.add_task(f"sweep {sweep_id}", total=len(requests))
        for request, point in zip(requests, points, strict=True):
            request["jobDefinition"] = revision(environment=common | point, register=True)
            job_id = str(state.batch.submit_job(**request)["jobId"])
            submitted.append({"jobName": request["jobName"], "jobId": job_id})
            progress.advance(task_id)
    if state.json:
        state.out({"sweep": sweep_id, "jobs": submitted})
        return
    table = Table(title=f"sweep {sweep_id} (tag {SWEEP_TAG}): `trainctl jobs --sweep {sweep_id}`")
    table.add_column("job name")
    table.add_column("job id")
    for row in submitted:
        table.add_row(row["jobName"], row["jobId"])
    console().print(table)
