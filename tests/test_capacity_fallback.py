"""Capacity fallback on moto's Batch (127.0.0.1): the resubmitter sends a capacity-cancelled job to the
next placement once, keeps what the job was submitted with, leaves every other failure alone and ends
the chain at the last placement; `trainctl why` and `status` explain capacity waits per placement.
The rule's event pattern is checked against sample events with moto's EventBridge matcher."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from config.catalog import CATALOG
from config.settings import CapacityReservation, CapacityWindow, Placement
from tests.trainctl_world import ACCOUNT, REGION, World, moto_environment, served_world
from trainctl.cli import app
from trainctl.jobs import STATES
from training_constructs.jobs.capacity_fallback import resubmit
from training_constructs.jobs.capacity_fallback.routes import FallbackRoute, definition_families, routes_document

# Batch user guide, "Jobs stuck in RUNNABLE due to capacity": the reason while a job waits, and after
# the queue's time limit cancelled it.
WAITING = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Service cannot fulfill the capacity requested for instance type"
CANCELLED = "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
NOW = datetime(2026, 11, 24, 21, 0, tzinfo=UTC)
BLOCK = CapacityWindow(start="2026-12-01T11:30:00Z", end="2026-12-08T11:30:00Z")
P5E, P5 = CATALOG["p5e.48xlarge"], CATALOG["p5.48xlarge"]
# The gpu fleet of the world gets three placements; the third is a Capacity Block not yet open.
PLACEMENTS = (
    Placement(instance=P5E, availability_zone="us-east-1a", capacity_reservation=None),
    Placement(instance=P5, availability_zone="us-east-1a", capacity_reservation=None),
    Placement(
        instance=P5E,
        availability_zone="us-east-1b",
        capacity_reservation=CapacityReservation(reservation_id="cr-0a1b2c3d4e5f60718", kind="capacity-block"),
        window=BLOCK,
    ),
)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with served_world() as world:
        _add_placements(world)
        yield world


def _add_placements(world: World) -> None:
    """Two more queues for the gpu fleet, each with one compute environment, and the Placements
    output the jobs stack writes for a fleet with fallback placements."""
    from moto.batch.models import ComputeEnvironment

    batch = world.client("batch")
    for number in (1, 2):
        environment = ComputeEnvironment(
            f"gpu-fallback-{number}",
            "MANAGED",
            "ENABLED",
            {"type": "EC2", "minvCpus": 0, "maxvCpus": 96, "instanceTypes": [PLACEMENTS[number].instance.name]},
            f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/batch.amazonaws.com/AWSServiceRoleForBatch",
            account_id=ACCOUNT,
            region_name=REGION,
        )
        world.batch_backend._compute_environments[environment.arn] = environment
        world.queues[f"gpu{number}"] = batch.create_job_queue(
            jobQueueName=f"gpu-fallback-{number}-queue",
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment.arn}],
        )["jobQueueArn"]
    cloudformation = world.client("cloudformation")
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in cloudformation.describe_stacks(StackName="TrainingJobs")["Stacks"][0]["Outputs"]
    }
    outputs["GpuPlacements"] = ";".join(
        f"{p.label}|{world.queues[q]}" for p, q in zip(PLACEMENTS, ("gpu", "gpu1", "gpu2"), strict=True)
    )
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    cloudformation.update_stack(StackName="TrainingJobs", TemplateBody=json.dumps(template))


def _routes(world: World) -> dict[str, Any]:
    queues = [SimpleNamespace(job_queue_arn=world.queues[q]) for q in ("gpu", "gpu1", "gpu2")]
    route = FallbackRoute(fleet="gpu", placements=PLACEMENTS, queues=queues, job_definition_arns=[])  # type: ignore[arg-type]
    return routes_document([route])


class Recorder:
    """moto's Batch client, remembering what SubmitJob was asked (moto does not keep node overrides)."""

    def __init__(self, client: Any) -> None:
        self.client, self.submitted = client, []  # type: list[dict[str, Any]]

    def submit_job(self, **request: Any) -> Any:
        self.submitted.append(request)
        return self.client.submit_job(**request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _cancelled_job(
    world: World, queue: str, reason: str = CANCELLED, definition: str | None = None, **submit: Any
) -> dict[str, Any]:
    batch = world.client("batch")
    job_id = batch.submit_job(
        jobName="llama-70b", jobQueue=world.queues[queue], jobDefinition=definition or world.training["gpu"], **submit
    )["jobId"]
    world.set_job(job_id, "FAILED", reason=reason)
    # The event's detail is the job as DescribeJobs gives it (Batch user guide, "Job state change events").
    return dict(batch.describe_jobs(jobs=[job_id])["jobs"][0])


def _jobs_in(world: World, queue: str) -> list[dict[str, Any]]:
    batch = world.client("batch")
    ids = [
        s["jobId"]
        for status in STATES
        for s in batch.list_jobs(jobQueue=world.queues[queue], jobStatus=status)["jobSummaryList"]
    ]
    return batch.describe_jobs(jobs=ids)["jobs"] if ids else []


# ----------------------------------------------------------------------------------------------- resubmitter
def test_a_capacity_cancel_goes_to_the_next_placement_once_with_what_it_was_given(world: World) -> None:
    overrides = {
        "numNodes": 2,
        "nodePropertyOverrides": [
            {
                "targetNodes": "0:",
                "containerOverrides": {
                    "environment": [{"name": "LR", "value": "3e-4"}],
                    "command": ["train.py", "--fast"],
                },
            }
        ],
    }
    detail = _cancelled_job(
        world, "gpu", tags={"team": "llm"}, timeout={"attemptDurationSeconds": 7200}, nodeOverrides=overrides
    )
    # moto drops share identifiers and node overrides from its job record: give the event the overrides merged
    # in (whether Batch merges them is not documented: the test at the end of this file takes the other form).
    detail["shareIdentifier"] = "llama"
    detail["nodeProperties"]["nodeRangeProperties"][0]["container"]["environment"].append(
        {"name": "LR", "value": "3e-4"}
    )
    detail["nodeProperties"]["nodeRangeProperties"][0]["container"]["command"] = ["train.py", "--fast"]
    batch = Recorder(world.client("batch"))
    before = {j["jobId"] for j in _jobs_in(world, "gpu1")}

    first = resubmit.handle(detail, _routes(world), batch, NOW)
    again = resubmit.handle(detail, _routes(world), batch, NOW)

    assert first["action"] == "resubmitted" and first["to_placement"] == "1"
    assert again["action"] == "already-resubmitted" and again["successor"] == first["successor"]
    new = [j for j in _jobs_in(world, "gpu1") if j["jobId"] not in before]
    assert [j["jobId"] for j in new] == [first["successor"]]
    job = new[0]
    assert job["jobName"] == "llama-70b" and job["jobDefinition"] == world.training["gpu"]
    assert job["timeout"] == {"attemptDurationSeconds": 7200}
    assert job["tags"]["team"] == "llm" and job["tags"]["training:fallback-of"] == detail["jobId"]
    (request,) = batch.submitted
    assert request["shareIdentifier"] == "llama"
    assert request["nodeOverrides"]["numNodes"] == 2
    (node_range,) = request["nodeOverrides"]["nodePropertyOverrides"]
    container = node_range["containerOverrides"]
    # The whole job moves: one node range, one instance type, the placement's.
    assert node_range["targetNodes"] == "0:" and container["instanceType"] == "p5.48xlarge"
    assert {"name": "LR", "value": "3e-4"} in container["environment"]
    assert container["command"] == ["train.py", "--fast"]
    # The successor's launcher resumes the original's checkpoints (CHECKPOINT_URI/<lineage>/).
    assert {"name": "CHECKPOINT_LINEAGE", "value": detail["jobId"]} in container["environment"]


def test_a_second_resubmission_keeps_the_original_lineage_on_every_node_range(world: World) -> None:
    # Inside the Capacity Block's window: placement 2's successor goes on to placement 3.
    inside = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    detail = _cancelled_job(world, "gpu1", tags={"training:fallback-of": "original-7"})
    # As Batch describes a successor: its override merged into each range, here a main node range
    # and a range of the others, each with the lineage the first resubmission gave it.
    (node_range,) = detail["nodeProperties"]["nodeRangeProperties"]
    environment = [*node_range["container"]["environment"], {"name": "CHECKPOINT_LINEAGE", "value": "original-7"}]
    detail["nodeProperties"]["nodeRangeProperties"] = [
        {"targetNodes": target, "container": {**node_range["container"], "environment": environment}}
        for target in ("0:0", "1:")
    ]
    batch = Recorder(world.client("batch"))

    answer = resubmit.handle(detail, _routes(world), batch, inside)

    assert answer["action"] == "resubmitted" and answer["to_placement"] == "2"
    (request,) = batch.submitted
    ranges = request["nodeOverrides"]["nodePropertyOverrides"]
    assert [r["targetNodes"] for r in ranges] == ["0:0", "1:"]
    for node_range in ranges:
        lineages = [
            e["value"] for e in node_range["containerOverrides"]["environment"] if e["name"] == "CHECKPOINT_LINEAGE"
        ]
        assert lineages == ["original-7"]  # the original's, once; not the cancelled job's id
    assert request["tags"]["training:fallback-of"] == detail["jobId"]


def test_other_failures_are_not_resubmitted(world: World) -> None:
    batch = Recorder(world.client("batch"))
    for reason in (
        "Essential container in task exited",
        "Canceled by JobStateTimeLimit action due to reason: MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
        "trainctl cancel: cancelled on request",
    ):
        answer = resubmit.handle(_cancelled_job(world, "gpu", reason=reason), _routes(world), batch, NOW)
        assert answer["action"] == "ignored"
    assert batch.submitted == []


def _submit_permitted(policy: dict[str, Any], request: dict[str, Any]) -> bool:
    """moto's IAM policy evaluation (its implementation of IAM's ARN matching): SubmitJob is
    authorized on both the job queue and the job definition (Service Authorization Reference, Batch)."""
    from moto.iam.access_control import IAMPolicy, PermissionResult

    evaluate = IAMPolicy(json.dumps(policy)).is_action_permitted
    return all(
        evaluate("batch:SubmitJob", arn) == PermissionResult.PERMITTED
        for arn in (request["jobQueue"], request["jobDefinition"])
    )


def test_jobs_of_older_revisions_and_of_trainctl_image_families_are_resubmitted_and_permitted(
    world: World,
) -> None:
    """Issue 46: the resubmitter was allowed only the deployed `name:revision` ARNs, so a `trainctl run
    --image` job (its `<name>-trainctl` family) and a job submitted before a redeploy were refused."""
    from trainctl.submitting.preflight import describe_definition, with_image

    batch = Recorder(world.client("batch"))
    deployed = describe_definition(batch, world.training["gpu"])
    image_arn = with_image(batch, deployed, "123456789012.dkr.ecr.us-east-1.amazonaws.com/team:exp-7")
    # A redeploy that changes the definition registers a new revision; queued jobs keep their own.
    redeployed = batch.register_job_definition(
        jobDefinitionName=deployed["jobDefinitionName"], type="multinode", nodeProperties=deployed["nodeProperties"]
    )["jobDefinitionArn"]
    assert redeployed != world.training["gpu"] and image_arn.split("/")[1].split(":")[0].endswith("-trainctl")

    prefix, name = world.training["gpu"].split("/")[0] + "/", deployed["jobDefinitionName"]
    queues = [world.queues[q] for q in ("gpu", "gpu1", "gpu2")]
    statement = {"Effect": "Allow", "Action": "batch:SubmitJob"}
    # The resources the construct grants (definition_families), and the exact ARNs it granted before.
    families = {
        "Version": "2012-10-17",
        "Statement": [{**statement, "Resource": queues + definition_families(prefix, name)}],
    }
    exact = {"Version": "2012-10-17", "Statement": [{**statement, "Resource": [*queues, redeployed]}]}

    for definition in (image_arn, world.training["gpu"]):
        answer = resubmit.handle(_cancelled_job(world, "gpu", definition=definition), _routes(world), batch, NOW)
        assert answer["action"] == "resubmitted", answer
        request = batch.submitted[-1]
        assert request["jobDefinition"] == definition and request["jobQueue"] == world.queues["gpu1"]
        (job,) = batch.describe_jobs(jobs=[answer["successor"]])["jobs"]
        assert job["jobDefinition"] == definition  # the local API took it
        assert _submit_permitted(families, request) and not _submit_permitted(exact, request)
    # Nothing beyond the two families: another family, a longer name, another account.
    for other in (f"{prefix}other:1", f"{prefix}{name}x:1", f"{prefix}{name}-trainctlx:1"):
        assert not _submit_permitted(families, {"jobQueue": queues[1], "jobDefinition": other})
    foreign = prefix.replace(ACCOUNT, "210987654321") + f"{name}:1"
    assert not _submit_permitted(families, {"jobQueue": queues[1], "jobDefinition": foreign})


def test_the_last_open_placement_ends_the_chain_with_a_reason(world: World) -> None:
    batch = Recorder(world.client("batch"))
    # Placement 1's next is a Capacity Block whose window has not begun.
    answer = resubmit.handle(_cancelled_job(world, "gpu1"), _routes(world), batch, NOW)
    last = resubmit.handle(_cancelled_job(world, "gpu2"), _routes(world), batch, NOW)

    assert answer["action"] == "capacity-exhausted" and "window" in answer["reason"]
    assert last["action"] == "capacity-exhausted" and "no further placement" in last["reason"]
    assert batch.submitted == []


def test_a_capacity_block_is_used_inside_its_window_until_half_an_hour_and_a_start_before_its_end() -> None:
    """EC2 starts terminating a block's instances 30 minutes before its end (EC2 user guide, "Monitor
    Capacity Blocks using EventBridge"); a job sent there also needs its expected start time."""
    route = {"next": [{"placement": "2", "start": BLOCK.start, "end": BLOCK.end}]}
    end = datetime(2026, 12, 8, 11, 30, tzinfo=UTC)
    early, expected_start = resubmit.BLOCK_EARLY_END, resubmit.EXPECTED_START
    assert early == timedelta(minutes=30) and expected_start > timedelta(0)
    last = end - early - expected_start

    assert resubmit.next_placement(route, datetime(2026, 12, 1, 11, 29, tzinfo=UTC)) is None
    assert resubmit.next_placement(route, datetime(2026, 12, 1, 11, 30, tzinfo=UTC)) is not None
    assert resubmit.next_placement(route, last - timedelta(seconds=1)) is not None
    assert resubmit.next_placement(route, last) is None
    assert resubmit.next_placement(route, end - timedelta(minutes=30)) is None
    assert resubmit.next_placement(route, end - timedelta(minutes=1)) is None


def test_a_block_window_that_has_ended_is_refused_at_synth_in_one_line() -> None:
    from config.context import ConfigError, read_settings
    from tests.harness import THREE_FLEETS, VARIANTS

    context = {"fleets": json.dumps(THREE_FLEETS)}
    assert VARIANTS["three-fleets"]["fleets"] == context["fleets"]  # the harness's block, 2026-12-01..08
    end = datetime(2026, 12, 8, 11, 30, tzinfo=UTC)
    assert read_settings(context, now=end - timedelta(minutes=1)).fleet("llm").fallback[2].window == BLOCK
    with pytest.raises(ConfigError) as refused:
        read_settings(context, now=end)
    line = str(refused.value)
    assert line.startswith("context key fleets.llm.fallback[2].end='2026-12-08T11:30:00Z': the Capacity Block's")
    assert "ended before this synth (2026-12-08T11:30Z)" in line and "\n" not in line and len(line) <= 200
    # Without a clock (tests, the harness) nothing is judged by the date.
    assert read_settings(context).fleet("llm").fallback[2].window == BLOCK


# One job never spans two placements: each placement's queue holds exactly one compute environment,
# read from the synthesized template (tests/test_job_fallback.py, test_each_placement_has_a_queue_of_its_own_
# compute_environment_only); the queues this file builds for moto only mirror that.


# ----------------------------------------------------------------------------------------------- trainctl
@pytest.fixture
def trainctl(world: World) -> Any:
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), env=moto_environment(world.endpoint))


