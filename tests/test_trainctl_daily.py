"""trainctl as a daily driver, on moto's AWS APIs on 127.0.0.1: the region from AWS_REGION, errors from
an endpoint that is not AWS, global options after the command, jobs / show / run / exec, refusals
before submit, the sweep cap, and the small things (timestamps, --version, status --watch)."""

from __future__ import annotations

import http.server
import json
import threading
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from config.job_events import TRAINCTL_CANCEL_REASON
from config.prices import PRICES
from tests.test_trainctl import ok_json, one_error_line  # fixtures
from tests.test_trainctl import trainctl as trainctl
from tests.test_trainctl import world as world
from tests.trainctl_world import REGION, World
from trainctl.aws import Aws
from trainctl.errors import ExitCode
from trainctl.submitting.taskfile import LAUNCHER

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = "batch-gpu-cluster"
CLUSTER_ARN = f"arn:aws:ecs:{REGION}:123456789012:cluster/{CLUSTER}"


def naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


# ----------------------------------------------------------------------------------------------- region, errors
def test_aws_region_alone_is_enough_and_no_region_says_what_to_set(trainctl: Any) -> None:
    alone = trainctl("--json", "status", env={"AWS_DEFAULT_REGION": None, "AWS_REGION": REGION})
    assert {row["fleet"] for row in ok_json(alone)} == {"gpu", "trainium", "spare"}

    line = one_error_line(trainctl("status", env={"AWS_DEFAULT_REGION": None, "AWS_REGION": None}), ExitCode.AWS)
    assert "AWS_REGION" in line and "AWS_DEFAULT_REGION" in line and "--region" in line


