"""Lambda handler: announce a training job that Batch resumes after a failed attempt, naming that attempt.

Invoked by the ResumedJobAlerts rule (training_constructs/observability/recovery_alerts.py) on a job
RUNNABLE again after an attempt. The event's detail is the job as DescribeJobs returns it (Batch user
guide, "Job state change events"), whose `attempts` list every attempt so far, oldest first (Batch API,
JobDetail): the one that just failed is the last. An input transformer cannot pick it: its paths name
fixed places in the event (EventBridge API, InputTransformer), so the first attempt is all it could quote.
A job the capacity fallback resubmitted (tag training:fallback-of) continues another job's lineage.
Stdlib, plus the boto3 that Lambda's Python runtime ships.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

TOPIC_ENV = "ALERT_TOPIC_ARN"
# Set by the capacity fallback's resubmitter (training_constructs/jobs/capacity_fallback/resubmit.py).
ORIGIN_TAG = "training:fallback-of"
# SNS: a subject of at most 100 characters (SNS API, Publish).
SUBJECT_LIMIT = 100


def announcement(detail: Mapping[str, Any]) -> tuple[str, str]:
    """(subject, message) for the resumed job: the latest failed attempt's number, exit, reason and log
    stream, and the job its lineage started with when the capacity fallback resubmitted it."""
    attempts = [a for a in detail.get("attempts") or [] if a.get("startedAt")]
    number = len(attempts)
    latest: Mapping[str, Any] = attempts[-1] if attempts else {}
    container = latest.get("container") or {}
    exit_code = container.get("exitCode", "unknown")
    reason = latest.get("statusReason") or container.get("reason") or "no reason given"
    stream = container.get("logStreamName") or "(no log stream)"
    name, job_id = detail.get("jobName"), detail.get("jobId")
    text = (
        f"Batch job {name} ({job_id}) is RESUMING on fresh nodes after attempt {number} failed "
        f"(exit {exit_code}, {reason}). Which node failed and what it found: the last line of log stream "
        f"{stream}, or `trainctl why {job_id}` for every attempt."
    )
    origin = (detail.get("tags") or {}).get(ORIGIN_TAG)
    if origin:
        text += f" The job continues job {origin}'s lineage (capacity fallback): it resumes that job's checkpoints."
    text += f" [queue {detail.get('jobQueue')}]"
    subject = f"Training job {name} resuming: attempt {number + 1}"[:SUBJECT_LIMIT]
    return subject, text


def handler(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    import boto3  # Lambda's Python runtime includes it

    subject, text = announcement(event.get("detail") or {})
    boto3.client("sns").publish(TopicArn=os.environ[TOPIC_ENV], Subject=subject, Message=text)
    print(json.dumps({"jobId": (event.get("detail") or {}).get("jobId"), "announced": subject}))
    return {"subject": subject, "message": text}
