"""The small things that each cost a newcomer minutes (issue 43, Why 6), and `exec --port`, on moto's
AWS APIs on 127.0.0.1: a job name explained in words, refusals that name what `run` takes, duplicated
keys, an empty command, `logs -f` on a finished job, a --since in the future, --new-share alone, exec's
order of checks, --env-file, and port forwarding through Session Manager."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from tests.test_trainctl import ok_json, one_error_line  # fixtures
from tests.test_trainctl import trainctl as trainctl
from tests.test_trainctl import world as world
from tests.test_trainctl_daily import CLUSTER, CLUSTER_ARN, running_job_with_a_task
from tests.trainctl_world import REGION, World
from trainctl.aws import Aws
from trainctl.errors import ExitCode, TrainctlError
from trainctl.inspecting.ecs_exec import PortForward, parse_ports
from trainctl.submitting.requests import JOB_NAME_RULE
from trainctl.submitting.taskfile import LAUNCHER, load_task

ROOT = Path(__file__).resolve().parents[1]
# Nothing listens on port 9: a command that asked AWS first would exit 3, not 2.
OFFLINE = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}


def task_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------------- job names
def test_the_docs_task_file_loads_and_a_bad_name_is_explained_in_words_in_both(trainctl: Any, tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "jobs.md").read_text(), re.S)
    (documented,) = [b for b in blocks if b.startswith("fleet: gpu")]
    assert load_task(task_file(tmp_path, documented)).name  # the page's own example is a valid task

    line = one_error_line(
        trainctl("run", str(task_file(tmp_path, "fleet: gpu\nname: h1-lr-0.1\n")), env=OFFLINE), ExitCode.USAGE
    )
    assert JOB_NAME_RULE in line and "field name" in line and "pattern" not in line
    flag = one_error_line(trainctl("submit", "gpu", "--name", "h1-lr-0.1", env=OFFLINE), ExitCode.USAGE)
    assert JOB_NAME_RULE in flag and "--name 'h1-lr-0.1'" in flag


# ----------------------------------------------------------------------------------------------- run's refusals
def test_runs_refusals_name_the_task_files_field_not_a_flag(
    world: World, trainctl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the file as a user names it, relative

    def refused(text: str) -> str:
        task_file(tmp_path, text)
        line = one_error_line(trainctl("run", "task.yaml"), ExitCode.USAGE)
        assert len(line) <= 200 and "--nodes" not in line and "--share" not in line
        return line

    # The gpu fleet holds 2 nodes.
    too_many = refused("fleet: gpu\nnodes: 1000\n")
    assert too_many.startswith("trainctl: nodes: 1000: fleet gpu holds at most 2 nodes")
    assert "set nodes: 2 or fewer in task.yaml" in too_many
    assert "first in, first out: remove share: from task.yaml" in refused("fleet: gpu\nshare: llama\n")
    assert "fair share: set share: ID in task.yaml" in refused("fleet: trainium\n")
    unknown = refused("fleet: trainium\nshare: lama\n")
    assert "share: lama: fleet trainium's fair-share policy lists llama; set share: one of them in task.yaml" in unknown
    # submit has the flags, and says so.
    assert "pass --nodes 2 or fewer" in one_error_line(trainctl("submit", "gpu", "--nodes", "9"), ExitCode.USAGE)


def test_new_share_without_a_share_is_refused(trainctl: Any, tmp_path: Path) -> None:
    flag = one_error_line(trainctl("submit", "trainium", "--new-share", "--dry-run"), ExitCode.USAGE)
    assert "--new-share without a share: pass --share ID" in flag
    task = task_file(tmp_path, "fleet: trainium\n")
    line = one_error_line(trainctl("run", str(task), "--new-share", "--dry-run"), ExitCode.USAGE)
    assert f"--new-share without a share: set share: ID in {task}" in line
    assert "--new-share" in one_error_line(trainctl("sweep", "gpu", "--grid", "A=1", "--new-share"), ExitCode.USAGE)


# ----------------------------------------------------------------------------------------------- task files
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("fleet: gpu\nnodes: 2\nname: a\nnodes: 4\n", "field nodes is given twice (lines 2 and 4): keep one"),
        ("fleet: gpu\nenv:\n  LR: 1\n  LR: 2\n", "field env.LR is given twice (lines 3 and 4)"),
        ("fleet: gpu\ncommand: ''\n", "field command: empty: give the script and its arguments"),
        ("fleet: gpu\ncommand: []\n", "field command: empty"),
    ],
)
def test_a_repeated_key_or_an_empty_command_in_a_task_file_is_one_line(
    trainctl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    task_file(tmp_path, text)
    line = one_error_line(trainctl("run", "task.yaml", env=OFFLINE), ExitCode.USAGE)
    assert line.startswith("trainctl: task.yaml: ") and says in line and len(line) <= 200


def test_submit_refuses_an_empty_command(trainctl: Any) -> None:
    for command in ("", "   "):
        line = one_error_line(trainctl("submit", "gpu", "--command", command, env=OFFLINE), ExitCode.USAGE)
        assert "--command: empty" in line
    planned = ok_json(trainctl("submit", "gpu", "--command", "python train.py", "--dry-run"))
    (override,) = planned["nodeOverrides"]["nodePropertyOverrides"]
    assert override["containerOverrides"]["command"] == [LAUNCHER, "python", "train.py"]


# ----------------------------------------------------------------------------------------------- logs -f
def test_logs_follow_on_a_finished_job_prints_its_logs_and_exits_with_its_outcome(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = world.submit("gpu", name="done-before")
    world.add_node_streams(done, "gpu", {0: [(1_000, "epoch 1"), (2_000, "saved")], 1: [(1_500, "joined")]})
    world.set_job(done, "SUCCEEDED")
    result = trainctl("logs", done, "-f")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[n0] epoch 1", "[n1] joined", "[n0] saved"]
    assert f"job {done} already ended SUCCEEDED: its logs are above" in result.stderr

    silent = world.submit("gpu", name="failed-silent")
    world.add_node_streams(silent, "gpu", {0: [], 1: []})
    world.set_job(silent, "FAILED", reason="Essential container in task exited")
    failed = trainctl("logs", silent, "--follow")
    assert failed.exit_code == ExitCode.JOB_FAILED and failed.stdout == ""
    assert f"job {silent} already ended FAILED: its nodes wrote no log lines" in failed.stderr

    # Followed to its end, a job that fails sets the exit status too.
    running = world.submit("gpu", name="fails-later")
    world.add_node_streams(running, "gpu", {0: [(1_000, "step 1")], 1: []})
    world.set_job(running, "RUNNING")
    monkeypatch.setattr("trainctl.commands.base.sleep", lambda _s: world.set_job(running, "FAILED"))
    followed = trainctl("logs", running, "-f")
    assert followed.exit_code == ExitCode.JOB_FAILED and followed.stdout.splitlines() == ["[n0] step 1"]


# ----------------------------------------------------------------------------------------------- --since
def test_a_since_in_the_future_is_refused(trainctl: Any) -> None:
    next_year = (datetime.now(UTC) + timedelta(days=366)).date().isoformat()
    for command in ("cost", "jobs"):
        line = one_error_line(trainctl(command, "--since", next_year, env=OFFLINE), ExitCode.USAGE)
        assert f"--since {next_year}: that is after now" in line and "7d" in line


# ----------------------------------------------------------------------------------------------- --env-file
def test_env_file_on_submit_run_and_sweep(trainctl: Any, tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text('# shared settings\n\nDATA=s3://bucket/set\nLR=0.1\nNOTE="two words"\nEMPTY=\n')

    planned = ok_json(trainctl("submit", "gpu", "--env-file", str(env_file), "--env", "LR=0.2", "--dry-run"))
    (override,) = planned["nodeOverrides"]["nodePropertyOverrides"]
    environment = {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}
    # --env wins over the file; comments and blank lines are skipped; one pair of quotes is dropped.
    assert environment == {"DATA": "s3://bucket/set", "LR": "0.2", "NOTE": "two words", "EMPTY": ""}

    task = task_file(tmp_path, "fleet: gpu\nenv:\n  LR: 0.3\n")
    (override,) = ok_json(trainctl("run", str(task), "--env-file", str(env_file), "--dry-run"))["nodeOverrides"][
        "nodePropertyOverrides"
    ]
    environment = {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}
    assert environment["LR"] == "0.3" and environment["DATA"] == "s3://bucket/set"

    requests = ok_json(trainctl("sweep", "gpu", "--grid", "LR=1,2", "--env-file", str(env_file), "--dry-run"))
    swept = [{e["name"]: e["value"] for e in r["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"][
        "environment"]} for r in requests]  # fmt: skip
    assert [(e["LR"], e["DATA"]) for e in swept] == [("1", "s3://bucket/set"), ("2", "s3://bucket/set")]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("A=1\n# fine\nnot a pair\n", "line 3: 'not a pair' is not NAME=VALUE"),
        ("\n1BAD=x\n", "line 2: '1BAD=x' is not NAME=VALUE"),
        ("AWS_BATCH_JOB_ID=x\n", "line 1: AWS_BATCH_JOB_ID: names starting with AWS_BATCH are reserved"),
    ],
)
def test_a_bad_env_file_line_is_refused_with_its_number(
    trainctl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.env").write_text(text)
    task_file(tmp_path, "fleet: gpu\n")
    for command in (("submit", "gpu"), ("run", "task.yaml"), ("sweep", "gpu", "--grid", "A=1")):
        line = one_error_line(trainctl(*command, "--env-file", "bad.env", env=OFFLINE), ExitCode.USAGE)
        assert f"--env-file bad.env {says}" in line and len(line) <= 200, command
    missing = one_error_line(trainctl("submit", "gpu", "--env-file", "none.env", env=OFFLINE), ExitCode.USAGE)
    assert "--env-file none.env: cannot read it" in missing


# ----------------------------------------------------------------------------------------------- exec
def test_exec_says_the_job_ended_before_asking_for_the_plugin(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    ended = world.submit("gpu", name="exec-ended")
    world.set_job(ended, "SUCCEEDED")
    line = one_error_line(trainctl("exec", ended), ExitCode.USAGE)
    assert "is SUCCEEDED: exec needs a RUNNING job" in line and "plugin" not in line
    job_id, _ = running_job_with_a_task(world)
    assert "has nodes 0..1" in one_error_line(trainctl("exec", job_id, "--node", "5", "--port", "6006"), ExitCode.USAGE)
    # A running node: now the plugin is what is missing.
    assert "brew install" in one_error_line(trainctl("exec", job_id, "--port", "6006"), ExitCode.USAGE)


def test_port_specs() -> None:
    assert parse_ports(["6006", "16888:8888", " 7000 "]) == [
        PortForward(6006, 6006), PortForward(16888, 8888), PortForward(7000, 7000),
    ]  # fmt: skip
    for bad in ("", "tb", "0", "65536", "6006:", ":6006", "1:2:3", "-1", "6006/tcp", "١٢٣"):
        with pytest.raises(TrainctlError) as refused:
            parse_ports([bad])
        message = refused.value.message
        assert message.startswith(f"--port {bad!r}: give PORT or LOCAL:CONTAINER, each 1-65535") and len(message) < 200
    with pytest.raises(TrainctlError, match="local port 6006 is already forwarded"):
        parse_ports(["6006", "6006:7007"])


def stubbed_clients(monkeypatch: pytest.MonkeyPatch, world: World, *services: str) -> dict[str, Stubber]:
    """Clients with scripted answers for these services (moto runs no ECS task and no Session Manager)."""
    clients = {
        s: boto3.client(s, region_name=REGION, endpoint_url=world.endpoint, aws_access_key_id="t",
                        aws_secret_access_key="t")  # noqa: S106
        for s in services
    }  # fmt: skip
    original = Aws.client
    monkeypatch.setattr(Aws, "client", lambda self, service: clients.get(service) or original(self, service))
    stubbers = {s: Stubber(c) for s, c in clients.items()}
    for stubber in stubbers.values():
        stubber.activate()
    return stubbers


def forwarding_stubs(
    monkeypatch: pytest.MonkeyPatch, world: World
) -> tuple[str, str, dict[str, Stubber], list[dict[str, Any]], list[dict[str, Any]]]:
    """A running job whose node 1 forwards ports 6006 and 18888:8888: its id, its task, the stubbers, the
    sessions and the requests."""
    job_id, task = running_job_with_a_task(world)
    stubbers = stubbed_clients(monkeypatch, world, "ecs", "ssm")
    stubbers["ecs"].add_response(
        "describe_tasks",
        {"tasks": [{"taskArn": task, "clusterArn": CLUSTER_ARN, "enableExecuteCommand": True,
                    "containers": [{"name": "default", "runtimeId": "0123abcd-rt"}]}]},
        {"cluster": CLUSTER, "tasks": [task]},
    )  # fmt: skip
    target = f"ecs:{CLUSTER}_0123abcd_0123abcd-rt"
    requests = [
        {"Target": target, "DocumentName": "AWS-StartPortForwardingSession",
         "Parameters": {"portNumber": [container], "localPortNumber": [local]}}
        for local, container in (("6006", "6006"), ("18888", "8888"))
    ]  # fmt: skip
    sessions = []
    for number, request in enumerate(requests):
        session = {"SessionId": f"s-{number}", "TokenValue": f"token-{number}", "StreamUrl": f"wss://ssm/{number}"}
        stubbers["ssm"].add_response("start_session", session, request)
        sessions.append(session)
    monkeypatch.setattr("trainctl.commands.control.shutil.which", lambda _name: "/opt/bin/session-manager-plugin")
    monkeypatch.setattr("trainctl.inspecting.ecs_exec.plugin_version", lambda _plugin: (1, 2, 707, 0))
    return job_id, task, stubbers, sessions, requests


def test_exec_port_forwards_each_port_through_session_manager(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, task, stubbers, sessions, requests = forwarding_stubs(monkeypatch, world)
    calls: list[list[Any]] = []
    monkeypatch.setattr("trainctl.commands.control.run_plugins", lambda handed: calls.append(handed))

    result = trainctl("exec", job_id, "--node", "1", "--port", "6006", "--port", "18888:8888")

    assert result.exit_code == 0, result.output
    for stubber in stubbers.values():
        stubber.assert_no_pending_responses()
    # What the AWS CLI's `ssm start-session` passes the plugin: the name of the variable that holds the session,
    # the region, the request; the session (its token) in that variable, never on the command line.
    (handed,) = calls
    assert [c.argv for c in handed] == [
        ["/opt/bin/session-manager-plugin", "AWS_SSM_START_SESSION_RESPONSE", REGION, "StartSession", "",
         json.dumps(request), world.endpoint]
        for request in requests
    ]  # fmt: skip
    assert [json.loads(c.env({})["AWS_SSM_START_SESSION_RESPONSE"]) for c in handed] == sessions
    assert not any(s["TokenValue"] in " ".join(c.argv) for c in handed for s in sessions)
    assert "localhost:18888 -> container port 8888" in result.stderr

    # A session that cannot start ends those already started, as the AWS CLI does.
    stubbers["ecs"].add_response(
        "describe_tasks",
        {"tasks": [{"taskArn": task, "clusterArn": CLUSTER_ARN, "enableExecuteCommand": True,
                    "containers": [{"name": "default", "runtimeId": "0123abcd-rt"}]}]},
        {"cluster": CLUSTER, "tasks": [task]},
    )  # fmt: skip
    stubbers["ssm"].add_response("start_session", sessions[0], requests[0])
    stubbers["ssm"].add_client_error("start_session", "AccessDeniedException", "not allowed to start a session")
    stubbers["ssm"].add_response("terminate_session", {"SessionId": "s-0"}, {"SessionId": "s-0"})
    denied = trainctl("exec", job_id, "--node", "1", "--port", "6006", "--port", "18888:8888")
    assert "not allowed to start a session" in one_error_line(denied, ExitCode.AWS)
    stubbers["ssm"].assert_no_pending_responses()
    assert len(calls) == 1  # no plugin ran

    line = one_error_line(trainctl("exec", job_id, "--port", "6006", "--", "nvidia-smi"), ExitCode.USAGE)
    assert "--port forwards ports and runs no command" in line
    assert "give PORT or LOCAL:CONTAINER" in one_error_line(
        trainctl("exec", job_id, "--port", "tb", env=OFFLINE), ExitCode.USAGE
    )


# Stand-ins for the plugin: one that forwards until stopped (and says its pid), one whose local port is busy.
FORWARDING = [
    sys.executable,
    "-c",
    "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)",
]
STUBBORN = [sys.executable, "-c", (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
)]  # fmt: skip
# Ends once both others are forwarding (their pid files exist).
BUSY_PORT = ["sh", "-c", 'while [ ! -e "$0" ] || [ ! -e "$1" ]; do sleep 0.05; done; exit 7']


def plugin(argv: list[str]) -> Any:
    from trainctl.inspecting.ecs_exec import PluginCall

    return PluginCall(argv, json.dumps({"SessionId": "s", "TokenValue": "t"}))


def test_the_plugin_finds_the_session_in_its_environment_not_on_its_command_line(tmp_path: Path) -> None:
    from trainctl.inspecting import ecs_exec

    seen = tmp_path / "seen"
    reader = [sys.executable, "-c", (
        "import os, sys; open(sys.argv[1], 'w').write(sys.argv[2] + ' ' + os.environ[sys.argv[2]]); sys.exit(3)"
    ), str(seen)]  # fmt: skip
    call = ecs_exec.plugin_call(
        "plugin", {"SessionId": "s-1", "TokenValue": "secret-token"}, {"Target": "ecs:c_t_r"}, region="us-east-1",
        profile=None, endpoint="https://ssm.us-east-1.amazonaws.com",
    )  # fmt: skip
    assert "secret-token" not in " ".join(call.argv) and call.session_id == "s-1"
    stand_in = ecs_exec.PluginCall([*reader, call.argv[1]], call.response)
    assert ecs_exec.run_plugins([stand_in]) == (0, 3)
    name, value = seen.read_text().split(" ", 1)
    assert name == "AWS_SSM_START_SESSION_RESPONSE" and json.loads(value)["TokenValue"] == "secret-token"


def reaped(pid_file: Path) -> bool:
    """The process has ended and was waited for: an unreaped one stays in the process table (a zombie)."""
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_when_one_forwarding_ends_the_others_are_stopped_and_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainctl.inspecting import ecs_exec

    monkeypatch.setattr(ecs_exec, "PLUGIN_STOP_SECONDS", 0.5)
    started = time.monotonic()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    ended = ecs_exec.run_plugins([plugin([*FORWARDING, a]), plugin([*BUSY_PORT, a, b]), plugin([*STUBBORN, b])])
    assert ended == (1, 7) and time.monotonic() - started < 10
    assert reaped(tmp_path / "a") and reaped(tmp_path / "b")  # the one ignoring SIGTERM was killed


def test_ctrl_c_stops_every_forwarding_and_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainctl.inspecting import ecs_exec

    def interrupted(seconds: float) -> None:
        if (tmp_path / "a").exists() and (tmp_path / "b").exists():  # both stand-ins are forwarding
            raise KeyboardInterrupt
        time.sleep(seconds)

    monkeypatch.setattr(ecs_exec, "pause", interrupted)
    calls = [plugin([*FORWARDING, str(tmp_path / "a")]), plugin([*FORWARDING, str(tmp_path / "b")])]
    assert ecs_exec.run_plugins(calls) is None
    assert reaped(tmp_path / "a") and reaped(tmp_path / "b")


def test_a_busy_local_port_ends_the_forwarding_with_a_line_naming_it(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, *_ = forwarding_stubs(monkeypatch, world)
    monkeypatch.setattr("trainctl.commands.control.run_plugins", lambda argvs: (1, 1))  # the second plugin ended
    result = trainctl("exec", job_id, "--node", "1", "--port", "6006", "--port", "18888:8888")
    assert result.exit_code == ExitCode.AWS and "Traceback" not in result.output
    line = result.stderr.strip().splitlines()[-1]  # after the lines naming the forwarded ports
    assert line.startswith("trainctl: localhost:18888: its forwarding ended (plugin exit 1); the others were stopped")
    assert "--port LOCAL:CONTAINER" in line and len(line) <= 200


def test_a_plugin_that_would_need_the_token_on_its_command_line_is_refused(tmp_path: Path) -> None:
    from trainctl.errors import TrainctlError
    from trainctl.inspecting import ecs_exec

    old = tmp_path / "session-manager-plugin"
    old.write_text("#!/bin/sh\necho 1.2.497.0\n")
    old.chmod(0o755)
    assert ecs_exec.plugin_version(str(old)) == (1, 2, 497, 0)
    with pytest.raises(TrainctlError, match=r"plugin 1\.2\.497\.0: trainctl needs one newer than 1\.2\.497\.0"):
        ecs_exec.check_plugin(ecs_exec.plugin_version(str(old)))
    with pytest.raises(TrainctlError, match="plugin unknown: "):
        ecs_exec.check_plugin(ecs_exec.plugin_version(str(tmp_path / "missing")))
    ecs_exec.check_plugin((1, 2, 707, 0))  # newer: reads the session from its environment
    ecs_exec.check_plugin((1, 3))
