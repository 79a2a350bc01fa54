"""Lambda handlers of the budgets (training_constructs/budgets/team_budgets.py deploys them).

`on_job_event`: every Batch job state change of the deployment's queues. Reads the job's team, nodes and
bounds from DescribeJobs (FROM_BATCH: never from the event alone), writes the job's entry into the ledger, and
stops on arrival a job that cannot fit its team's remainder (or, on FIFO fleets, names no budgeted team):
Batch sends no event for the submission itself (Batch user guide, "Job state change events"), so the first
event (PENDING or RUNNABLE, no attempt yet) is the arrival, whichever way the job was submitted (trainctl, the
console, the AWS CLI).

`on_schedule`: every few minutes (ENFORCE_MINUTES). First it closes what the ledger counts as running but
Batch shows ended or no longer knows (an end event lost or late: DescribeJobs decides). Then per team: at 80%
of the month's budget one alert to the job-alert topic; at 100% one alert, the team's queued jobs cancelled
and its running jobs terminated (TerminateJob for both) with a reason that starts "trainctl budget:". TerminateJob
stops a running job's containers (SIGTERM, then SIGKILL after the stop timeout: ECS developer guide, "Stopping
a task"), which is the launcher's stop path: it uploads the checkpoints before it exits (container/launcher/).
Markers in the ledger table, written after each alert and stop, keep a later pass from repeating it. Only jobs
of this deployment's queues whose team is the one over budget are touched.

Both need only the stdlib, the shared ledger (budget_ledger/ledger.py, which the asset carries beside this
file) and the boto3 that Lambda's Python runtime ships.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from budget_ledger import ledger
except ModuleNotFoundError:  # in Lambda ledger.py sits beside this file at the asset's root (team_budgets.py)
    import ledger  # type: ignore[import-not-found,no-redef]

BUDGETS_ENV = "BUDGETS"
TOPIC_ENV = "ALERT_TOPIC_ARN"
ENFORCE_MINUTES = 5
# How long an ended job's closed entry stays in RUNNING (DynamoDB time to live: deleted within days after).
TOMBSTONE_DAYS = 7
# The dashboard's spend-against-budget widget reads this (CloudWatch embedded metric format).
METRIC_NAMESPACE = "TrainingPlatform"  # config/metrics.py NAMESPACE (a test pins it)
SPENT_METRIC = "BudgetSpentUsd"
TEAM_DIMENSION = "Team"
# SNS: a subject of at most 100 characters (SNS API, Publish).
SUBJECT_LIMIT = 100


def now_ms() -> int:
    return int(time.time() * 1000)


def entry_of(detail: Mapping[str, Any], budgets: ledger.Budgets) -> ledger.Entry | None:
    """The job's ledger entry; None for a job of another queue, of no budgeted team, or a node job."""
    price = budgets.price_of(str(detail.get("jobQueue", "")))
    team = budgets.team_of(detail)
    job_id = str(detail.get("jobId", ""))
    if price is None or team is None or "#" in job_id:
        return None
    spans = ledger.spans_of(detail)
    return ledger.Entry(
        team=team,
        job_id=job_id,
        job_name=str(detail.get("jobName", "")),
        fleet=price.fleet,
        instance_type=price.instance_type,
        nodes=nodes_of(detail),
        usd_per_hour=price.usd_per_hour,
        spans=tuple(spans),
        progress=ledger.progress_of(detail, spans),
    )


def nodes_of(detail: Mapping[str, Any]) -> int:
    return int((detail.get("nodeProperties") or {}).get("numNodes") or 1)


def record(table: Any, entry: ledger.Entry, now: int) -> None:
    """Write the entry into every month it touches and into RUNNING; an event older than what the table
    holds changes nothing. An ended job stays in RUNNING, closed, until the table's time to live removes it
    (TOMBSTONE_DAYS): a late event of its running attempt (EventBridge promises no order) finds it there
    instead of reopening the job."""
    if not entry.spans:
        return  # never ran: nothing to count, and no running attempt a late event could reopen
    newer = {
        "ConditionExpression": "attribute_not_exists(progress) OR progress <= :p",
        "ExpressionAttributeValues": {":p": entry.progress},
    }
    errors = table.meta.client.exceptions
    for month in [*ledger.months_touched(entry.spans, now), ledger.RUNNING]:
        item = entry.item(month)
        if month == ledger.RUNNING and not entry.running:
            item[ledger.EXPIRES] = now // 1000 + TOMBSTONE_DAYS * 86400
        with contextlib.suppress(errors.ConditionalCheckFailedException):
            table.put_item(Item=item, **newer)