def test_why_names_fleet_placement_wait_and_next(world: World, trainctl: Any) -> None:
    job_id = world.client("batch").submit_job(
        jobName="waits", jobQueue=world.queues["gpu"], jobDefinition=world.training["gpu"]
    )["jobId"]
    created = datetime.now(UTC) - timedelta(minutes=7)
    world.set_job(job_id, "RUNNABLE", created=created.replace(tzinfo=None), reason=WAITING)

    result = trainctl("--json", "why", job_id)

    assert result.exit_code == 0, result.output
    reasons = json.loads(result.stdout)["reasons"]
    where = next(r for r in reasons if r.startswith("fleet gpu, placement 1 of 3"))
    assert "(us-east-1a p5e.48xlarge): EC2 has no capacity; waiting 7 min" in where
    assert any(r.startswith("next: ") and "placement 2 (us-east-1a p5.48xlarge)" in r for r in reasons)


def test_why_on_a_resubmitted_job_reads_its_own_placement(world: World, trainctl: Any) -> None:
    batch = world.client("batch")
    job_id = batch.submit_job(
        jobName="moved",
        jobQueue=world.queues["gpu1"],
        jobDefinition=world.training["gpu"],
        tags={"training:fallback-of": "abc"},
    )["jobId"]
    world.set_job(job_id, "RUNNABLE", reason=WAITING)

    reasons = json.loads(trainctl("--json", "why", job_id).stdout)["reasons"]

    assert any(r.startswith("fleet gpu, placement 2 of 3 (us-east-1a p5.48xlarge)") for r in reasons)
    assert any("after job abc was cancelled for capacity" in r for r in reasons)
    # The block's window is not open now: nothing after this placement takes the job.
    assert any("last open placement" in r for r in reasons)


