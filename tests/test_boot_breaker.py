"""The node-fault circuit breaker's function against moto's Batch, CloudWatch Logs and SNS on 127.0.0.1:
K node faults of one fleet (boot-check node faults and take-outs the host confirmed, both lines the hosts
write to the fleet's boot-check log group) disable that fleet's compute environment and no other; fewer,
shared faults, unconfirmed take-outs, lines older than the lookback, and anything a job prints into its own
log group, disable nothing; a fleet of 64 nodes needs a tenth of them; Batch refusing the change while the
environment is being updated is waited out. The template side (alarm, rule, IAM) is in
tests/test_fleet_health.py."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from config import metrics
from tests.harness import ROOT
from tests.local_aws import moto_server
from tests.trainctl_world import ACCOUNT, REGION, moto_environment
from training_constructs.health import boot_breaker
from training_constructs.health.boot_breaker_function import trip

K = boot_breaker.NODE_FAULTS_TO_TRIP
FLEETS = ("gpu", "llm")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def world(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Two fleets, each with an ENABLED compute environment and a boot-check log group, and the alert
    topic with a queue subscribed to read what the function publishes."""
    import boto3
    from moto.batch.models import ComputeEnvironment, batch_backends

    for key, value in moto_environment(endpoint).items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)

    def client(service: str) -> Any:
        return boto3.client(service, region_name=REGION, endpoint_url=endpoint)

    backend = batch_backends[ACCOUNT][REGION]
    environments = {}
    for fleet in FLEETS:
        # Put straight into moto's store: CreateComputeEnvironment would start its EC2 emulation (~3 s).
        environment = ComputeEnvironment(
            f"{fleet}-compute",
            "MANAGED",
            "ENABLED",
            {"type": "EC2", "minvCpus": 0, "maxvCpus": 96, "instanceTypes": ["g6.12xlarge"]},
            f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/batch.amazonaws.com/AWSServiceRoleForBatch",
            account_id=ACCOUNT,
            region_name=REGION,
        )
        backend._compute_environments[environment.arn] = environment
        environments[fleet] = environment.arn
        client("logs").create_log_group(logGroupName=f"/boot/{fleet}")
        client("logs").create_log_group(logGroupName=f"/jobs/{fleet}")
    topic = client("sns").create_topic(Name="alerts")["TopicArn"]
    queue = client("sqs").create_queue(QueueName="alerts-inbox")["QueueUrl"]
    queue_arn = client("sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    monkeypatch.setenv(trip.LOOKBACK_ENV, str(int(boot_breaker.LOOKBACK.to_seconds())))
    monkeypatch.setenv(trip.TOPIC_ENV, topic)
    yield {"client": client, "environments": environments, "queue": queue}
    for fleet in FLEETS:
        client("logs").delete_log_group(logGroupName=f"/boot/{fleet}")
        client("logs").delete_log_group(logGroupName=f"/jobs/{fleet}")
        del backend._compute_environments[environments[fleet]]
    client("sns").delete_topic(TopicArn=topic)
    client("sqs").delete_queue(QueueUrl=queue)


def boot_lines(world: dict[str, Any], fleet: str, faults: list[str], age_seconds: float = 60) -> None:
    """One boot-check line per node, as boot_check.py ships them: one stream per instance."""
    logs = world["client"]("logs")
    for i, fault in enumerate(faults):
        stream = f"i-{fleet}{len(faults)}{i:04d}{int(age_seconds)}"
        failed = {"node": ["gpus: expected 4, found 3"], "shared": ["vulkan_icd: expected nvidia_icd*.json, found []"]}
        line = {
            "Fleet": fleet,
            "Fault": fault,
            "BootCheckFailed": int(fault != "none"),
            "failed": failed.get(fault, []),
        }
        logs.create_log_stream(logGroupName=f"/boot/{fleet}", logStreamName=stream)
        logs.put_log_events(
            logGroupName=f"/boot/{fleet}",
            logStreamName=stream,
            logEvents=[{"timestamp": int((time.time() - age_seconds) * 1000), "message": json.dumps(line)}],
        )


def states(world: dict[str, Any]) -> dict[str, str]:
    described = world["client"]("batch").describe_compute_environments(
        computeEnvironments=list(world["environments"].values())
    )["computeEnvironments"]
    by_arn = {e["computeEnvironmentArn"]: e["state"] for e in described}
    return {fleet: by_arn[arn] for fleet, arn in world["environments"].items()}


def alerts(world: dict[str, Any]) -> list[str]:
    received = world["client"]("sqs").receive_message(QueueUrl=world["queue"], MaxNumberOfMessages=10)
    return [json.loads(m["Body"])["Message"] for m in received.get("Messages", [])]


def host_take_outs(world: dict[str, Any], fleet: str, failed: list[list[str]], first: int = 0) -> None:
    """One take-out line per node as its host's check sends it (node_scripts/boot_check.py confirm), to the
    instance's stream of the boot-check log group: TakeOutConfirmed 1 when the host found a fault, else 0."""
    logs = world["client"]("logs")
    for i, found in enumerate(failed, start=first):
        instance = f"i-{fleet}take{i:04d}"
        line = {"Fleet": fleet, "TakeOutConfirmed": int(bool(found)), "InstanceId": instance, "failed": found}
        logs.create_log_stream(logGroupName=f"/boot/{fleet}", logStreamName=instance)
        logs.put_log_events(
            logGroupName=f"/boot/{fleet}",
            logStreamName=instance,
            logEvents=[{"timestamp": int(time.time() * 1000), "message": json.dumps(line)}],
        )


def job_printed_lines(world: dict[str, Any], fleet: str, count: int) -> None:
    """What a job can print into its own log stream (the awslogs driver ships it to the fleet's job log
    group): the launcher's take-out line, and forgeries of the hosts' own lines, `count` of each."""
    sys.path.insert(0, str(ROOT / "container" / "launcher"))
    import node_fault

    logs = world["client"]("logs")
    stream = f"training/default/{fleet}{count}"
    logs.create_log_stream(logGroupName=f"/jobs/{fleet}", logStreamName=stream)
    forged = [
        {"Fleet": fleet, "TakeOutConfirmed": 1, "InstanceId": "i-forged", "failed": ["gpus: expected 4, found 3"]},
        {"Fleet": fleet, "Fault": "node", "BootCheckFailed": 1, "failed": ["gpus: expected 4, found 3"]},
    ]
    lines = [node_fault.emf_line(fleet, str(i), "hardware fault: Xid 79") for i in range(count)]
    lines += [json.dumps({**line, "InstanceId": f"i-forged{i}"}) for i in range(count) for line in forged]
    logs.put_log_events(
        logGroupName=f"/jobs/{fleet}",
        logStreamName=stream,
        logEvents=[{"timestamp": int(time.time() * 1000), "message": line} for line in lines],
    )


def trip_event(world: dict[str, Any], fleet: str, threshold: int = K) -> dict[str, Any]:
    """The rule's constant input for `fleet` (training_constructs/health/boot_breaker.py)."""
    return {
        "fleet": fleet,
        "computeEnvironments": [world["environments"][fleet]],
        "logGroup": f"/boot/{fleet}",
        "nodeFaultsToTrip": threshold,
    }


def test_k_node_faults_disable_that_fleet_only(world):
    boot_lines(world, "gpu", ["node"] * K + ["none"])
    boot_lines(world, "llm", ["node"] * (K - 1))
    assert trip.handler(trip_event(world, "gpu")) == {"tripped": True, "nodeFaults": K}
    assert states(world) == {"gpu": "DISABLED", "llm": "ENABLED"}
    (message,) = alerts(world)
    assert message.startswith(f"Fleet gpu: {K} nodes failed the boot check with a node fault and 0 were taken out ")
    assert f"gpus: expected 4, found 3 ({K} nodes)" in message
    command = (
        f"aws batch update-compute-environment --compute-environment {world['environments']['gpu']} --state ENABLED"
    )
    assert message.endswith(command) and "/boot/gpu" in message


def test_every_placement_of_the_fleet_is_disabled(world):
    # A fleet with a fallback placement: its nodes log to the fleet's group, so both environments stop
    # (here llm's environment stands in for gpu's fallback placement).
    boot_lines(world, "gpu", ["node"] * K)
    event = trip_event(world, "gpu") | {"computeEnvironments": [world["environments"][f] for f in ("gpu", "llm")]}
    assert trip.handler(event)["tripped"] is True
    assert states(world) == {"gpu": "DISABLED", "llm": "DISABLED"}
    (message,) = alerts(world)
    assert message.count("aws batch update-compute-environment") == 2


def test_below_k_nothing_happens(world):
    boot_lines(world, "llm", ["node"] * (K - 1) + ["shared"] * 5 + ["none"] * 3)
    assert trip.handler(trip_event(world, "llm")) == {"tripped": False, "nodeFaults": K - 1}
    assert states(world) == {"gpu": "ENABLED", "llm": "ENABLED"}
    assert alerts(world) == []


def test_faults_older_than_the_lookback_do_not_count(world):
    lookback = boot_breaker.LOOKBACK.to_seconds()
    assert lookback >= 2 * boot_breaker.WINDOW.to_seconds()  # covers the alarm's whole period, late
    boot_lines(world, "gpu", ["node"] * K, age_seconds=lookback + 600)
    boot_lines(world, "gpu", ["node"])
    assert trip.handler(trip_event(world, "gpu")) == {"tripped": False, "nodeFaults": 1}
    assert states(world)["gpu"] == "ENABLED"


def test_lines_that_are_not_boot_check_json_are_skipped(world):
    logs = world["client"]("logs")
    logs.create_log_stream(logGroupName="/boot/gpu", logStreamName="noise")
    logs.put_log_events(
        logGroupName="/boot/gpu",
        logStreamName="noise",
        logEvents=[{"timestamp": int(time.time() * 1000), "message": m} for m in ("not json", "[1]", '"node"')],
    )
    boot_lines(world, "gpu", ["node"] * K)
    assert trip.handler(trip_event(world, "gpu"))["nodeFaults"] == K


def test_the_function_reads_the_fields_the_boot_check_writes():
    # The asset cannot import config/: its copy of the names must match, or it would count 0 faults.
    assert (metrics.FAULT_DIMENSION, metrics.BOOT_FAULTS[0]) == (trip.FAULT_FIELD, trip.NODE_FAULT)
    assert metrics.TAKE_OUT_CONFIRMED == trip.CONFIRMED_FIELD


def test_take_outs_the_host_confirmed_count_with_boot_faults_towards_the_same_breaker(world):
    boot_lines(world, "gpu", ["node"])
    host_take_outs(world, "gpu", [["gpus: expected 4, found 3"]] * (K - 1))
    host_take_outs(world, "gpu", [[]] * K, first=K)  # taken out, the host found nothing: not counted
    host_take_outs(world, "llm", [["xid: expected [], found [79]"]] * K)  # another fleet's: not gpu's
    assert trip.handler(trip_event(world, "gpu")) == {"tripped": True, "nodeFaults": K}
    assert states(world) == {"gpu": "DISABLED", "llm": "ENABLED"}
    (message,) = alerts(world)
    assert f"1 nodes failed the boot check with a node fault and {K - 1} were taken out during a job with a " in message
    assert f"taken out: gpus: expected 4, found 3 ({K - 1} nodes)" in message and "/boot/gpu" in message
    assert "/jobs/" not in message


def test_unconfirmed_take_outs_do_not_count(world):
    host_take_outs(world, "gpu", [[]] * (K + 2))
    assert trip.handler(trip_event(world, "gpu")) == {"tripped": False, "nodeFaults": 0}
    assert states(world)["gpu"] == "ENABLED" and alerts(world) == []


def test_a_host_line_sent_twice_counts_once(world):
    host_take_outs(world, "gpu", [["gpus: expected 4, found 3"]] * (K - 1))
    logs = world["client"]("logs")
    (event,) = logs.get_log_events(logGroupName="/boot/gpu", logStreamName="i-gputake0000")["events"]
    logs.put_log_events(
        logGroupName="/boot/gpu",
        logStreamName="i-gputake0000",
        logEvents=[{"timestamp": int(time.time() * 1000), "message": event["message"]}],
    )
    assert trip.handler(trip_event(world, "gpu")) == {"tripped": False, "nodeFaults": K - 1}


def test_nothing_a_job_prints_moves_the_breaker(world):
    # Three times the threshold of the launcher's take-out lines and of forged host lines, in the job log group
    # (the only group a job's output reaches): the function never reads it.
    job_printed_lines(world, "gpu", 3 * K)
    boot_lines(world, "gpu", ["node"] * (K - 1))
    assert trip.handler(trip_event(world, "gpu")) == {"tripped": False, "nodeFaults": K - 1}
    assert states(world) == {"gpu": "ENABLED", "llm": "ENABLED"} and alerts(world) == []


def test_a_64_node_fleet_needs_a_tenth_of_its_nodes(world):
    threshold = boot_breaker.node_faults_to_trip(64)
    assert threshold == 7
    host_take_outs(world, "gpu", [["xid: expected [], found [79]"]] * 4)
    boot_lines(world, "gpu", ["node"] * 2)
    assert trip.handler(trip_event(world, "gpu", threshold)) == {"tripped": False, "nodeFaults": 6}
    assert states(world)["gpu"] == "ENABLED"
    boot_lines(world, "gpu", ["node"])
    assert trip.handler(trip_event(world, "gpu", threshold)) == {"tripped": True, "nodeFaults": 7}
    assert states(world)["gpu"] == "DISABLED"


def refusing_update(monkeypatch: pytest.MonkeyPatch, refusals: int) -> list[str]:
    """moto's Batch (the same process as its server) refuses the first `refusals` updates as Batch does a
    request it will not take now: ClientException, HTTP 400, while the environment's status is UPDATING."""
    from moto.batch.exceptions import ClientException
    from moto.batch.models import batch_backends

    backend = batch_backends[ACCOUNT][REGION]
    real = backend.update_compute_environment
    seen: list[str] = []

    def update(compute_environment_name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(compute_environment_name)
        environment = backend.get_compute_environment(compute_environment_name)
        if len(seen) <= refusals:
            environment.status = "UPDATING"
            raise ClientException(f"{compute_environment_name} is being updated")
        environment.status = "VALID"
        return real(compute_environment_name, *args, **kwargs)

    monkeypatch.setattr(backend, "update_compute_environment", update)
    return seen


def test_a_refusal_during_an_update_is_retried_with_a_growing_backoff(world, monkeypatch):
    seen = refusing_update(monkeypatch, refusals=3)
    waits: list[float] = []
    monkeypatch.setattr(trip, "_wait", waits.append)
    boot_lines(world, "gpu", ["node"] * K)
    assert trip.handler(trip_event(world, "gpu"))["tripped"] is True
    assert states(world)["gpu"] == "DISABLED"
    assert len(seen) == 4 and waits == [trip.FIRST_BACKOFF_SECONDS * 2**i for i in range(3)]
    assert len(alerts(world)) == 1


def test_a_refusal_that_outlasts_the_deadline_fails_the_invocation_loudly(world, monkeypatch):
    refusing_update(monkeypatch, refusals=1000)
    monkeypatch.setattr(trip, "UPDATE_DEADLINE_SECONDS", 0.5)
    monkeypatch.setattr(trip, "FIRST_BACKOFF_SECONDS", 0.05)
    boot_lines(world, "gpu", ["node"] * K)
    # Raised: Lambda retries the invocation and the function's Errors alarm pages.
    with pytest.raises(RuntimeError, match=r"Batch kept refusing to disable .*ClientException"):
        trip.handler(trip_event(world, "gpu"))
    assert states(world)["gpu"] == "ENABLED" and alerts(world) == []


def test_an_error_that_waiting_cannot_fix_is_not_retried():
    class Denied(Exception):
        def __init__(self, text: str) -> None:
            super().__init__(text)
            self.response = {"Error": {"Code": "AccessDeniedException"}}

    class Batch:
        calls = 0

        def update_compute_environment(self, **_: Any) -> None:
            Batch.calls += 1
            raise Denied("not allowed")

    with pytest.raises(Denied):
        trip.disable(Batch(), "arn", deadline=time.monotonic() + 60, sleep=lambda _: None)
    assert Batch.calls == 1
