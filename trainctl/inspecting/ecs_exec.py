"""`trainctl exec`: a shell or a command in one node's container through ECS Exec.

Batch runs each node of a multi-node job as an ECS task; DescribeJobs on the node job `<id>#<n>` names
its task, and the task ARN its cluster (`arn:aws:ecs:<region>:<account>:task/<cluster>/<id>`). ECS
ExecuteCommand opens the session and the Session Manager plugin on this machine carries it, with the
arguments the AWS CLI's `ecs execute-command` gives it: the session, the region, "StartSession", the
profile, {"Target": "ecs:<cluster>_<task id>_<container runtime id>"} and the ECS endpoint.

`--port` forwards ports instead: Systems Manager StartSession on the same `ecs:` target with the
AWS-StartPortForwardingSession document (parameters portNumber, localPortNumber: Systems Manager user
guide, "Start a session", port forwarding), the plugin carrying it as the AWS CLI's `ssm start-session`
does (the SSM response, the region, "StartSession", the profile, the request, the SSM endpoint). The
ECS developer guide's ECS Exec page and the AWS containers blog on ECS Exec port forwarding name this
target for a task's container; only ECS Exec puts the Session Manager agent there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainctl.aws import aws_errors
from trainctl.errors import ExitCode, TrainctlError, clip
from trainctl.inspecting.showing import cluster_of_task, node_jobs

PLUGIN = "session-manager-plugin"
INSTALL_PLUGIN = (
    "the Session Manager plugin is not installed: install it (macOS: brew install --cask session-manager-plugin; "
    "Linux: AWS's .deb/.rpm, Systems Manager user guide, 'Install the Session Manager plugin')"
)


PORT_FORWARDING_DOCUMENT = "AWS-StartPortForwardingSession"
_PORT_SPEC = re.compile(r"^([0-9]{1,5})(?::([0-9]{1,5}))?$")
MAX_PORT = 65535
# How long a plugin has to end after SIGTERM before it is killed, and how often run_plugins looks at them.
PLUGIN_STOP_SECONDS = 5.0
PLUGIN_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class PortForward:
    local: int
    container: int

    def parameters(self) -> dict[str, list[str]]:
        return {"portNumber": [str(self.container)], "localPortNumber": [str(self.local)]}


def parse_ports(specs: list[str]) -> list[PortForward]:
    """`--port 6006` (the same port on both ends) or `--port LOCAL:CONTAINER`; each local port once."""
    forwards: list[PortForward] = []
    for spec in specs:
        match = _PORT_SPEC.match(spec.strip())
        ports = [int(p) for p in match.groups() if p is not None] if match else []
        if not ports or not all(1 <= p <= MAX_PORT for p in ports):
            raise TrainctlError(
                f"--port {clip(spec)!r}: give PORT or LOCAL:CONTAINER, each 1-{MAX_PORT} "
                "(--port 6006, --port 16006:6006)"
            )
        forward = PortForward(ports[0], ports[-1])
        if any(f.local == forward.local for f in forwards):
            raise TrainctlError(
                f"--port {clip(spec)}: local port {forward.local} is already forwarded by another --port"
            )
        forwards.append(forward)
    return forwards


@dataclass(frozen=True)
class ExecTarget:
    cluster: str
    task: str
    container: str
    runtime_id: str

    @property
    def ssm_target(self) -> str:
        cluster_name = self.cluster.rsplit("/", 1)[-1]
        task_id = self.task.rsplit("/", 1)[-1]
        return f"ecs:{cluster_name}_{task_id}_{self.runtime_id}"


def _cluster_of(task_arn: str, fallback: str | None) -> str:
    cluster = cluster_of_task(task_arn) or fallback
    if not cluster:
        raise TrainctlError(f"cannot tell the ECS cluster of task {task_arn}")
    return cluster


def running_task(batch: Any, job: dict[str, Any], node: int) -> str:
    """The ECS task ARN of one node of a RUNNING job (Batch alone: a job that has ended is said first)."""
    job_id = str(job["jobId"])
    if job.get("status") != "RUNNING":
        raise TrainctlError(f"job {job_id} is {job.get('status')}: exec needs a RUNNING job")
    nodes = node_jobs(batch, job)
    if node not in nodes:
        raise TrainctlError(f"--node {node}: job {job_id} has nodes 0..{max(nodes) if nodes else 0}")
    node_job = nodes[node]
    task_arn = (node_job.get("container") or {}).get("taskArn")
    if node_job.get("status") != "RUNNING" or not task_arn:
        raise TrainctlError(f"node {node} of job {job_id} is {node_job.get('status')}: it has no running container")
    return str(task_arn)


def resolve(ecs: Any, task_arn: str, node: int, *, cluster: str | None) -> ExecTarget:
    """The ECS task, cluster and container of a node's running task."""
    task_cluster = _cluster_of(task_arn, cluster)
    with aws_errors():
        tasks = ecs.describe_tasks(cluster=task_cluster, tasks=[task_arn]).get("tasks", [])
    if not tasks:
        raise TrainctlError(f"ECS does not know task {task_arn} of node {node} any more: the node has stopped")
    task = tasks[0]
    if not task.get("enableExecuteCommand"):
        raise TrainctlError(
            f"node {node}'s task was started without ECS Exec: the job definition does not enable it "
            "(deployed with -c ecsExec=false, or before trainctl exec existed): redeploy and resubmit"
        )
    containers = task.get("containers") or []
    if not containers or not containers[0].get("runtimeId"):
        raise TrainctlError(f"node {node}'s container is not running yet: try again in a minute")
    return ExecTarget(str(task.get("clusterArn") or task_cluster), str(task_arn), containers[0]["name"],
                      str(containers[0]["runtimeId"]))  # fmt: skip