def test_jobs_and_status_see_a_job_on_a_fallback_placement(world: World, trainctl: Any) -> None:
    def gpu_jobs() -> int:
        gpu = next(r for r in json.loads(trainctl("--json", "status").stdout) if r["fleet"] == "gpu")
        return sum(gpu["jobs"].values())

    before = gpu_jobs()
    batch = world.client("batch")
    job_id = batch.submit_job(jobName="moved", jobQueue=world.queues["gpu2"], jobDefinition=world.training["gpu"])[
        "jobId"
    ]
    rows = json.loads(trainctl("--json", "jobs", "--fleet", "gpu", "--since", "1d").stdout)
    assert [(r["fleet"], r["name"]) for r in rows if r["jobId"] == job_id] == [("gpu", "moved")]
    assert gpu_jobs() == before + 1


def test_status_says_which_placements_are_short_and_since_when(world: World, trainctl: Any) -> None:
    batch = world.client("batch")
    job_id = batch.submit_job(jobName="short", jobQueue=world.queues["gpu2"], jobDefinition=world.training["gpu"])[
        "jobId"
    ]
    world.set_job(job_id, "RUNNABLE", created=datetime(2026, 11, 24, 20, 15), reason=WAITING)

    rows = json.loads(trainctl("--json", "status").stdout)
    gpu = next(r for r in rows if r["fleet"] == "gpu")

    third = gpu["placements"][2]
    assert third["short"] is True and third["shortSince"] == "2026-11-24 20:15 UTC"
    assert "us-east-1b p5e.48xlarge cr-0a1b2c3d4e5f60718" in gpu["capacity"]
    spare = next(r for r in rows if r["fleet"] == "spare")
    assert spare["capacity"] == "no capacity wait reported" and len(spare["placements"]) == 1
    # The table says the same under it, for the fleet that waits only.
    lines = trainctl("status").stdout.splitlines()
    assert f"fleet gpu: {gpu['capacity']}" in [line.strip() for line in lines]
    assert not [line for line in lines if line.startswith("fleet spare:")]