def estimate_of(detail: Mapping[str, Any], budgets: ledger.Budgets) -> ledger.Estimate | None:
    """The most the job may cost: its attempt timeout (or the job definitions') x its attempts (or the job
    definitions'). Only what Batch enforces counts: a tag anyone could set bounds nothing."""
    price = budgets.price_of(str(detail.get("jobQueue", "")))
    if price is None:
        return None
    seconds = (detail.get("timeout") or {}).get("attemptDurationSeconds") or budgets.timeout_seconds
    attempts = (detail.get("retryStrategy") or {}).get("attempts") or budgets.attempts
    return ledger.Estimate(
        nodes=nodes_of(detail),
        instance_type=price.instance_type,
        usd_per_hour=price.usd_per_hour,
        hours=int(seconds) / 3600,
        attempts=int(attempts),
    )


def _shape(properties: Mapping[str, Any]) -> dict[str, Any]:
    """What a fleet check must keep of its definition, from a JobDetail or a JobDefinition: node count, each
    node range's command, attempt timeout. A field the description leaves out is not in the shape."""
    nodes = properties.get("nodeProperties") or {}
    shape: dict[str, Any] = {}
    if nodes.get("numNodes") is not None:
        shape["nodes"] = int(nodes["numNodes"])
    ranges = nodes.get("nodeRangeProperties") or []
    if ranges and all((r.get("container") or {}).get("command") is not None for r in ranges):
        shape["commands"] = [list(r["container"]["command"]) for r in ranges]
    seconds = (properties.get("timeout") or {}).get("attemptDurationSeconds")
    if seconds is not None:
        shape["timeout"] = int(seconds)
    return shape


def runs_as_defined(job: Mapping[str, Any], definition: Mapping[str, Any]) -> bool:
    """Whether the job's description shows its definition's node count, commands and attempt timeout. Only a
    value the description shows and that differs counts against it: whether DescribeJobs writes a
    submission's overrides into nodeProperties is not documented (API JobDetail), and a fleet check refused
    on a field Batch merely left out would be a check stopped on no evidence."""
    shown, defined = _shape(job), _shape(definition)
    return all(defined.get(key) == value for key, value in shown.items())


def is_fleet_check(detail: Mapping[str, Any], budgets: ledger.Budgets, batch: Any) -> bool:
    """A job on one of the deployment's benchmark definitions (the fleet checks, scheduled or `trainctl check`)
    that runs as that definition says: the only job that names no team and is not charged. Anything else on
    those definitions (another command, more nodes, a longer timeout) is a job like any other. One
    DescribeJobDefinitions call, for such jobs only."""
    arn = str(detail.get("jobDefinition") or "")
    if arn not in budgets.check_definitions:
        return False
    found = batch.describe_job_definitions(jobDefinitions=[arn]).get("jobDefinitions") or []
    return bool(found) and runs_as_defined(detail, found[0])


def arrival_refusal(
    detail: Mapping[str, Any], budgets: ledger.Budgets, table: Any, now: int, *, fleet_check: bool = False
) -> str | None:
    """The reason to stop a job that just arrived: its team is unknown (FIFO fleets), or it cannot fit its
    team's remainder; else None. `fleet_check`: is_fleet_check found it a fleet check."""
    if detail.get("status") not in ledger.QUEUED or ledger.spans_of(detail) or detail.get("attempts"):
        return None
    estimate = estimate_of(detail, budgets)
    if estimate is None:
        return None
    unknown = ledger.unknown_team(detail, budgets, fleet_check=fleet_check)
    if unknown:
        return unknown
    team = budgets.team_of(detail)
    return None if team is None else ledger.refusal(budgets.spends(table, now)[team], estimate)


# What is charged comes from Batch, never from the event alone: who the job is charged to, how many nodes it
# holds, the bounds of its estimate. An event's detail only "resembles" DescribeJobs' JobDetail (Batch user
# guide, "Job state change events"): the guide's own example carries `tags` holding only resourceArn, and
# nothing there promises nodeProperties, the share identifier or the retry strategy (API JobDetail has all).
FROM_BATCH = ("tags", "shareIdentifier", "timeout", "retryStrategy", "nodeProperties", "jobDefinition")


