"""The budget functions (config/budget_functions.py) against moto's Batch, DynamoDB and SNS on 127.0.0.1:
the ledger keeps the newest event, a job submitted around trainctl that cannot fit is cancelled on arrival,
80% alerts once, 100% cancels that team's queued jobs and terminates its running ones with the budget
reason, and a second enforcement changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from config import budget_functions as functions
from config import budget_ledger as ledger
from tests.trainctl_world import World, moto_environment, served_world

TEAMS = {"llama": 1000.0, "vision": 1000.0}


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, Any]]:
    """The world's queues, a ledger table, the alert topic with a queue subscribed, and the functions'
    environment; one moto server for the module."""
    with served_world() as world, pytest.MonkeyPatch.context() as patch:
        for name, value in moto_environment(world.endpoint).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        table = create_ledger(boto3.resource("dynamodb"), "ledger")
        sns, sqs = boto3.client("sns"), boto3.client("sqs")
        topic = sns.create_topic(Name="job-alerts")["TopicArn"]
        inbox = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=inbox_arn)
        document = {
            "table": "ledger",
            "teams": TEAMS,
            "defaultTeam": None,
            "fairShare": False,
            # The gpu fleet's g6.12xlarge at a price that makes the figures round.
            "queues": [{"queue": world.queues["gpu"], "fleet": "gpu", "instanceType": "g6.12xlarge", "usdPerHour": 10}],
            "timeoutSeconds": 3600,
        }
        patch.setenv(functions.BUDGETS_ENV, json.dumps(document))
        patch.setenv(functions.TOPIC_ENV, topic)

        def received() -> list[dict[str, Any]]:
            messages = sqs.receive_message(QueueUrl=inbox, MaxNumberOfMessages=10).get("Messages", [])
            for message in messages:
                sqs.delete_message(QueueUrl=inbox, ReceiptHandle=message["ReceiptHandle"])
            return [json.loads(m["Body"]) for m in messages]

        yield {"world": world, "table": table, "budgets": ledger.Budgets.parse(document), "inbox": received}


def create_ledger(dynamodb: Any, name: str) -> Any:
    """The ledger table as training_constructs/budgets/team_budgets.py defines it."""
    return dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "month", "KeyType": "HASH"}, {"AttributeName": "job", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "month", "AttributeType": "S"},
            {"AttributeName": "job", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def spend(table: Any, team: str, usd: float, job: str) -> None:
    """Put an ended job of `usd` dollars in the ledger: one node for the minute before now."""
    now = functions.now_ms()
    entry = ledger.Entry(
        team=team, job_id=job, job_name=job, fleet="gpu", instance_type="g6.12xlarge", nodes=1,
        usd_per_hour=usd * 60, spans=((now - 60_000, now),), progress=3,
    )  # fmt: skip
    functions.record(table, entry, now)


def detail_of(world: World, job_id: str, status: str) -> dict[str, Any]:
    batch = world.client("batch")
    described = batch.describe_jobs(jobs=[job_id])["jobs"][0]
    return {**described, "status": status, "attempts": []}


def test_the_ledger_keeps_the_newest_event_of_a_job(env: dict[str, Any]) -> None:
    budgets, table = env["budgets"], env["table"]
    world: World = env["world"]
    queue = world.queues["gpu"]
    now = functions.now_ms()
    running = {
        "jobId": "job-1", "jobName": "llm", "jobQueue": queue, "status": "RUNNING", "startedAt": now - 3_600_000,
        "attempts": [], "nodeProperties": {"numNodes": 2}, "tags": {ledger.TEAM_TAG: "vision"},
    }  # fmt: skip
    ended = {**running, "status": "SUCCEEDED", "stoppedAt": now - 1_800_000}
    ended["attempts"] = [{"startedAt": running["startedAt"], "stoppedAt": ended["stoppedAt"]}]

    queued = {**running, "status": "RUNNABLE", "startedAt": None}
    functions.on_job_event({"detail": queued}, None)
    # A job that never ran leaves nothing in the ledger.
    assert "Item" not in table.get_item(Key={"month": ledger.RUNNING, "job": "vision#job-1"})
    functions.on_job_event({"detail": running}, None)
    running_item = table.get_item(Key={"month": ledger.RUNNING, "job": "vision#job-1"}).get("Item")
    assert running_item is not None and running_item["spans"][0][1] == 0
    functions.on_job_event({"detail": ended}, None)
    # A late RUNNING event (EventBridge does not promise order) must not reopen the ended job.
    functions.on_job_event({"detail": running}, None)

    closed = table.get_item(Key={"month": ledger.RUNNING, "job": "vision#job-1"})["Item"]
    assert closed["spans"] == [[running["startedAt"], ended["stoppedAt"]]]
    assert closed[ledger.EXPIRES] > now // 1000
    vision = budgets.spends(table, functions.now_ms())["vision"]
    # 0.5 h x 2 nodes x $10.
    assert (vision.spent, vision.accruing) == (pytest.approx(10), 0)
    for month in (ledger.month_of(now), ledger.RUNNING):
        table.delete_item(Key={"month": month, "job": "vision#job-1"})


def test_a_job_submitted_around_trainctl_that_cannot_fit_is_cancelled_on_arrival(env: dict[str, Any]) -> None:
    world: World = env["world"]
    batch = world.client("batch")
    spend(env["table"], "llama", 700, "earlier-llama")
    # Through the API, as the console or the AWS CLI would: 2 nodes x $10 x 1 h timeout = $20 fits $300 left.
    fits = world.submit("gpu", name="fits", tags={ledger.TEAM_TAG: "llama"})
    world.set_job(fits, "RUNNABLE")
    assert functions.on_job_event({"detail": detail_of(world, fits, "RUNNABLE")}, None)["cancelled"] is None
    # 2 nodes x $10 x 20 h = $400 does not.
    too_big = world.submit(
        "gpu", name="too-big", tags={ledger.TEAM_TAG: "llama"}, timeout={"attemptDurationSeconds": 72000}
    )
    world.set_job(too_big, "RUNNABLE")
    outcome = functions.on_job_event({"detail": detail_of(world, too_big, "RUNNABLE")}, None)

    reason = batch.describe_jobs(jobs=[too_big])["jobs"][0]["statusReason"]
    assert reason == outcome["cancelled"]
    assert reason.startswith("budget: team llama has $300 left of $1,000 in ")
    assert reason.endswith("this job may cost up to $400 (2 x g6.12xlarge x 20 h)")
    assert "statusReason" not in batch.describe_jobs(jobs=[fits])["jobs"][0]
    # A job trainctl estimated with --hours 1 is judged on those hours, as trainctl judged it.
    estimated = world.submit(
        "gpu", name="estimated", tags={ledger.TEAM_TAG: "llama", ledger.HOURS_TAG: "1"},
        timeout={"attemptDurationSeconds": 72000},
    )  # fmt: skip
    assert functions.on_job_event({"detail": detail_of(world, estimated, "PENDING")}, None)["cancelled"] is None
    # A tag that is not a number of hours counts for nothing: the 20 h timeout decides.
    garbled = world.submit(
        "gpu", name="garbled", tags={ledger.TEAM_TAG: "llama", ledger.HOURS_TAG: "one"},
        timeout={"attemptDurationSeconds": 72000},
    )  # fmt: skip
    world.set_job(garbled, "RUNNABLE")
    assert functions.on_job_event({"detail": detail_of(world, garbled, "RUNNABLE")}, None)["cancelled"]


def test_80_percent_alerts_once_and_100_percent_stops_exactly_that_teams_jobs(env: dict[str, Any]) -> None:
    world: World = env["world"]
    batch = world.client("batch")
    inbox = env["inbox"]
    inbox()
    spend(env["table"], "vision", 850, "earlier-vision")

    def run() -> list[str]:
        return functions.on_schedule({}, None)["actions"]

    assert "alert vision 80%" in run()
    (alert,) = [m for m in inbox() if "vision" in m["Subject"]]
    assert alert["Subject"].startswith("Team vision at 85% of its")
    assert "$850 (85%) of its $1,000 budget" in alert["Message"]
    assert not [a for a in run() if "vision" in a] and not [m for m in inbox() if "vision" in m["Subject"]]

    running = world.submit("gpu", name="vision-running", tags={ledger.TEAM_TAG: "vision"})
    world.set_job(running, "RUNNING")
    queued = world.submit("gpu", name="vision-queued", tags={ledger.TEAM_TAG: "vision"})
    world.set_job(queued, "RUNNABLE")
    other = world.submit("gpu", name="llama-running", tags={ledger.TEAM_TAG: "llama"})
    world.set_job(other, "RUNNING")
    spend(env["table"], "vision", 160, "more-vision")

    actions = run()
    assert sorted(actions) == sorted(["alert vision 100%", f"terminate vision {running}", f"cancel vision {queued}"])
    reasons = {j["jobId"]: j.get("statusReason") for j in batch.describe_jobs(jobs=[running, queued, other])["jobs"]}
    assert reasons[running] == reasons[queued]
    assert reasons[running].startswith("budget: team vision reached $1,010 of its $1,000 budget for ")
    assert reasons[other] is None
    (stopped,) = [m for m in inbox() if "vision" in m["Subject"]]
    assert "queued jobs are cancelled and its running jobs stopped" in stopped["Message"]
    # moto leaves a terminated job RUNNING (its states move only when a test moves them), as Batch does
    # until the containers stop: the second pass sees the same jobs and touches none of them.
    assert [a for a in run() if "vision" in a] == []
    assert not [m for m in inbox() if "vision" in m["Subject"]]


def test_spend_reaches_the_dashboard_as_one_metric_per_team(env: dict[str, Any]) -> None:
    spends = env["budgets"].spends(env["table"], functions.now_ms())
    lines = [json.loads(line) for line in functions.metric_lines(spends, 1)]
    assert {line["Team"] for line in lines} == set(TEAMS)
    (directive,) = lines[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Dimensions"] == [["Team"]] and directive["Metrics"][0]["Name"] == functions.SPENT_METRIC