@pytest.fixture
def html_endpoint() -> Iterator[str]:
    """A server on 127.0.0.1 that answers every request with a proxy's HTML page."""

    class Proxy(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"<html><body><h1>Sign in to the proxy</h1></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_an_endpoint_that_answers_html_is_one_line_with_the_aws_exit_code(trainctl: Any, html_endpoint: str) -> None:
    for args in (("status",), ("jobs",), ("cost",)):
        line = one_error_line(trainctl(*args, env={"AWS_ENDPOINT_URL": html_endpoint}), ExitCode.AWS)
        assert html_endpoint in line and "not an AWS response" in line


# ----------------------------------------------------------------------------------------------- options anywhere
def every_command(world: World, tmp_path: Path) -> list[tuple[str, ...]]:
    job_id = world.submit("gpu", name="placement")
    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\n")
    return [
        ("status",), ("jobs",), ("ps",), ("show", job_id), ("logs", job_id), ("why", job_id), ("cancel", job_id),
        ("checkpoints", job_id), ("submit", "gpu", "--dry-run"), ("run", str(task), "--dry-run"),
        ("sweep", "gpu", "--grid", "LR=1,2", "--dry-run"), ("check", "gpu"), ("cost",), ("exec", job_id),
    ]  # fmt: skip


def test_global_options_work_after_the_command_for_every_command(
    world: World, trainctl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trainctl.commands.control.shutil.which", lambda _name: "/usr/bin/session-manager-plugin")
    monkeypatch.setattr("trainctl.inspecting.ecs_exec.plugin_version", lambda _plugin: (1, 2, 707, 0))
    for command in every_command(world, tmp_path):
        # No stacks in eu-west-3: a region read after the command's arguments is the one asked.
        line = one_error_line(trainctl(*command, "--region", "eu-west-3"), ExitCode.AWS)
        assert "no TrainingJobs stack in eu-west-3" in line, command
        profile = one_error_line(trainctl(*command, "--profile", "nobody"), ExitCode.AWS)
        assert "profile 'nobody'" in profile, command
    # Right after the command, in the --opt=value form, and before it (as always).
    for args in (("logs", "--region=eu-west-3", "J"), ("--region", "eu-west-3", "logs", "J")):
        assert "no TrainingJobs stack in eu-west-3" in one_error_line(trainctl(*args), ExitCode.AWS)


def test_every_commands_help_says_where_global_options_go(trainctl: Any) -> None:
    for command in ("status", "jobs", "ps", "show", "run", "exec", "cancel", "logs", "submit", "sweep", "cost"):
        assert "Global options (--region, --profile, --json) go before or after" in trainctl(command, "--help").stdout


def test_json_after_the_command(world: World, trainctl: Any) -> None:
    assert isinstance(ok_json(trainctl("status", "--json")), list)
    job_id = world.submit("gpu", name="json-after")
    world.set_job(job_id, "RUNNABLE")
    assert ok_json(trainctl("why", job_id, "--json"))["status"] == "RUNNABLE"
    assert ok_json(trainctl("jobs", "--name", "json-after", "--json"))[0]["jobId"] == job_id


def test_a_global_option_after_exec_s_double_dash_belongs_to_the_command() -> None:
    from trainctl.commands.base import hoist_global_options

    commands = {"exec", "status"}
    assert hoist_global_options(["exec", "J", "--json", "--", "ls", "--json"], commands) == [
        "--json", "exec", "J", "--", "ls", "--json",
    ]  # fmt: skip
    # A profile named like a command is a value, not the command.
    assert hoist_global_options(["--profile", "status", "status", "--region", "x"], commands) == [
        "--profile", "status", "--region", "x", "status",
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------- jobs
def test_jobs_lists_newest_first_with_filters_and_the_cost_of_finished_ones(world: World, trainctl: Any) -> None:
    now = datetime.now(UTC)
    old = world.submit("gpu", name="ls-old")
    world.set_job(old, "SUCCEEDED", created=naive(now - timedelta(days=3)))
    done = world.submit("gpu", name="ls-done")
    start = now - timedelta(hours=2)
    world.set_job(
        done, "FAILED", created=naive(now - timedelta(hours=3)), started=naive(start),
        stopped=naive(start + timedelta(hours=1)), reason="Essential container in task exited",
    )  # fmt: skip
    waiting = world.submit("trainium", name="ls-waiting", shareIdentifier="llama")
    world.set_job(waiting, "RUNNABLE", created=naive(now - timedelta(minutes=5)))

    rows = ok_json(trainctl("--json", "jobs", "--name", "ls-", "--since", "7d"))
    assert [r["jobId"] for r in rows] == [waiting, done, old]
    by_id = {r["jobId"]: r for r in rows}
    assert by_id[waiting]["fleet"] == "trainium" and by_id[waiting]["share"] == "llama"
    assert by_id[waiting]["usdEstimate"] is None
    # Two nodes for one hour at the g6.12xlarge list price.
    assert by_id[done]["usdEstimate"] == round(2 * PRICES["g6.12xlarge"].usd, 2)
    assert by_id[done]["durationMs"] == 3_600_000 and by_id[done]["attempts"] == 1

    assert [r["jobId"] for r in ok_json(trainctl("--json", "jobs", "--name", "ls-", "--since", "1d"))] == [
        waiting, done,
    ]  # fmt: skip
    failed = ok_json(trainctl("--json", "ps", "--name", "ls-", "--state", "failed,succeeded", "--fleet", "gpu"))
    assert [r["jobId"] for r in failed] == [done, old]
    assert "RUNNABLE" in one_error_line(trainctl("jobs", "--state", "QUEUED"), ExitCode.USAGE)

    table = trainctl("jobs", "--name", "ls-", "--wide")
    assert table.exit_code == 0, table.output
    assert done in table.stdout and "1h 00m" in table.stdout and "FAILED" in table.stdout


# ----------------------------------------------------------------------------------------------- show
def stubbed_ecs(monkeypatch: pytest.MonkeyPatch, world: World) -> Stubber:
    """An ECS client with scripted answers (moto cannot run Batch's ECS tasks), used by every command."""
    ecs = boto3.client(
        "ecs",
        region_name=REGION,
        endpoint_url=world.endpoint,
        aws_access_key_id="t",
        aws_secret_access_key="t",  # noqa: S106
    )
    stubber = Stubber(ecs)
    original = Aws.client

    def client(self: Any, service: str) -> Any:
        return ecs if service == "ecs" else original(self, service)

    monkeypatch.setattr(Aws, "client", client)
    stubber.activate()
    return stubber


def test_show_gives_every_node_its_instance_az_exit_code_and_stream(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = world.submit("gpu", name="shown")
    world.add_node_streams(job_id, "gpu", {0: [(1_000, "hello")], 1: [(1_000, "hello")]})
    world.set_job(job_id, "FAILED", reason="Essential container in task exited")
    instance_arn = f"arn:aws:ecs:{REGION}:123456789012:container-instance/{CLUSTER}/ci0"
    world.set_node(job_id, 0, "FAILED", exitCode=1, reason="rank 0 raised", containerInstanceArn=instance_arn,
                   taskArn=f"arn:aws:ecs:{REGION}:123456789012:task/{CLUSTER}/t0")  # fmt: skip
    stubber = stubbed_ecs(monkeypatch, world)
    stubber.add_response(
        "describe_container_instances",
        {"containerInstances": [{"containerInstanceArn": instance_arn, "ec2InstanceId": "i-0abc",
                                 "attributes": [{"name": "ecs.availability-zone", "value": "us-east-1b"}]}]},
        {"cluster": CLUSTER, "containerInstances": [instance_arn]},
    )  # fmt: skip

    shown = ok_json(trainctl("--json", "show", job_id))

    stubber.assert_no_pending_responses()
    assert shown["status"] == "FAILED" and shown["numNodes"] == 2
    node0, node1 = shown["nodes"]
    (attempt,) = node0["attempts"]
    assert (attempt["instance"], attempt["az"], attempt["exitCode"], attempt["reason"]) == (
        "i-0abc", "us-east-1b", 1, "rank 0 raised",
    )  # fmt: skip
    assert attempt["logStream"] == f"training/default/{job_id}-node0"
    assert node1["node"] == 1
    assert shown["checkpoints"]["uri"].endswith(f"/gpu/{job_id}/")

    # ECS refusing the lookup leaves the columns empty and says why, on stderr.
    stubber.add_client_error("describe_container_instances", "AccessDeniedException", "not allowed")
    partial = trainctl("--json", "show", job_id)
    assert partial.exit_code == 0, partial.output
    assert json.loads(partial.stdout)["nodes"][0]["attempts"][0]["instance"] is None
    assert "instances and AZs unknown: AWS DescribeContainerInstances failed: not allowed" in partial.stderr


# ----------------------------------------------------------------------------------------------- exec
def running_job_with_a_task(world: World) -> tuple[str, str]:
    job_id = world.submit("gpu", name="exec-me")
    world.add_node_streams(job_id, "gpu", {0: [], 1: []})
    world.set_job(job_id, "RUNNING")
    task = f"arn:aws:ecs:{REGION}:123456789012:task/{CLUSTER}/0123abcd"
    world.set_node(job_id, 0, "RUNNING", taskArn=f"arn:aws:ecs:{REGION}:123456789012:task/{CLUSTER}/main")
    world.set_node(job_id, 1, "RUNNING", taskArn=task)
    return job_id, task


def test_exec_finds_the_nodes_task_and_hands_the_session_to_the_plugin(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, task = running_job_with_a_task(world)
    stubber = stubbed_ecs(monkeypatch, world)
    stubber.add_response(
        "describe_tasks",
        {"tasks": [{"taskArn": task, "clusterArn": CLUSTER_ARN, "enableExecuteCommand": True,
                    "containers": [{"name": "default", "runtimeId": "0123abcd-rt"}]}]},
        {"cluster": CLUSTER, "tasks": [task]},
    )  # fmt: skip
    session = {"sessionId": "ecs-execute-command-1", "streamUrl": "wss://ssmmessages.example/s", "tokenValue": "tok"}
    stubber.add_response(
        "execute_command",
        {"clusterArn": CLUSTER_ARN, "taskArn": task, "containerName": "default", "interactive": True,
         "session": session},
        {"cluster": CLUSTER_ARN, "task": task, "container": "default", "command": "nvidia-smi -L",
         "interactive": True},
    )  # fmt: skip
    monkeypatch.setattr("trainctl.commands.control.shutil.which", lambda _name: "/opt/bin/session-manager-plugin")
    monkeypatch.setattr("trainctl.inspecting.ecs_exec.plugin_version", lambda _plugin: (1, 2, 707, 0))
    calls: list[Any] = []
    monkeypatch.setattr("trainctl.commands.control.run_plugin", lambda call: calls.append(call) or 0)

    result = trainctl("exec", job_id, "--node", "1", "--", "nvidia-smi", "-L")

    assert result.exit_code == 0, result.output
    stubber.assert_no_pending_responses()
    # What the AWS CLI's `ecs execute-command` passes the plugin, the session in the variable it names.
    (call,) = calls
    assert json.loads(call.env({})["AWS_SSM_START_SESSION_RESPONSE"]) == session
    assert [call.argv] == [
        [
            "/opt/bin/session-manager-plugin",
            "AWS_SSM_START_SESSION_RESPONSE",
            REGION,
            "StartSession",
            "",
            json.dumps({"Target": f"ecs:{CLUSTER}_0123abcd_0123abcd-rt"}),
            world.endpoint,
        ]
    ]


def test_exec_says_what_is_missing(world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, task = running_job_with_a_task(world)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "brew install" in one_error_line(trainctl("exec", job_id), ExitCode.USAGE)

    monkeypatch.setattr("trainctl.commands.control.shutil.which", lambda _name: "/opt/bin/session-manager-plugin")
    monkeypatch.setattr("trainctl.inspecting.ecs_exec.plugin_version", lambda _plugin: (1, 2, 707, 0))
    queued = world.submit("gpu", name="exec-queued")
    world.set_job(queued, "RUNNABLE")
    assert "needs a RUNNING job" in one_error_line(trainctl("exec", queued), ExitCode.USAGE)
    assert "has nodes 0..1" in one_error_line(trainctl("exec", job_id, "--node", "5"), ExitCode.USAGE)

    stubber = stubbed_ecs(monkeypatch, world)
    stubber.add_response(
        "describe_tasks",
        {"tasks": [{"taskArn": task, "enableExecuteCommand": False,
                    "containers": [{"name": "default", "runtimeId": "r"}]}]},
        {"cluster": CLUSTER, "tasks": [task]},
    )  # fmt: skip
    assert "ecsExec=false" in one_error_line(trainctl("exec", job_id, "--node", "1"), ExitCode.USAGE)


# ----------------------------------------------------------------------------------------------- run TASK.yaml
def test_run_a_task_file_with_a_command_and_another_image(world: World, trainctl: Any, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        "fleet: gpu\nnodes: 2\nname: lr-try\ncommand: python train.py --lr 0.1\n"
        "image: 123456789012.dkr.ecr.us-east-1.amazonaws.com/training:new\n"
        "env:\n  LR: 0.1\n  WARMUP: 1000\ntimeout: 7200\nattempts: 2\n"
    )
    planned = ok_json(trainctl("run", str(task), "--dry-run"))
    # A dry run registers nothing: it says what it would register.
    assert planned["jobDefinition"].startswith("(a new revision of gpu-training-trainctl")

    submitted = ok_json(trainctl("--json", "run", str(task)))
    batch = world.client("batch")
    (job,) = batch.describe_jobs(jobs=[submitted["jobId"]])["jobs"]
    assert job["jobName"] == "lr-try"
    (definition,) = batch.describe_job_definitions(jobDefinitions=[job["jobDefinition"]])["jobDefinitions"]
    assert definition["jobDefinitionName"] == "gpu-training-trainctl"
    tags = definition["tags"]
    assert (tags["trainctl:managed"], tags["trainctl:derived-from"]) == ("true", world.training["gpu"])
    assert set(tags) == {"trainctl:managed", "trainctl:derived-from", "trainctl:content"}
    (node_range,) = definition["nodeProperties"]["nodeRangeProperties"]
    assert node_range["container"]["image"].endswith("/training:new")
    assert node_range["container"]["instanceType"] == "g6.12xlarge"
    # The revision carries the job's own command, environment and nodes too (trainctl/submitting/revisions.py).
    assert node_range["container"]["command"] == [LAUNCHER, "python", "train.py", "--lr", "0.1"]
    assert {"name": "WARMUP", "value": "1000"} in node_range["container"]["environment"]
    assert definition["nodeProperties"]["numNodes"] == 2

    again = ok_json(trainctl("run", str(task), "--dry-run"))
    assert again["jobDefinition"] == job["jobDefinition"]  # the same job reuses the revision
    (override,) = again["nodeOverrides"]["nodePropertyOverrides"]
    assert override["containerOverrides"]["command"] == [LAUNCHER, "python", "train.py", "--lr", "0.1"]
    assert override["containerOverrides"]["environment"] == [
        {"name": "LR", "value": "0.1"}, {"name": "WARMUP", "value": "1000"},
    ]  # fmt: skip
    assert again["timeout"] == {"attemptDurationSeconds": 7200}
    assert again["retryStrategy"]["attempts"] == 2


def test_a_task_file_that_is_not_utf8_is_one_line(trainctl: Any, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_bytes(b"\xff\xfefleet: gpu\n")
    line = one_error_line(trainctl("run", str(task), env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}), ExitCode.USAGE)
    assert line.endswith("task.yaml: not UTF-8 text")


def test_the_launcher_is_the_one_the_job_definitions_run() -> None:
    from training_constructs.jobs.workloads import LAUNCHER as DEPLOYED

    assert LAUNCHER == DEPLOYED


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("fleet: gpu\nnodse: 2\n", "task.yaml: field nodse: unknown (did you mean 'nodes'?)"),
        ("fleet: gpu\nimg: x\n", "(did you mean 'image'?)"),
        ("nodes: 2\n", "field fleet is required"),
        ("fleet: gpu\ntimeout: 30\n", "field timeout: Input should be greater than or equal to 60"),
        ("fleet: gpu\nenv:\n  AWS_BATCH_X: 1\n", "reserved for Batch"),
        ("fleet: gpu\nattempts: 11\n", "field attempts"),
        ("- fleet\n", "a task file is a mapping"),
        ("fleet: [gpu\n", "not valid YAML at line"),
        ("fleet: gpu\nenv:\n  A: [1, 2]\n", "field env: A: give text, a number or true/false"),
    ],
)
def test_a_bad_task_file_is_one_line_naming_the_field(trainctl: Any, tmp_path: Path, text: str, says: str) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(text)
    offline = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # refused before any AWS call
    line = one_error_line(trainctl("run", str(task), env=offline), ExitCode.USAGE)
    assert says in line and len(line) <= 220


# ----------------------------------------------------------------------------------------------- refusals
def test_more_nodes_than_the_fleet_holds_is_refused_before_submit(world: World, trainctl: Any) -> None:
    line = one_error_line(trainctl("submit", "gpu", "--nodes", "1000", "--name", "too-many"), ExitCode.USAGE)
    # The gpu fleet: maxvCpus 96, 48 vCPUs a node.
    assert "holds at most 2 nodes (96 vCPUs, 48 per node)" in line and "--nodes 2" in line
    named = [{"name": "JOB_NAME", "values": ["too-many"]}]
    assert not world.client("batch").list_jobs(jobQueue=world.queues["gpu"], filters=named)["jobSummaryList"]
    assert ok_json(trainctl("submit", "gpu", "--nodes", "2", "--dry-run"))["nodeOverrides"]["numNodes"] == 2


def test_an_unknown_share_is_refused_unless_new_share(trainctl: Any) -> None:
    line = one_error_line(trainctl("submit", "trainium", "--share", "lama", "--dry-run"), ExitCode.USAGE)
    assert "lists llama" in line and "--new-share" in line
    assert ok_json(trainctl("submit", "trainium", "--share", "lama", "--new-share", "--dry-run"))[
        "shareIdentifier"
    ] == ("lama")
    assert ok_json(trainctl("submit", "trainium", "--share", "llama", "--dry-run"))["shareIdentifier"] == "llama"


def test_a_sweep_over_the_cap_asks_for_yes_and_shows_progress(world: World, trainctl: Any) -> None:
    grid = ("--grid", "A=1,2,3,4,5,6,7", "--grid", "B=1,2,3")
    line = one_error_line(trainctl("sweep", "spare", *grid), ExitCode.USAGE)
    assert "sweep of 21 jobs is over 20" in line and "--yes" in line
    assert not world.client("batch").list_jobs(jobQueue=world.queues["spare"], filters=[
        {"name": "JOB_NAME", "values": ["spare-A-1-B-1"]}])["jobSummaryList"]  # fmt: skip

    submitted = ok_json(trainctl("--json", "sweep", "spare", *grid, "--yes"))
    assert len(submitted["jobs"]) == 21
    for job_id in (j["jobId"] for j in submitted["jobs"]):
        world.set_job(job_id, "RUNNABLE")

    cancelled = ok_json(trainctl("--json", "cancel", "--sweep", submitted["sweep"]))
    assert sorted(c["jobId"] for c in cancelled) == sorted(j["jobId"] for j in submitted["jobs"])
    assert all(world.job(j["jobId"]).job_stopped_reason == TRAINCTL_CANCEL_REASON for j in submitted["jobs"])


# ----------------------------------------------------------------------------------------------- small things
def test_cancel_takes_several_ids(world: World, trainctl: Any) -> None:
    first, second = world.submit("gpu", name="c1"), world.submit("gpu", name="c2")
    for job_id in (first, second):
        world.set_job(job_id, "RUNNING")
    result = ok_json(trainctl("--json", "cancel", first, second))
    assert [r["jobId"] for r in result] == [first, second] and all(r["terminated"] for r in result)
    assert world.job(second).job_stopped_reason == TRAINCTL_CANCEL_REASON


def test_logs_timestamps(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="stamped")
    world.add_node_streams(job_id, "gpu", {0: [(1_000, "first")], 1: []})
    result = trainctl("logs", job_id, "--timestamps")
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    stamp, rest = line.split(" ", 1)
    assert rest == "[n0] first"
    assert abs(datetime.fromisoformat(stamp) - (datetime.now(UTC) - timedelta(minutes=10))) < timedelta(minutes=2)


def test_version_matches_the_package(trainctl: Any) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert trainctl("--version").stdout.strip() == f"trainctl {version}"
    assert "--install-completion" in trainctl("--help").stdout


def test_status_watch_redraws_until_stopped(trainctl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr("trainctl.commands.base.sleep", waits.append)
    result = trainctl("status", "--watch", "--interval", "5", "--rounds", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("Training fleets in us-east-1") == 3
    assert waits == [5.0, 5.0]
