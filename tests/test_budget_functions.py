"""The budget functions (training_constructs/budgets/budget_functions.py) against moto's Batch, DynamoDB
and SNS on 127.0.0.1: the ledger keeps the newest event, a job submitted around trainctl that cannot fit
is cancelled on arrival, 80% alerts once, 100% cancels that team's queued jobs and terminates its running
ones with the budget reason, and a second enforcement changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from budget_ledger import ledger
from tests.trainctl_world import World, moto_environment, served_world
from training_constructs.budgets import budget_functions as functions

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
    job = world.submit("gpu", name="llm", tags={ledger.TEAM_TAG: "vision"})
    numbered = world.client("batch").describe_jobs(jobs=[job])["jobs"][0]["nodeProperties"]["numNodes"]
    assert numbered == 2
    now = functions.now_ms()
    running = {
        "jobId": job, "jobName": "llm", "jobQueue": world.queues["gpu"], "status": "RUNNING",
        "startedAt": now - 3_600_000, "attempts": [], "nodeProperties": {"numNodes": 2},
        "tags": {ledger.TEAM_TAG: "vision"},
    }  # fmt: skip
    ended = {**running, "status": "SUCCEEDED", "stoppedAt": now - 1_800_000}
    ended["attempts"] = [{"startedAt": running["startedAt"], "stoppedAt": ended["stoppedAt"]}]

    queued = {**running, "status": "RUNNABLE", "startedAt": None}
    functions.on_job_event({"detail": queued}, None)
    # A job that never ran leaves nothing in the ledger.
    assert "Item" not in table.get_item(Key={"month": ledger.RUNNING, "job": f"vision#{job}"})
    functions.on_job_event({"detail": running}, None)
    running_item = table.get_item(Key={"month": ledger.RUNNING, "job": f"vision#{job}"}).get("Item")
    assert running_item is not None and running_item["spans"][0][1] == 0
    functions.on_job_event({"detail": ended}, None)
    # A late RUNNING event (EventBridge does not promise order) must not reopen the ended job.
    functions.on_job_event({"detail": running}, None)

    closed = table.get_item(Key={"month": ledger.RUNNING, "job": f"vision#{job}"})["Item"]
    assert closed["spans"] == [[running["startedAt"], ended["stoppedAt"]]]
    assert closed[ledger.EXPIRES] > now // 1000
    vision = budgets.spends(table, functions.now_ms())["vision"]
    # 0.5 h x 2 nodes x $10.
    assert (vision.spent, vision.accruing) == (pytest.approx(10), 0)
    for month in (ledger.month_of(now), ledger.RUNNING):
        table.delete_item(Key={"month": month, "job": f"vision#{job}"})


def documented_event(job_id: str, queue: str, status: str, **detail: Any) -> dict[str, Any]:
    """A job state change event shaped as the Batch user guide's example ("Job state change events"):
    `tags` holds only the job's resourceArn, and nothing says how many nodes the job has."""
    return {
        "version": "0",
        "detail-type": "Batch Job State Change",
        "source": "aws.batch",
        "detail": {
            "jobName": "event-test", "jobId": job_id, "jobQueue": queue, "status": status, "attempts": [],
            "createdAt": functions.now_ms(), "retryStrategy": {"attempts": 1}, "dependsOn": [],
            "jobDefinition": "arn:aws:batch:us-east-1:123456789012:job-definition/first-run-job-definition:1",
            "parameters": {}, "container": {"image": "busybox", "command": ["echo"]},
            "tags": {"resourceArn": f"arn:aws:batch:us-east-1:123456789012:job/{job_id}"},
            "propagateTags": False, "platformCapabilities": [], **detail,
        },
    }  # fmt: skip