def test_a_failed_tag_after_the_resubmission_does_not_raise_into_a_second_copy(world: World) -> None:
    class TagRefused:
        """moto's Batch, except that tagging is throttled after SubmitJob succeeded."""

        def __init__(self, batch: Any) -> None:
            self.batch, self.submitted = batch, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.batch, name)

        def submit_job(self, **request: Any) -> Any:
            self.submitted += 1
            return self.batch.submit_job(**request)

        def tag_resource(self, **_: Any) -> Any:
            raise RuntimeError("ThrottlingException: Rate exceeded")

    batch = TagRefused(world.client("batch"))
    answer = resubmit.handle(_cancelled_job(world, "gpu"), _routes(world), batch, NOW)

    assert answer["action"] == "resubmitted" and "Rate exceeded" in answer["tag_error"]
    assert batch.submitted == 1


def test_a_refused_resubmission_is_said_and_not_retried(world: World) -> None:
    detail = _cancelled_job(world, "gpu")
    detail["jobDefinition"] = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/gone:7"

    answer = resubmit.handle(detail, _routes(world), world.client("batch"), NOW)

    assert answer["action"] == "resubmit-failed" and "placement 1 refused" in answer["reason"]


def test_cost_counts_a_job_on_a_fallback_placement(world: World) -> None:
    from trainctl.deployment import load_deployment
    from trainctl.fleet.cost import finished_usages

    batch = world.client("batch")
    job_id = batch.submit_job(
        jobName="moved-and-ran", jobQueue=world.queues["gpu1"], jobDefinition=world.training["gpu"]
    )["jobId"]
    started = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=2)
    world.set_job(job_id, "SUCCEEDED", created=started, started=started, stopped=started + timedelta(hours=1))
    deployment = load_deployment(world.client("cloudformation"), REGION)

    usages = [
        u for u in finished_usages(batch, deployment, datetime.now(UTC) - timedelta(days=1)) if u.job_id == job_id
    ]

    # Its type is the one the job names (the resubmitter's override; moto keeps the definition's).
    assert [(u.fleet, u.run_ms) for u in usages] == [("gpu", 3_600_000)]


