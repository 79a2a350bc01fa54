"""`trainctl why`'s story of every attempt (trainctl/inspecting/recovery.py): a job resumed after a node fault says
which node failed, what it found and how long the resume took, reading the main node's log on a local
AWS API (moto on 127.0.0.1)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from tests.local_aws import moto_server
from trainctl.inspecting.recovery import attempt_story, log_tail, node_line
from trainctl.inspecting.why import explain

MAIN_LINE = (
    "distributed_run.sh: node 1 (ip-10-0-1-7): preflight failed on node 1 (ip-10-0-1-7): expected 32 EFA devices "
    "(uverbs*) in /dev/infiniband, found 31; this node asks its host to take it out; ending this job with exit 75 "
    "so that Batch retries it on other nodes"
)
T0 = 1_795_432_800_000


def job(status: str = "RUNNING") -> dict[str, Any]:
    return {
        "jobId": "4c75",
        "jobName": "llm-run",
        "status": status,
        "nodeProperties": {
            "nodeRangeProperties": [{"container": {"logConfiguration": {"options": {"awslogs-group": "training-llm"}}}}]
        },
        "attempts": [
            {
                "startedAt": T0,
                "stoppedAt": T0 + 100_000,
                "statusReason": "Essential container in task exited",
                "container": {"exitCode": 75, "logStreamName": "training/default/a1"},
            },
            {"startedAt": T0 + 100_000 + 420_000, "container": {}},
        ],
    }


@pytest.fixture(scope="module")
def logs() -> Iterator[Any]:
    with moto_server() as endpoint:
        yield boto3.client(
            "logs",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",  # noqa: S106 - moto's
        )


def test_the_story_names_the_node_what_it_found_and_the_resume_time(logs: Any) -> None:
    import time

    logs.create_log_group(logGroupName="training-llm")
    logs.create_log_stream(logGroupName="training-llm", logStreamName="training/default/a1")
    now = int(time.time() * 1000)
    logs.put_log_events(
        logGroupName="training-llm",
        logStreamName="training/default/a1",
        logEvents=[
            {"timestamp": now - 3000, "message": "distributed_run.sh: node 0 of 2 (rank 0, main 0), 8 processes"},
            {"timestamp": now - 2000, "message": MAIN_LINE},
            {"timestamp": now - 1000, "message": '{"_aws": {}}'},
        ],
    )
    first, second = attempt_story(job(), log_tail(logs))
    assert first.startswith("attempt 1 of 2; ran ")
    assert "exit 75: a node fault or a lost node (retried on fresh nodes)" in first
    assert "node 1 (ip-10-0-1-7): preflight failed on node 1 (ip-10-0-1-7): expected 32 EFA devices" in first
    assert "found 31; the node asked its host to take it out" in first
    assert "ending this job" not in first
    assert first.endswith("resumed 7.0 min later on fresh nodes")
    assert second == "attempt 2 of 2"


HANG = (
    "distributed_run.sh: node 1 (ip-10-0-1-9): hang: no progress on any node for 301 s (limit 300 s); rank 9 on "
    "node 1 stopped first (last progress 12:03:04 UTC, stopped: state T); stacks at s3://ckpt/runs/4c75/evidence/"
    "attempt-{n}/; {ending}"
)


def test_a_hang_reads_as_a_hang_retried_once_then_reported_with_where_its_stacks_are(logs: Any) -> None:
    lines = {
        "training/default/h1": HANG.format(n=1, ending="retried once; ending this job with exit 75 so that Batch..."),
        "training/default/h2": HANG.format(n=2, ending="a hang again on attempt 2; ending this job with exit 124"),
    }
    logs.create_log_group(logGroupName="training-hang")
    for stream, line in lines.items():
        logs.create_log_stream(logGroupName="training-hang", logStreamName=stream)
        logs.put_log_events(
            logGroupName="training-hang", logStreamName=stream, logEvents=[{"timestamp": T0, "message": line}]
        )
    hung = job("FAILED")
    hung["nodeProperties"]["nodeRangeProperties"][0]["container"]["logConfiguration"]["options"]["awslogs-group"] = (
        "training-hang"
    )
    hung["attempts"] = [
        {
            "startedAt": T0,
            "stoppedAt": T0 + 1000,
            "container": {"exitCode": 75, "logStreamName": "training/default/h1"},
        },
        {
            "startedAt": T0 + 9000,
            "stoppedAt": T0 + 9900,
            "container": {"exitCode": 124, "logStreamName": "training/default/h2"},
        },
    ]
    first, second = attempt_story(hung, log_tail(logs))
    assert "exit 75: a hang (retried once on fresh nodes; a node is taken out only with a hardware sign)" in first
    assert "node 1 (ip-10-0-1-9): hang: no progress on any node for 301 s" in first
    assert "rank 9 on node 1 stopped first" in first and "ending this job" not in first
    assert "evidence: s3://ckpt/runs/4c75/evidence/attempt-1/" in first
    assert "exit 124: a hang again after its retry (not retried)" in second
    assert "evidence: s3://ckpt/runs/4c75/evidence/attempt-2/" in second
    reasons = explain(hung, queue=None, environment=None, instance=None, now=datetime.now(UTC), tail=log_tail(logs))
    assert any("evidence: s3://ckpt/runs/4c75/evidence/attempt-2/" in r for r in reasons.reasons)


def test_without_the_log_the_story_points_to_the_stream() -> None:
    (first, _) = attempt_story(job())
    assert "the main node's log stream training/default/a1 names the node and what it found" in first


def test_why_tells_the_story_of_a_running_resumed_job() -> None:
    explanation = explain(job(), queue=None, environment=None, instance=None, now=datetime.now(UTC))
    assert explanation.reasons[0].startswith("the job is RUNNING")
    assert explanation.reasons[1].startswith("attempt 1 of 2") and explanation.reasons[2] == "attempt 2 of 2"


def test_an_application_error_and_a_lost_host_read_as_such() -> None:
    failed = job("FAILED")
    failed["attempts"] = [
        {"startedAt": T0, "stoppedAt": T0 + 1000, "statusReason": "Host EC2 (instance i-0abc) terminated."},
        {"startedAt": T0 + 61_000, "stoppedAt": T0 + 90_000, "container": {"exitCode": 1}},
    ]
    lost, app = attempt_story(failed)
    assert "its instance was lost (retried on fresh nodes)" in lost and lost.endswith(
        "resumed 60 s later on fresh nodes"
    )
    assert "exit 1: the application failed (not retried)" in app


def test_a_lost_node_is_not_said_to_have_taken_itself_out_and_an_application_error_is_quoted(logs: Any) -> None:
    lost = (
        "distributed_run.sh: node 1: no word for 20 s and Batch does not show it ended: lost (its host or container "
        "gone); ending this job with exit 75 so that Batch retries it on other nodes"
    )
    bug = (
        "distributed_run.sh: node 1 (ip-10-0-1-7): rank 5 failed: ValueError: shapes do not match (exit 1); 2 of 2 "
        "nodes failed with an application error, none with a node fault; ending this job with exit 1 (the "
        "application's error, not retried)"
    )
    logs.create_log_group(logGroupName="training-app")
    for stream, line in (("training/default/l1", lost), ("training/default/b2", bug)):
        logs.create_log_stream(logGroupName="training-app", logStreamName=stream)
        logs.put_log_events(logGroupName="training-app", logStreamName=stream,
                            logEvents=[{"timestamp": T0, "message": line}])  # fmt: skip
    story = job("FAILED")
    story["nodeProperties"] = {"nodeRangeProperties": [
        {"container": {"logConfiguration": {"options": {"awslogs-group": "training-app"}}}}]}  # fmt: skip
    story["attempts"] = [
        {"startedAt": T0, "stoppedAt": T0 + 1000,
         "container": {"exitCode": 75, "logStreamName": "training/default/l1"}},
        {"startedAt": T0 + 61_000, "stoppedAt": T0 + 90_000,
         "container": {"exitCode": 1, "logStreamName": "training/default/b2"}},
    ]  # fmt: skip
    first, second = attempt_story(story, log_tail(logs))
    assert "node 1: no word for 20 s and Batch does not show it ended: lost" in first
    assert "take it out" not in first and "took itself out" not in first
    assert "exit 1: the application failed (not retried)" in second
    assert "node 1 (ip-10-0-1-7): rank 5 failed: ValueError: shapes do not match (exit 1)" in second


def test_node_line_takes_the_launchers_hardware_line_too() -> None:
    line = "distributed_run.sh: node 0 (ip-1): trainer exited 1 on a hardware fault: NVIDIA Xid 79; exiting 75 so..."
    assert node_line(["noise", line]) == "node 0 (ip-1): trainer exited 1 on a hardware fault: NVIDIA Xid 79"
    assert node_line(["distributed_run.sh: node 0 of 2 (rank 0, main 0)"]) is None


def test_node_line_takes_the_watchers_line_that_names_no_host() -> None:
    # A child that died without a report: the main node's watcher read it in Batch (container/launcher/node_watch.py).
    line = (
        "distributed_run.sh: node 1: Batch says FAILED: Essential container in task exited, exit code 137; "
        "ending this job with exit 75 so that Batch retries it on other nodes"
    )
    assert node_line([line]) == "node 1: Batch says FAILED: Essential container in task exited, exit code 137"


def test_the_exit_codes_are_the_launchers():
    # trainctl reads attempts' exit codes with the launcher's meanings (container/launcher/ runs as a
    # folder whose modules import one another by name, so it is put on the path as the launcher tests do).
    import importlib.util
    from pathlib import Path

    from trainctl.inspecting import recovery

    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).parent.parent / "container" / "launcher" / f"{name}.py"
        )
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    preflight = load("preflight")
    assert recovery.NODE_FAULT_EXIT == preflight.PREFLIGHT_EXIT
    sys.path.insert(0, str(Path(__file__).parent.parent / "container" / "launcher"))  # they import neighbours
    import ending
    import progress_watch

    assert recovery.HANG_EXIT == progress_watch.HANG_EXIT == ending.HANG_EXIT
    assert recovery.SHARED_FAULT_EXIT == preflight.IMAGE_EXIT == ending.IMAGE_EXIT
    assert recovery.NODE_FAULT_EXIT == ending.NODE_FAULT_EXIT