def test_the_documented_event_shape_charges_the_team_and_nodes_batch_gives(env: dict[str, Any]) -> None:
    world: World = env["world"]
    budgets, table = env["budgets"], env["table"]
    job = world.submit("gpu", name="documented", tags={ledger.TEAM_TAG: "llama"})
    world.set_job(job, "RUNNABLE")
    arrived = functions.on_job_event(documented_event(job, world.queues["gpu"], "RUNNABLE"), None)
    # Not stopped as "no trainctl:team tag", not charged to a default team: llama's, as Batch says.
    assert arrived == {"jobId": job, "status": "RUNNABLE", "team": "llama", "stopped": None}
    now = functions.now_ms()
    started = now - 3_600_000
    running = documented_event(job, world.queues["gpu"], "RUNNING", startedAt=started)
    assert functions.on_job_event(running, None)["team"] == "llama"
    item = table.get_item(Key={"month": ledger.RUNNING, "job": f"llama#{job}"})["Item"]
    assert int(item["nodes"]) == 2  # the job's numNodes from DescribeJobs; the event names none
    llama = budgets.spends(table, now)["llama"]
    assert llama.accruing == pytest.approx(2 * 10 * 1, rel=0.01)  # 2 nodes x $10 x 1 h so far
    for month in (ledger.month_of(now), ledger.RUNNING):
        table.delete_item(Key={"month": month, "job": f"llama#{job}"})


def test_an_event_of_a_job_batch_does_not_know_charges_nothing(env: dict[str, Any]) -> None:
    world: World = env["world"]
    now = functions.now_ms()
    ghost = documented_event("no-such-job", world.queues["gpu"], "RUNNING", startedAt=now - 60_000)
    ghost["detail"]["tags"] = {ledger.TEAM_TAG: "vision"}
    ghost["detail"]["nodeProperties"] = {"numNodes": 64}
    assert functions.on_job_event(ghost, None) == {
        "jobId": "no-such-job",
        "status": "RUNNING",
        "team": None,
        "stopped": None,
    }
    assert "Item" not in env["table"].get_item(Key={"month": ledger.RUNNING, "job": "vision#no-such-job"})


def test_enforcement_closes_what_batch_shows_ended_when_its_end_event_was_lost(env: dict[str, Any]) -> None:
    world: World = env["world"]
    budgets = env["budgets"]
    table = create_ledger(boto3.resource("dynamodb"), "ledger-reconcile")
    now = functions.now_ms()
    started, stopped = now - 7_200_000, now - 3_600_000
    ended = world.submit("gpu", name="ended", tags={ledger.TEAM_TAG: "vision"})
    world.set_job(ended, "RUNNING")
    running_detail = detail_of(world, ended, "RUNNING")
    running_detail["startedAt"] = started
    entry = functions.entry_of(running_detail, budgets)
    assert entry is not None and entry.running
    functions.record(table, entry, now)
    still = world.submit("gpu", name="still", tags={ledger.TEAM_TAG: "vision"})
    world.set_job(still, "RUNNING")
    still_detail = {**detail_of(world, still, "RUNNING"), "startedAt": started}
    functions.record(table, functions.entry_of(still_detail, budgets), now)  # type: ignore[arg-type]
    gone = ledger.Entry(
        team="vision", job_id="purged", job_name="purged", fleet="gpu", instance_type="g6.12xlarge", nodes=1,
        usd_per_hour=10.0, spans=((started, None),), progress=1,
    )  # fmt: skip
    functions.record(table, gone, now)
    # The end event never came; Batch shows the job SUCCEEDED an hour ago.
    world.set_job(
        ended, "SUCCEEDED",
        started=datetime.fromtimestamp(started / 1000, UTC), stopped=datetime.fromtimestamp(stopped / 1000, UTC),
    )  # fmt: skip

    done = functions.reconcile(budgets, table, world.client("batch"), now)
    assert sorted(done) == sorted([f"closed vision {ended} (SUCCEEDED)", "closed vision purged (unknown to Batch)"])
    items = {i["jobId"]: i for i in table.query(
        KeyConditionExpression="#m = :m", ExpressionAttributeNames={"#m": "month"},
        ExpressionAttributeValues={":m": ledger.RUNNING},
    )["Items"]}  # fmt: skip
    assert items[ended]["spans"] == [[started, stopped]]
    assert items["purged"]["spans"] == [[started, now]]
    assert items[still]["spans"] == [[started, 0]]  # Batch shows it running: left open
    assert functions.reconcile(budgets, table, world.client("batch"), now) == []  # nothing left to close
    world.set_job(still, "SUCCEEDED")  # no running vision job left for the tests after this one