def described(detail: Mapping[str, Any], budgets: ledger.Budgets, batch: Any) -> Mapping[str, Any] | None:
    """The event's detail (its status, attempts and times: the moment it tells of) with FROM_BATCH as
    DescribeJobs gives them now, for a main job of a budgeted queue (one call per event); other details as
    they came. None when Batch does not know the job: nothing is charged on what the event alone says."""
    job_id = str(detail.get("jobId", ""))
    if budgets.price_of(str(detail.get("jobQueue", ""))) is None or "#" in job_id:
        return detail
    found = [j for j in batch.describe_jobs(jobs=[job_id]).get("jobs") or [] if j.get("jobId") == job_id]
    if not found:
        return None
    return {
        **{k: v for k, v in detail.items() if k not in FROM_BATCH},
        **{k: found[0][k] for k in FROM_BATCH if k in found[0]},
    }


def reconcile(budgets: ledger.Budgets, table: Any, batch: Any, now: int) -> list[str]:
    """Close what the ledger still counts as running but Batch shows ended (its end event lost or late), from
    DescribeJobs (up to 100 ids a call); a job Batch no longer knows is closed now. One line per job closed."""
    latest: dict[str, ledger.Entry] = {}
    for entry in ledger.read_entries(table, ledger.month_of(now)):
        if entry.job_id not in latest or entry.progress > latest[entry.job_id].progress:
            latest[entry.job_id] = entry
    done: list[str] = []
    ids = sorted(job_id for job_id, entry in latest.items() if entry.running)  # the newest word on each job
    for start in range(0, len(ids), 100):
        answered = {str(j.get("jobId")): j for j in batch.describe_jobs(jobs=ids[start : start + 100]).get("jobs", [])}
        for job_id in ids[start : start + 100]:
            job = answered.get(job_id)
            if job is not None and job.get("status") not in ledger.DONE:
                continue
            ended = entry_of(job, budgets) if job is not None else None
            if ended is None or not ended.spans or ended.running:
                # Gone from Batch, or ended with no attempt it shows: the open span ends when Batch says the
                # job stopped, else now.
                known = latest[job_id]
                stop = int((job or {}).get("stoppedAt") or now)
                spans = tuple((first, last if last is not None else max(stop, first)) for first, last in known.spans)
                ended = dataclasses.replace(known, spans=spans, progress=known.progress + 1)
            record(table, ended, now)
            done.append(f"closed {ended.team} {job_id} ({job['status'] if job else 'unknown to Batch'})")
    return done


def _clients() -> tuple[ledger.Budgets, Any]:
    import boto3  # Lambda's Python runtime includes it

    budgets = ledger.Budgets.parse(json.loads(os.environ[BUDGETS_ENV]))
    return budgets, boto3.resource("dynamodb").Table(budgets.table)