def start(ecs: Any, target: ExecTarget, command: str) -> dict[str, Any]:
    """ECS ExecuteCommand; only interactive sessions exist (API ExecuteCommand, interactive)."""
    with aws_errors():
        response = ecs.execute_command(
            cluster=target.cluster, task=target.task, container=target.container, command=command, interactive=True
        )
    return dict(response["session"])


# The plugin reads the StartSession response from the environment variable its first argument names, as the
# AWS CLI hands it over (aws-cli's ssm start-session, and session-manager-plugin's StartSession arguments):
# never on the command line, where `ps` on a shared host would show the session's token.
RESPONSE_VARIABLE = "AWS_SSM_START_SESSION_RESPONSE"


# The plugin reads RESPONSE_VARIABLE in versions after this one (aws-cli's StartSessionCaller,
# LAST_PLUGIN_VERSION_WITHOUT_ENV_VAR); an older plugin would take the variable's name for the session.
LAST_PLUGIN_WITHOUT_VARIABLE = (1, 2, 497, 0)


def plugin_version(plugin: str) -> tuple[int, ...] | None:
    """`plugin --version` as numbers; None when it does not answer with one."""
    try:
        said = subprocess.run(  # noqa: S603 - the plugin found on PATH, no shell
            [plugin, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(int(part) for part in said.split(".")) if re.fullmatch(r"\d+(\.\d+){0,3}", said) else None


def check_plugin(version: tuple[int, ...] | None) -> None:
    """Refuse a plugin that would need the session's token on its command line."""
    padded = (*version, 0, 0, 0)[:4] if version else None
    if padded is None or padded <= LAST_PLUGIN_WITHOUT_VARIABLE:
        shown = ".".join(map(str, version)) if version else "unknown"
        raise TrainctlError(
            f"Session Manager plugin {shown}: trainctl needs one newer than 1.2.497.0 (older ones "
            "take the session's token on their command line): brew upgrade session-manager-plugin",
            ExitCode.USAGE,
        )


@dataclass(frozen=True)
class PluginCall:
    """One run of the plugin: its arguments, and the session (JSON) it finds in RESPONSE_VARIABLE."""

    argv: list[str]
    response: str

    @property
    def session_id(self) -> str:
        """SSM's StartSession names it SessionId, ECS's ExecuteCommand sessionId."""
        data = json.loads(self.response)
        return str(data.get("SessionId") or data.get("sessionId") or "")

    def env(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        return {**base, RESPONSE_VARIABLE: self.response}


def plugin_call(
    plugin: str, session: dict[str, Any], request: dict[str, Any], *, region: str, profile: str | None, endpoint: str
) -> PluginCall:
    """The plugin's arguments: for ECS Exec the request is {"Target": ...}; for port forwarding, the
    StartSession request itself. The session goes in the environment (RESPONSE_VARIABLE)."""
    argv = [plugin, RESPONSE_VARIABLE, region, "StartSession", profile or "", json.dumps(request), endpoint]
    return PluginCall(argv, json.dumps(session))


def start_port_forwarding(ssm: Any, target: ExecTarget, forward: PortForward) -> tuple[dict[str, Any], dict[str, Any]]:
    """SSM StartSession for one forwarded port: the session the plugin needs, and the request it repeats."""
    request = {
        "Target": target.ssm_target,
        "DocumentName": PORT_FORWARDING_DOCUMENT,
        "Parameters": forward.parameters(),
    }
    with aws_errors():
        response = ssm.start_session(**request)
    session = {key: response[key] for key in ("SessionId", "TokenValue", "StreamUrl")}
    return session, request


def stop_plugins(processes: list[subprocess.Popen[bytes]]) -> None:
    """Each plugin terminated, waited for (no process left behind) and killed if it outlasts PLUGIN_STOP_SECONDS."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=PLUGIN_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pause(seconds: float) -> None:
    """run_plugins' wait between looks (a test stands in for Ctrl-C here)."""
    time.sleep(seconds)


def run_plugins(calls: list[PluginCall]) -> tuple[int, int] | None:
    """Several plugins side by side (one per forwarded port) until Ctrl-C (None) or until one ends, say on a
    local port already in use: then the others are stopped too, and the (index, exit code) of the one that
    ended is returned."""
    processes = [subprocess.Popen(c.argv, env=c.env()) for c in calls]  # noqa: S603 - a fixed program on PATH, no shell
    try:
        while True:
            for index, process in enumerate(processes):
                code = process.poll()
                if code is not None:
                    stop_plugins(processes)
                    return index, code
            pause(PLUGIN_POLL_SECONDS)
    except KeyboardInterrupt:
        stop_plugins(processes)
        return None
