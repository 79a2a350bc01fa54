"""The resumed-job alert's function (training_constructs/observability/resumed_alert_function/announce.py)
against moto's SNS on 127.0.0.1: a job resumed after its third attempt is announced with that attempt,
not the first; a job the capacity fallback resubmitted names the job whose lineage it continues."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.local_aws import moto_server
from training_constructs.observability.resumed_alert_function import announce

T0 = 1_795_432_800_000


def attempt(number: int, exit_code: int, reason: str) -> dict[str, Any]:
    return {
        "startedAt": T0 + number * 600_000,
        "stoppedAt": T0 + number * 600_000 + 300_000,
        "statusReason": reason,
        "container": {"exitCode": exit_code, "logStreamName": f"training/default/attempt{number}"},
    }


# A Batch job state change event (Batch user guide, "Job state change events"): RUNNABLE again after a
# third attempt, lost with its host, that followed two node faults.
EVENT = {
    "detail-type": "Batch Job State Change",
    "source": "aws.batch",
    "detail": {
        "jobName": "llama-7b-run_3",
        "jobId": "4c7599ae-0a82-49aa-ba5a-4727fcce14a8",
        "jobQueue": "arn:aws:batch:us-east-1:123456789012:job-queue/queue",
        "status": "RUNNABLE",
        "attempts": [
            attempt(1, 75, "Essential container in task exited"),
            attempt(2, 75, "Essential container in task exited"),
            attempt(3, 143, "Host EC2 (instance i-0abc) terminated."),
        ],
        "tags": {"team": "llm"},
    },
}


@pytest.fixture(scope="module")
def inbox(monkeypatch_module: Any) -> Iterator[Any]:
    with moto_server() as endpoint:
        for name, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch_module.setenv(name, value)
        sns, sqs = boto3.client("sns"), boto3.client("sqs")
        topic = sns.create_topic(Name="alerts")["TopicArn"]
        queue = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        monkeypatch_module.setenv(announce.TOPIC_ENV, topic)

        def received() -> list[dict[str, Any]]:
            messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
            for message in messages:
                sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            return [json.loads(m["Body"]) for m in messages]

        yield received


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_alert_names_the_latest_attempt_not_the_first(inbox: Any) -> None:
    announce.handler(EVENT, None)

    (notification,) = inbox()
    text = notification["Message"]
    assert notification["Subject"] == "Training job llama-7b-run_3 resuming: attempt 4"
    assert "after attempt 3 failed (exit 143, Host EC2 (instance i-0abc) terminated.)" in text
    assert "log stream training/default/attempt3" in text
    assert "attempt1" not in text and "exit 75" not in text
    assert f"`trainctl why {EVENT['detail']['jobId']}`" in text and "lineage" not in text


def test_a_resubmitted_job_names_the_job_whose_lineage_it_continues(inbox: Any) -> None:
    detail = {
        **EVENT["detail"],
        "attempts": [attempt(1, 75, "Essential container in task exited")],
        "tags": {"training:fallback-of": "0f1e2d3c", "training:placement": "1"},
    }

    announce.handler({**EVENT, "detail": detail}, None)

    (notification,) = inbox()
    assert "after attempt 1 failed (exit 75, Essential container in task exited)" in notification["Message"]
    assert "continues job 0f1e2d3c's lineage (capacity fallback)" in notification["Message"]
    assert notification["Subject"].endswith("attempt 2")
