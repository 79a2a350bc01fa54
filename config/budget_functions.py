"""Lambda handlers of the budgets (training_constructs/budgets/team_budgets.py deploys them).

`on_job_event`: every Batch job state change of the deployment's queues. Writes the job's entry into the
ledger, and cancels on arrival a job that cannot fit its team's remainder: Batch sends no event for the
submission itself (Batch user guide, "Job state change events"), so the first event (PENDING or RUNNABLE,
no attempt yet) is the arrival, whichever way the job was submitted (trainctl, the console, the AWS CLI).

`on_schedule`: every few minutes (ENFORCE_MINUTES). Per team: at 80% of the month's budget one alert to the
job-alert topic; at 100% one alert, the team's queued jobs cancelled and its running jobs terminated with a
reason that starts "budget:". TerminateJob stops a running job's containers (SIGTERM, then SIGKILL after
the stop timeout: ECS developer guide, "Stopping a task"), which is the launcher's stop path: it uploads
the checkpoints before it exits (container/distributed_run.sh). Idempotent: markers in the ledger table
make each alert and each stop happen once. Only jobs of this deployment's queues whose team is the one
over budget are touched.

Both need only the stdlib and the boto3 that Lambda's Python runtime ships.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from config import budget_ledger as ledger
except ModuleNotFoundError:  # in Lambda the two files sit side by side at the asset's root
    import budget_ledger as ledger  # type: ignore[import-not-found,no-redef]

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
    price = budgets.price_of(str(detail.get("jobQueue", "")))
    if price is None:
        return None
    seconds = (detail.get("timeout") or {}).get("attemptDurationSeconds") or budgets.timeout_seconds
    hours = int(seconds) / 3600
    tagged = str((detail.get("tags") or {}).get(ledger.HOURS_TAG, ""))
    # The hours trainctl estimated with; a tag anyone could have set is taken only as a number of hours.
    if re.fullmatch(r"\d+(\.\d+)?", tagged) and float(tagged) > 0:
        hours = float(tagged)
    return ledger.Estimate(
        nodes=nodes_of(detail), instance_type=price.instance_type, usd_per_hour=price.usd_per_hour, hours=hours
    )


def arrival_refusal(detail: Mapping[str, Any], budgets: ledger.Budgets, table: Any, now: int) -> str | None:
    """The reason to cancel a job that just arrived and cannot fit its team's remainder, else None."""
    if detail.get("status") not in ledger.QUEUED or ledger.spans_of(detail) or detail.get("attempts"):
        return None
    team, estimate = budgets.team_of(detail), estimate_of(detail, budgets)
    if team is None or estimate is None:
        return None
    return ledger.refusal(budgets.spends(table, now)[team], estimate)


def _clients() -> tuple[ledger.Budgets, Any]:
    import boto3  # Lambda's Python runtime includes it

    budgets = ledger.Budgets.parse(json.loads(os.environ[BUDGETS_ENV]))
    return budgets, boto3.resource("dynamodb").Table(budgets.table)


def on_job_event(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    import boto3

    budgets, table = _clients()
    detail = event.get("detail") or {}
    now = now_ms()
    reason = arrival_refusal(detail, budgets, table, now)
    if reason:
        boto3.client("batch").cancel_job(jobId=str(detail["jobId"]), reason=reason[:1024])
    entry = entry_of(detail, budgets)
    if entry is not None:
        record(table, entry, now)
    outcome = {"jobId": detail.get("jobId"), "status": detail.get("status"), "team": entry and entry.team}
    print(json.dumps(outcome | {"cancelled": reason}))
    return outcome | {"cancelled": reason}


def _claim(table: Any, month: str, marker: str) -> bool:
    """Put a marker once: True for the caller that put it."""
    try:
        table.put_item(Item={"month": month, "job": marker}, ConditionExpression="attribute_not_exists(job)")
    except table.meta.client.exceptions.ConditionalCheckFailedException:
        return False
    return True


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
        f"{ledger.REASON_PREFIX} team {spend.team} reached {ledger.money(spend.used)} of its "
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
            if spend.used >= fraction * spend.budget and _claim(table, spend.month, f"!alert#{fraction:g}#{team}"):
                subject, text = alert_text(spend, fraction)
                sns.publish(TopicArn=topic, Subject=subject, Message=text)
                done.append(f"alert {team} {fraction:.0%}")
        if spend.used < spend.budget:
            continue
        reason = stop_reason(spend)
        for job in list(team_jobs(batch, budgets, team)):
            job_id = str(job["jobId"])
            if not _claim(table, spend.month, f"!stop#{job_id}"):
                continue
            if job["status"] in ledger.QUEUED:
                batch.cancel_job(jobId=job_id, reason=reason)
                done.append(f"cancel {team} {job_id}")
            else:
                # TerminateJob, not CancelJob: a cancel does not stop a job that is STARTING or RUNNING.
                batch.terminate_job(jobId=job_id, reason=reason)
                done.append(f"terminate {team} {job_id}")
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
    done = enforce(budgets, table, boto3.client("batch"), boto3.client("sns"), os.environ[TOPIC_ENV], now)
    for line in metric_lines(budgets.spends(table, now), now):
        print(line)
    print(json.dumps({"actions": done}))
    return {"actions": done}