def test_a_job_submitted_around_trainctl_that_cannot_fit_is_stopped_on_arrival(env: dict[str, Any]) -> None:
    world: World = env["world"]
    batch = world.client("batch")
    spend(env["table"], "llama", 700, "earlier-llama")
    # Through the API, as the console or the AWS CLI would: 2 nodes x $10 x 1 h timeout = $20 fits $300 left.
    fits = world.submit("gpu", name="fits", tags={ledger.TEAM_TAG: "llama"})
    world.set_job(fits, "RUNNABLE")
    assert functions.on_job_event({"detail": detail_of(world, fits, "RUNNABLE")}, None)["stopped"] is None
    # 2 nodes x $10 x 20 h = $400 does not.
    too_big = world.submit(
        "gpu", name="too-big", tags={ledger.TEAM_TAG: "llama"}, timeout={"attemptDurationSeconds": 72000}
    )
    world.set_job(too_big, "RUNNABLE")
    outcome = functions.on_job_event({"detail": detail_of(world, too_big, "RUNNABLE")}, None)

    reason = batch.describe_jobs(jobs=[too_big])["jobs"][0]["statusReason"]
    assert reason == outcome["stopped"]
    assert reason.startswith("trainctl budget: team llama has $300 of $1,000 left in ")
    assert reason.endswith(f"this job may cost up to $400 (2 x g6.12xlarge x 20 h): {ledger.REMEDY}")
    assert "statusReason" not in batch.describe_jobs(jobs=[fits])["jobs"][0]
    # A tag claiming fewer hours bounds nothing (Batch does not enforce it): the 20 h timeout decides.
    tagged = world.submit(
        "gpu", name="tagged", tags={ledger.TEAM_TAG: "llama", "trainctl:budget-hours": "1"},
        timeout={"attemptDurationSeconds": 72000},
    )  # fmt: skip
    world.set_job(tagged, "RUNNABLE")
    assert functions.on_job_event({"detail": detail_of(world, tagged, "RUNNABLE")}, None)["stopped"]


def test_an_event_without_tags_is_completed_from_describe_jobs(env: dict[str, Any]) -> None:
    """The user guide's example event carries no tags: the team comes from DescribeJobs."""
    world: World = env["world"]
    # 2 nodes x $10 x 100 h = $2,000: more than llama's whole $1,000.
    too_big = world.submit(
        "gpu", name="untagged-event", tags={ledger.TEAM_TAG: "llama"}, timeout={"attemptDurationSeconds": 360000}
    )
    world.set_job(too_big, "RUNNABLE")
    detail = {k: v for k, v in detail_of(world, too_big, "RUNNABLE").items() if k != "tags"}
    outcome = functions.on_job_event({"detail": detail}, None)
    assert outcome["team"] == "llama"
    assert str(outcome["stopped"]).startswith("trainctl budget: team llama has ")


def test_arrival_terminates_a_job_that_already_started(env: dict[str, Any]) -> None:
    """CancelJob leaves a STARTING or RUNNING job running (and moto, like Batch, ignores it): an event that
    reaches the function after the job moved on must still stop the job."""
    world: World = env["world"]
    batch = world.client("batch")
    # $2,000 at most, as above.
    late = world.submit("gpu", name="late", tags={ledger.TEAM_TAG: "llama"}, timeout={"attemptDurationSeconds": 360000})
    world.set_job(late, "RUNNABLE")
    detail = detail_of(world, late, "RUNNABLE")
    world.set_job(late, "RUNNING")
    outcome = functions.on_job_event({"detail": detail}, None)
    assert batch.describe_jobs(jobs=[late])["jobs"][0].get("statusReason") == outcome["stopped"]


def test_arrival_counts_every_attempt(env: dict[str, Any]) -> None:
    # 2 nodes x $10 x 6 h x 3 attempts = $360; with the document's 2 attempts instead, $240.
    world: World = env["world"]
    budgets: ledger.Budgets = env["budgets"]
    detail = {
        "jobId": "retried", "jobQueue": world.queues["gpu"], "status": "RUNNABLE", "attempts": [],
        "nodeProperties": {"numNodes": 2}, "timeout": {"attemptDurationSeconds": 6 * 3600},
        "retryStrategy": {"attempts": 3}, "tags": {ledger.TEAM_TAG: "llama"},
    }  # fmt: skip
    estimate = functions.estimate_of(detail, budgets)
    assert estimate is not None and estimate.most == pytest.approx(360)
    assert estimate.shape() == "2 x g6.12xlarge x 6 h x 3 attempts"
    # Without a retry strategy in the detail, the job definitions' attempts (the document's) count.
    bare = {k: v for k, v in detail.items() if k != "retryStrategy"}
    doubled = ledger.Budgets.parse({**_document(budgets), "attempts": 2})
    assert functions.estimate_of(bare, doubled).most == pytest.approx(240)  # type: ignore[union-attr]


