"""A job that Batch retries after a failed attempt announces itself: its own EventBridge rule (apart from
the FAILED-job alert of job_alerts.py) on the app's queues, to the job-alert topic.

A retried job goes back to RUNNABLE with the failed attempt in `attempts` (Batch user guide, "Job state
change events": the event's detail is the job as DescribeJobs returns it; "Automated job retries").
The node that failed and why is the main node's last line in that attempt's log stream
(container/distributed_run.sh: "node N (host): ..."), which the message points to, with `trainctl why`.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_sns as sns
from constructs import Construct


def resumed_job_pattern(job_queue_arns: Sequence[str]) -> events.EventPattern:
    """RUNNABLE again after an attempt that started: a retry, not the first placement."""
    return events.EventPattern(
        source=["aws.batch"],
        detail_type=["Batch Job State Change"],
        detail={
            "status": ["RUNNABLE"],
            "jobQueue": list(job_queue_arns),
            # Fields inside an array of objects match on any element (EventBridge user guide, "Arrays
            # in event patterns"); `exists` matches leaf fields ("Exists matching").
            "attempts": {"startedAt": [{"exists": True}]},
            # The job, not each of its nodes (<job id>#<node>; Batch user guide, "Multi-node parallel jobs").
            "jobId": [{"anything-but": {"wildcard": "*#*"}}],
        },
    )


class ResumedJobAlerts(Construct):
    """Attributes: `rule`."""

    def __init__(
        self, scope: Construct, construct_id: str, *, job_queue_arns: Sequence[str], topic: sns.ITopic
    ) -> None:
        super().__init__(scope, construct_id)
        detail = events.EventField.from_path
        message = events.RuleTargetInput.from_text(
            f"Batch job {detail('$.detail.jobName')} ({detail('$.detail.jobId')}) is RESUMING on fresh nodes after "
            f"a failed attempt (exit {detail('$.detail.attempts[0].container.exitCode')}, "
            f"{detail('$.detail.attempts[0].statusReason')}). Which node failed and what it found: the last line "
            f"of log stream {detail('$.detail.attempts[0].container.logStreamName')}, or "
            f"`trainctl why {detail('$.detail.jobId')}` for every attempt. [queue {detail('$.detail.jobQueue')}]"
        )
        self.rule = events.Rule(
            self,
            "Rule",
            description="Training jobs resumed after a node fault or a lost host",
            event_pattern=resumed_job_pattern(job_queue_arns),
            targets=[targets.SnsTopic(topic, message=message)],
        )
