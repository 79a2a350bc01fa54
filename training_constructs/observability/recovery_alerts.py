"""A job that Batch retries after a failed attempt announces itself: its own EventBridge rule (apart from
the FAILED-job alert of job_alerts.py) on the app's queues, through a small function to the job-alert topic.

A retried job goes back to RUNNABLE with the failed attempts in `attempts` (Batch user guide, "Job state
change events": the event's detail is the job as DescribeJobs returns it; "Automated job retries").
The function (resumed_alert_function/announce.py) names the latest of them, which an input transformer
cannot pick out, and the job a capacity-fallback resubmission continues. The node that failed and why is
the main node's last line in that attempt's log stream (container/launcher/ending.py: "node N (host):
..."), which the message points to, with `trainctl why`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from training_constructs.common.small_functions import (
    alarm_on_errors,
    depend_on_policy_only,
    grant_publish_to_alerts,
    logging_role,
)
from training_constructs.observability.resumed_alert_function import announce

FUNCTION_DIR = Path(__file__).with_name("resumed_alert_function")


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
    """Attributes: `rule`, `function`, `log_group`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_queue_arns: Sequence[str],
        topic: sns.ITopic,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)
        role = logging_role(self, "Role", self.log_group)
        grant_publish_to_alerts(role, topic)
        self.function = lambda_.Function(
            self,
            "Function",
            description="Announces a training job Batch resumes after a failed attempt, naming that attempt",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="announce.handler",
            code=lambda_.Code.from_asset(str(FUNCTION_DIR), exclude=["*", "!announce.py"]),
            timeout=Duration.seconds(30),
            role=role,
            log_group=self.log_group,
            environment={announce.TOPIC_ENV: topic.topic_arn},
        )
        depend_on_policy_only(self.function, role)
        alarm_on_errors(self.function, topic, "jobs resumed after a failed attempt are not announced")
        self.rule = events.Rule(
            self,
            "Rule",
            description="Training jobs resumed after a node fault or a lost host",
            event_pattern=resumed_job_pattern(job_queue_arns),
            targets=[targets.LambdaFunction(self.function, retry_attempts=8)],
        )