def _document(budgets: ledger.Budgets) -> dict[str, Any]:
    return ledger.document(
        table=budgets.table, teams=budgets.teams, default_team=budgets.default_team, fair_share=budgets.fair_share,
        queues=budgets.queues, timeout_seconds=budgets.timeout_seconds, attempts=budgets.attempts,
    )  # fmt: skip


def test_on_fifo_fleets_a_job_of_no_budgeted_team_is_stopped_on_arrival(env: dict[str, Any]) -> None:
    world: World = env["world"]
    batch = world.client("batch")
    untagged = world.submit("gpu", name="untagged")
    world.set_job(untagged, "RUNNABLE")
    stranger = world.submit("gpu", name="stranger", tags={ledger.TEAM_TAG: "robotics"})
    world.set_job(stranger, "RUNNABLE")
    functions.on_job_event({"detail": detail_of(world, untagged, "RUNNABLE")}, None)
    functions.on_job_event({"detail": detail_of(world, stranger, "RUNNABLE")}, None)
    reasons = {j["jobId"]: j.get("statusReason") for j in batch.describe_jobs(jobs=[untagged, stranger])["jobs"]}
    assert reasons[untagged] == "trainctl budget: no trainctl:team tag; the teams are llama, vision"
    assert reasons[stranger] == "trainctl budget: team robotics has no budget; the teams are llama, vision"
    # The fleet check (the deployment's benchmark definition, untagged) is not a team's job: it runs.
    check = world.submit("gpu", name="gpu-fleet-check", definition=world.benchmark["gpu"])
    world.set_job(check, "RUNNABLE")
    checks = ledger.Budgets.parse({**_document(env["budgets"]), "checkDefinitions": [world.benchmark["gpu"]]})
    assert functions.is_fleet_check(detail_of(world, check, "RUNNABLE"), checks, batch)
    assert not functions.is_fleet_check(detail_of(world, check, "RUNNABLE"), env["budgets"], batch)
    assert (
        functions.arrival_refusal(detail_of(world, check, "RUNNABLE"), checks, env["table"], 0, fleet_check=True)
        is None
    )
    assert functions.arrival_refusal(detail_of(world, check, "RUNNABLE"), checks, env["table"], 0)


def test_a_job_on_a_benchmark_definition_with_its_own_timeout_is_charged_like_any_job(env: dict[str, Any]) -> None:
    """The fleet checks' exemption holds for the definition as deployed: a longer timeout (or another command,
    more nodes) on the same definition makes it a job of no team, stopped on arrival like one."""
    world: World = env["world"]
    batch = world.client("batch")
    checks = ledger.Budgets.parse({**_document(env["budgets"]), "checkDefinitions": [world.benchmark["gpu"]]})
    (definition,) = batch.describe_job_definitions(jobDefinitions=[world.benchmark["gpu"]])["jobDefinitions"]
    longer = int((definition.get("timeout") or {}).get("attemptDurationSeconds") or 600) * 10
    dodge = world.submit(
        "gpu", name="not-a-check", definition=world.benchmark["gpu"], timeout={"attemptDurationSeconds": longer}
    )
    world.set_job(dodge, "RUNNABLE")
    assert batch.describe_jobs(jobs=[dodge])["jobs"][0]["timeout"]["attemptDurationSeconds"] == longer
    assert not functions.is_fleet_check(detail_of(world, dodge, "RUNNABLE"), checks, batch)
    refusal = functions.arrival_refusal(detail_of(world, dodge, "RUNNABLE"), checks, env["table"], 0)
    assert refusal == "budget: no trainctl:team tag; the teams are llama, vision"