def on_job_event(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    import boto3

    budgets, table = _clients()
    batch = boto3.client("batch")
    event_detail = event.get("detail") or {}
    detail = described(event_detail, budgets, batch)
    if detail is None:
        outcome = {"jobId": event_detail.get("jobId"), "status": event_detail.get("status"), "team": None}
        print(json.dumps(outcome | {"stopped": None, "skipped": "DescribeJobs does not know the job: not charged"}))
        return outcome | {"stopped": None}
    now = now_ms()
    checked = (
        detail.get("status") in ledger.QUEUED
        and budgets.team_of(detail) is None
        and is_fleet_check(detail, budgets, batch)
    )
    line = arrival_refusal(detail, budgets, table, now, fleet_check=checked)
    # What Batch is given starts with the prefix every deliberate stop shares (ledger.BATCH_REASON_PREFIX).
    reason = f"trainctl {line}"[:1024] if line else None
    if reason:
        # TerminateJob, not CancelJob: CancelJob succeeds on a job already STARTING or RUNNING without
        # stopping it (API CancelJob); TerminateJob cancels a queued job and stops a started one (API
        # TerminateJob). The job may have moved on since the event.
        batch.terminate_job(jobId=str(detail["jobId"]), reason=reason)
    entry = entry_of(detail, budgets)
    if entry is not None:
        record(table, entry, now)
    outcome = {"jobId": detail.get("jobId"), "status": detail.get("status"), "team": entry and entry.team}
    print(json.dumps(outcome | {"stopped": reason}))
    return outcome | {"stopped": reason}


def _marked(table: Any, month: str, marker: str) -> bool:
    return "Item" in table.get_item(Key={"month": month, "job": marker}, ConsistentRead=True)


def _mark(table: Any, month: str, marker: str) -> None:
    """Record an action once it is done: a pass that fails before this repeats the action next time (an
    alert sent twice or a job stopped twice is harmless; one never sent or never stopped is not)."""
    table.put_item(Item={"month": month, "job": marker})


def alert_text(spend: ledger.TeamSpend, fraction: float) -> tuple[str, str]:
    month = ledger.month_name(spend.month)
    share = f"{spend.used / spend.budget:.0%}"
    subject = f"Team {spend.team} at {share} of its {month} budget"[:SUBJECT_LIMIT]
    text = (
        f"Team {spend.team} has used {ledger.money(spend.used)} ({share}) of its {ledger.money(spend.budget)} budget "
        f"for {month}: {ledger.money(spend.spent)} in jobs that ended, {ledger.money(spend.accruing)} accruing in "
        f"jobs running now ({ledger.money(spend.rate)}/hour); at that rate {ledger.money(spend.forecast)} by the "
        "month's end."
    )
    if fraction >= 1:
        text += (
            " At 100% the team's queued jobs are cancelled and its running jobs stopped (their checkpoints are "
            "uploaded within the stop timeout); new jobs are refused until next month or a bigger budget is deployed."
        )
    else:
        text += " At 100% its jobs are stopped (`trainctl budget`, docs/budgets.md)."
    return subject, text


def stop_reason(spend: ledger.TeamSpend) -> str:
    return (
        f"{ledger.BATCH_REASON_PREFIX} team {spend.team} reached {ledger.money(spend.used)} of its "
        f"{ledger.money(spend.budget)} budget for {ledger.month_name(spend.month)}: stopped, checkpoints kept"
    )


def team_jobs(batch: Any, budgets: ledger.Budgets, team: str) -> Iterator[dict[str, Any]]:
    """The team's queued and running jobs on this deployment's queues (DescribeJobs: up to 100 ids a call)."""
    for queue in budgets.queues:
        for status in ledger.QUEUED + ledger.ACTIVE:
            ids = [
                str(summary["jobId"])
                for page in batch.get_paginator("list_jobs").paginate(jobQueue=queue.queue, jobStatus=status)
                for summary in page.get("jobSummaryList", [])
            ]
            for start in range(0, len(ids), 100):
                for job in batch.describe_jobs(jobs=ids[start : start + 100]).get("jobs", []):
                    if job.get("status") == status and budgets.team_of(job) == team:
                        yield job


def enforce(budgets: ledger.Budgets, table: Any, batch: Any, sns: Any, topic: str, now: int) -> list[str]:
    """One enforcement pass; returns what it did, one line per action."""
    done: list[str] = []
    for team, spend in budgets.spends(table, now).items():
        for fraction in ledger.ALERT_FRACTIONS:
            marker = f"!alert#{fraction:g}#{team}"
            if spend.used >= fraction * spend.budget and not _marked(table, spend.month, marker):
                subject, text = alert_text(spend, fraction)
                sns.publish(TopicArn=topic, Subject=subject, Message=text)
                _mark(table, spend.month, marker)
                done.append(f"alert {team} {fraction:.0%}")
        if spend.used < spend.budget:
            continue
        reason = stop_reason(spend)
        for job in list(team_jobs(batch, budgets, team)):
            job_id = str(job["jobId"])
            marker = f"!stop#{job_id}"
            if _marked(table, spend.month, marker):
                continue
            # TerminateJob for both: it cancels a queued job and stops a started one, where CancelJob
            # leaves a job that reached STARTING running (API CancelJob, TerminateJob).
            batch.terminate_job(jobId=job_id, reason=reason)
            _mark(table, spend.month, marker)
            done.append(f"{'cancel' if job['status'] in ledger.QUEUED else 'terminate'} {team} {job_id}")
    return done


def metric_lines(spends: Mapping[str, ledger.TeamSpend], now: int) -> list[str]:
    """One embedded-metric-format line per team: its spend this month (CloudWatch user guide, "Embedded
    metric format specification"), which CloudWatch Logs turns into the metric the dashboard draws."""
    return [
        json.dumps(
            {
                "_aws": {
                    "Timestamp": now,
                    "CloudWatchMetrics": [
                        {
                            "Namespace": METRIC_NAMESPACE,
                            "Dimensions": [[TEAM_DIMENSION]],
                            "Metrics": [{"Name": SPENT_METRIC, "Unit": "None"}],
                        }
                    ],
                },
                TEAM_DIMENSION: team,
                SPENT_METRIC: round(spend.used, 2),
            }
        )
        for team, spend in spends.items()
    ]


def on_schedule(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    import boto3

    budgets, table = _clients()
    now = now_ms()
    batch = boto3.client("batch")
    done = reconcile(budgets, table, batch, now)
    done += enforce(budgets, table, batch, boto3.client("sns"), os.environ[TOPIC_ENV], now)
    for line in metric_lines(budgets.spends(table, now), now):
        print(line)
    print(json.dumps({"actions": done}))
    return {"actions": done}
