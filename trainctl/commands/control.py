"""Commands that act on running jobs: cancel, exec."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from typing import Annotated, Any

import typer

from config.job_events import TRAINCTL_CANCEL_REASON
from trainctl.commands.base import State, app, note, reports_errors, state_of
from trainctl.display import parse_since
from trainctl.errors import ExitCode, TrainctlError
from trainctl.fleet.capacity import CAPACITY_CANCEL
from trainctl.fleet.compute import fleet_compute
from trainctl.inspecting import ecs_exec
from trainctl.inspecting.ecs_exec import run_plugins
from trainctl.inspecting.handles import JOB_HELP, RECENT_TEXT, UNFINISHED, Handles, owned, short_ids, unfinished_jobs
from trainctl.inspecting.lineage import follow
from trainctl.inspecting.listing import JobFilter, list_jobs
from trainctl.jobs import DONE, owned_job


@app.command()
@reports_errors
def cancel(
    ctx: typer.Context,
    job_ids: Annotated[list[str] | None, typer.Argument(metavar="JOB...", help=JOB_HELP)] = None,
    sweep: Annotated[str | None, typer.Option(metavar="TAG", help="Every unfinished job of this sweep.")] = None,
    name: Annotated[
        str | None, typer.Option(metavar="NAME", help="Every queued or running job with exactly this name.")
    ] = None,
    all_jobs: Annotated[
        bool, typer.Option("--all", help="Every queued or running job of this deployment (asks first on a terminal).")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Cancel --all without asking.")] = False,
) -> None:
    """Stop jobs in any state (TerminateJob: queued jobs are cancelled, running ones stopped).

    A job the capacity fallback resubmitted is followed to its successor: cancelling either id stops the
    lineage's live job. The job-alert rule ignores jobs ended this way: their reason says trainctl
    cancelled them.
    """
    if not job_ids and not (sweep or name or all_jobs):
        raise TrainctlError("cancel needs job ids (or prefixes, or names), --name NAME, --sweep TAG or --all")
    if all_jobs and (job_ids or sweep or name):
        raise TrainctlError("cancel --all takes no JOB, --sweep or --name: it already means every job")
    state = state_of(ctx)
    handles = Handles(state.batch, state.deployment(), now_ms=int(time.time() * 1000))
    ids = [handles.job_id(handle) for handle in job_ids or []]
    if all_jobs:
        ids = _confirmed(unfinished_jobs(state.batch, state.deployment()), yes=yes)
    if name:
        found = [str(s["jobId"]) for s in unfinished_jobs(state.batch, state.deployment(), name=name)]
        if not found:
            note(f"--name {name}: no queued or running job of this deployment has this name")
        ids += found
    if sweep:
        running = frozenset(UNFINISHED)
        wanted = JobFilter(since=parse_since(RECENT_TEXT, default=timedelta(0)), sweep=sweep, states=running)
        now_ms = int(time.time() * 1000)
        found = [str(r["jobId"]) for r in list_jobs(state.batch, state.deployment(), wanted, now_ms=now_ms)]
        if not found:
            note(f"--sweep {sweep}: no unfinished job created in the last {RECENT_TEXT} has this sweep tag")
        ids += found
    results = []
    stopped: set[str] = set()
    for job_id in dict.fromkeys(ids):
        job, fleet = owned_job(state.batch, state.deployment(), job_id)
        status_now = str(job.get("status"))
        lineage = follow(state.batch, job)
        # Only this deployment's jobs, whatever the tags say.
        live = [
            j
            for j in lineage.live
            if str(j["jobId"]) not in stopped and state.deployment().fleet_of_queue(str(j.get("jobQueue", "")))
        ]
        for other in live:
            state.batch.terminate_job(jobId=str(other["jobId"]), reason=TRAINCTL_CANCEL_REASON)
            stopped.add(str(other["jobId"]))
        successors = [f"{j['jobId']} ({j.get('status')})" for j in live if j["jobId"] != job_id]
        if status_now not in DONE:
            message = f"job {job_id} on fleet {fleet.name} ({status_now}) is being terminated"
        elif successors:
            message = (
                f"job {job_id} already ended {status_now}; the capacity fallback resubmitted it, and its live "
                f"successor {', '.join(successors)} is being terminated"
            )
        elif len(lineage.jobs) > 1:
            message = (
                f"job {job_id} already ended {status_now}, as did its lineage ({lineage.chain()}): nothing to cancel"
            )
        elif str(job.get("statusReason", "")).startswith(CAPACITY_CANCEL) and len(fleet.placements) > 1:
            # The resubmitter acts on the cancel's event, seconds after it.
            message = (
                f"job {job_id} already ended {status_now} for lack of capacity and has no successor yet: the "
                f"capacity fallback may still resubmit it; run `trainctl cancel {job_id}` again in a minute"
            )
        else:
            message = f"job {job_id} already ended {status_now}: nothing to cancel"
        results.append(
            {
                "jobId": job_id,
                "status": status_now,
                "terminated": bool(live),
                "terminatedJobs": [str(j["jobId"]) for j in live],
                "lineage": lineage.summary(),
            }
        )
        if not state.json:
            typer.echo(message)
    if state.json:
        one_job = len(job_ids or []) == 1 and not (sweep or name or all_jobs)
        state.out(results[0] if one_job else results)


def _terminal() -> bool:
    return sys.stdin.isatty()


def _confirmed(jobs: list[dict[str, Any]], *, yes: bool) -> list[str]:
    """The ids of `cancel --all`'s jobs once the person at the terminal agreed (or passed --yes)."""
    if not jobs:
        note("--all: no queued or running job in this deployment's queues")
        return []
    if not yes:
        if not _terminal():
            raise TrainctlError(f"cancel --all would stop {len(jobs)} jobs: pass --yes to confirm (no terminal to ask)")
        short = short_ids(str(s["jobId"]) for s in jobs)
        for s in jobs:
            note(f"  {short[str(s['jobId'])]}  {s.get('status')}  {s.get('jobName')}")
        if not typer.confirm(f"Cancel these {len(jobs)} jobs of this deployment?", err=True):
            raise typer.Exit(int(ExitCode.USAGE))
    return [str(s["jobId"]) for s in jobs]