def test_runs_as_defined_counts_only_what_the_description_shows() -> None:
    definition = {
        "nodeProperties": {"numNodes": 2, "nodeRangeProperties": [{"container": {"command": ["bench", "--all"]}}]},
        "timeout": {"attemptDurationSeconds": 900},
    }
    assert functions.runs_as_defined(definition, definition)
    # Left out of a description: no evidence of an override.
    assert functions.runs_as_defined({}, definition)
    assert functions.runs_as_defined({"nodeProperties": {"numNodes": 2}}, definition)
    more_nodes = {"nodeProperties": {**definition["nodeProperties"], "numNodes": 4}}
    other_command = {"nodeProperties": {"numNodes": 2, "nodeRangeProperties": [{"container": {"command": ["sh"]}}]}}
    assert not functions.runs_as_defined(more_nodes, definition)
    assert not functions.runs_as_defined(other_command, definition)
    assert not functions.runs_as_defined({"timeout": {"attemptDurationSeconds": 9000}}, definition)


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
    assert reasons[running].startswith("trainctl budget: team vision reached $1,010 of its $1,000 budget for ")
    assert reasons[other] is None
    (stopped,) = [m for m in inbox() if "vision" in m["Subject"]]
    assert "queued jobs are cancelled and its running jobs stopped" in stopped["Message"]
    # moto leaves a terminated job RUNNING (its states move only when a test moves them), as Batch does
    # until the containers stop: the second pass sees the same jobs and touches none of them.
    assert [a for a in run() if "vision" in a] == []
    assert not [m for m in inbox() if "vision" in m["Subject"]]


class FailsOnce:
    """A boto3 client whose first call of `method` fails, as a throttled call or a timeout would."""

    def __init__(self, client: Any, method: str) -> None:
        self.client, self.method, self.failed = client, method, False

    def __getattr__(self, name: str) -> Any:
        if name != self.method or self.failed:
            return getattr(self.client, name)

        def fail(**kwargs: Any) -> None:
            self.failed = True
            raise RuntimeError(f"{name} failed")

        return fail


def test_an_alert_or_stop_that_fails_is_repeated_by_the_next_pass(env: dict[str, Any]) -> None:
    world: World = env["world"]
    batch = world.client("batch")
    table = create_ledger(boto3.resource("dynamodb"), "ledger-failures")
    budgets = ledger.Budgets.parse({**_document(env["budgets"]), "table": "ledger-failures", "teams": {"audio": 100}})
    sns = boto3.client("sns")
    topic = sns.create_topic(Name="failures")["TopicArn"]
    spend(table, "audio", 150, "audio-earlier")
    job = world.submit("gpu", name="audio-running", tags={ledger.TEAM_TAG: "audio"})
    world.set_job(job, "RUNNING")
    now = functions.now_ms()
    month = ledger.month_of(now)

    def markers() -> set[str]:
        items = table.query(KeyConditionExpression="#m = :m", ExpressionAttributeNames={"#m": "month"},
                            ExpressionAttributeValues={":m": month})["Items"]  # fmt: skip
        return {str(i["job"]) for i in items if str(i["job"]).startswith("!")}

    with pytest.raises(RuntimeError, match="publish failed"):
        functions.enforce(budgets, table, batch, FailsOnce(sns, "publish"), topic, now)
    assert markers() == set()
    with pytest.raises(RuntimeError, match="terminate_job failed"):
        functions.enforce(budgets, table, FailsOnce(batch, "terminate_job"), sns, topic, now)
    assert markers() == {"!alert#0.8#audio", "!alert#1#audio"}
    assert "statusReason" not in batch.describe_jobs(jobs=[job])["jobs"][0]
    assert functions.enforce(budgets, table, batch, sns, topic, now) == [f"terminate audio {job}"]
    assert batch.describe_jobs(jobs=[job])["jobs"][0]["statusReason"].startswith(
        "trainctl budget: team audio reached $150"
    )
    assert functions.enforce(budgets, table, batch, sns, topic, now) == []


def test_spend_reaches_the_dashboard_as_one_metric_per_team(env: dict[str, Any]) -> None:
    spends = env["budgets"].spends(env["table"], functions.now_ms())
    lines = [json.loads(line) for line in functions.metric_lines(spends, 1)]
    assert {line["Team"] for line in lines} == set(TEAMS)
    (directive,) = lines[0]["_aws"]["CloudWatchMetrics"]
    assert directive["Dimensions"] == [["Team"]] and directive["Metrics"][0]["Name"] == functions.SPENT_METRIC