def test_a_trainctl_job_resubmitted_from_its_unmerged_describe_keeps_its_command_environment_and_nodes(
    world: World, trainctl: Any, tmp_path: Any
) -> None:
    """DescribeJobs has no nodeOverrides (API JobDetail), and whether its nodeProperties carry them merged in is
    not documented. moto's describe shows the job definition's own node properties, the unmerged form, which
    `trainctl rehearse` plays by default: a job sent with overrides alone comes back as the definition's; one
    trainctl submitted comes back whole, because its revision carries them (trainctl/submitting/revisions.py)."""
    from trainctl.submitting.taskfile import LAUNCHER

    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\nnodes: 2\ncommand: python train.py --lr 3e-4\nenv: {LR: '3e-4'}\n")
    result = trainctl("--json", "run", str(task))
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["jobId"]
    world.set_job(job_id, "FAILED", reason=CANCELLED)
    batch = Recorder(world.client("batch"))
    detail = dict(batch.describe_jobs(jobs=[job_id])["jobs"][0])
    assert detail["jobDefinition"] != world.training["gpu"]

    answer = resubmit.handle(detail, _routes(world), batch, NOW)

    assert answer["action"] == "resubmitted"
    request = batch.submitted[-1]
    (node_range,) = request["nodeOverrides"]["nodePropertyOverrides"]
    container = node_range["containerOverrides"]
    assert container["command"] == [LAUNCHER, "python", "train.py", "--lr", "3e-4"]
    assert {"name": "LR", "value": "3e-4"} in container["environment"]
    assert request["nodeOverrides"]["numNodes"] == 2 and request["jobDefinition"] == detail["jobDefinition"]

    # The same job sent with nodeOverrides on the deployed definition alone (as trainctl did before) loses them.
    overrides = {"numNodes": 2, "nodePropertyOverrides": [{"targetNodes": "0:", "containerOverrides": {
        "command": [LAUNCHER, "python", "train.py"], "environment": [{"name": "LR", "value": "3e-4"}]}}]}  # fmt: skip
    plain = _cancelled_job(world, "gpu", nodeOverrides=overrides)
    resubmit.handle(plain, _routes(world), batch, NOW)
    (lost,) = batch.submitted[-1]["nodeOverrides"]["nodePropertyOverrides"]
    assert lost["containerOverrides"].get("command") != [LAUNCHER, "python", "train.py"]
    assert {"name": "LR", "value": "3e-4"} not in lost["containerOverrides"]["environment"]