@app.command(name="exec")
@reports_errors
def exec_(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help=JOB_HELP + " It must be RUNNING.")],
    command: Annotated[
        list[str] | None, typer.Argument(metavar="[-- CMD...]", help="Command to run (default: an interactive bash).")
    ] = None,
    node: Annotated[int, typer.Option(min=0, help="Which node (0 is the main node).")] = 0,
    port: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PORT|LOCAL:CONTAINER",
            help="Forward a port of the node's container to this machine (TensorBoard: 6006); repeatable.",
        ),
    ] = None,
) -> None:
    """A shell (or a command) in one node's container, or its ports forwarded here with --port, through ECS
    Exec and the Session Manager plugin."""
    state = state_of(ctx)
    forwards = ecs_exec.parse_ports(port or [])
    if forwards and command:
        raise TrainctlError("--port forwards ports and runs no command: drop the command after --, or exec it apart")
    job_id, job, fleet = owned(state.batch, state.deployment(), job_id)
    # The job and node first: a job that has ended is said before the plugin is asked for.
    task = ecs_exec.running_task(state.batch, job, node)
    plugin = shutil.which(ecs_exec.PLUGIN)
    if plugin is None:
        raise TrainctlError(ecs_exec.INSTALL_PLUGIN, ExitCode.USAGE)
    ecs_exec.check_plugin(ecs_exec.plugin_version(plugin))
    environment = fleet_compute(state.batch, fleet).environment or {}
    ecs = state.aws.client("ecs")
    target = ecs_exec.resolve(ecs, task, node, cluster=environment.get("ecsClusterArn"))
    if forwards:
        _forward_ports(state, plugin, target, forwards, where=f"node {node} of job {job_id}")
        return
    session = ecs_exec.start(ecs, target, shlex.join(command) if command else "/bin/bash")
    call = ecs_exec.plugin_call(
        plugin,
        session,
        {"Target": target.ssm_target},
        region=state.aws.region,
        profile=state.aws.profile,
        endpoint=_endpoint(ecs),
    )
    note(f"node {node} of job {job_id}: {target.task} ({target.container}); exit the shell to end the session")
    code = run_plugin(call)
    if code:
        raise typer.Exit(code)


def _forward_ports(
    state: State, plugin: str, target: ecs_exec.ExecTarget, forwards: list[ecs_exec.PortForward], *, where: str
) -> None:
    """One Session Manager port-forwarding session per --port, all open until Ctrl-C."""
    ssm = state.aws.client("ssm")
    calls: list[ecs_exec.PluginCall] = []
    for forward in forwards:
        try:
            session, request = ecs_exec.start_port_forwarding(ssm, target, forward)
        except TrainctlError:
            # As the AWS CLI does when it cannot hand a session on: end those already started.
            for started in calls:
                ssm.terminate_session(SessionId=started.session_id)
            raise
        calls.append(
            ecs_exec.plugin_call(
                plugin, session, request, region=state.aws.region, profile=state.aws.profile, endpoint=_endpoint(ssm)
            )
        )
    for forward in forwards:
        note(f"{where}: localhost:{forward.local} -> container port {forward.container}")
    note("Ctrl-C ends the forwarding")
    ended = run_plugins(calls)
    if ended is not None:
        index, code = ended
        line = f"localhost:{forwards[index].local}: its forwarding ended (plugin exit {code}); the others were stopped"
        if code:
            raise TrainctlError(
                f"{line}: is the port in use here? choose another: --port LOCAL:CONTAINER", ExitCode.AWS
            )
        note(line)


def _endpoint(client: Any) -> str:
    return str(client.meta.endpoint_url)


def run_plugin(call: ecs_exec.PluginCall) -> int:
    """The plugin owns the terminal until the session ends (tests stand in for it)."""
    return subprocess.call(call.argv, env=call.env())  # noqa: S603 - a fixed program found on PATH, no shell
