"""Job metrics per fleet from AWS Batch job state change events, with no code of our own running.

AWS Batch publishes no CloudWatch metrics for jobs; it sends a "Batch Job State Change" event for every
transition (Batch user guide, "Job state change events"). Per fleet, an EventBridge rule on the fleet's
queue writes each event, reduced by an input transformer to one JSON line that names the fleet, to a log
group; metric filters count the lines per state into config.metrics.JOB_STATE_METRICS with the Fleet
dimension. A metric filter can take a dimension only from a field of the log line (CloudWatch Logs
user guide, "Publishing dimensions with metrics from values in JSON"), which is why the transformer
writes the fleet's name into it. Lighter than the alternatives: no Lambda function to run, patch and
grant, and nothing runs or bills while no job changes state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jsii
from aws_cdk import RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk.interfaces.aws_events import IRuleRef
from constructs import Construct

from config.metrics import FLEET_DIMENSION, JOB_STATE_METRICS, JOBS_RESUMED, NAMESPACE
from config.settings import fleet_construct_id
from training_constructs.observability.recovery_alerts import resumed_job_pattern

# The status written for a job Batch retried (JobsResumed).
RESUMED = "RESUMED"


def job_event_line(fleet: str, status: str | None = None) -> str:
    """The log line of one event: a JSON object with the fleet, the state entered (or `status`), the job
    and when it was created (epoch milliseconds; a RUNNING line's timestamp minus createdAt is the
    job's wait)."""
    field = events.EventField.from_path
    return (
        f'{{"fleet":"{fleet}","status":"{status or field("$.detail.status")}","jobId":"{field("$.detail.jobId")}",'
        f'"jobName":"{field("$.detail.jobName")}","createdAt":{field("$.detail.createdAt")}}}'
    )


@jsii.implements(events.IRuleTarget)
class _LogGroupTarget:
    """A log group as a rule target, without the Lambda-backed custom resource that CDK's
    CloudWatchLogGroup target deploys for every rule to set the log group's resource policy: one
    AWS::Logs::ResourcePolicy for the group does the same (EventBridge user guide, "CloudWatch Logs
    permissions")."""

    def __init__(self, log_group: logs.ILogGroup, message: events.RuleTargetInput) -> None:
        self._arn = log_group.log_group_arn
        self._message = message

    def bind(self, rule: IRuleRef, id: str | None = None) -> events.RuleTargetConfig:
        return events.RuleTargetConfig(arn=self._arn, input=self._message)


class JobMetrics(Construct):
    """Attributes: `log_group` (one line per job state change of every fleet), `rules` (fleet -> rule),
    `resumed_rules` (fleet -> the rule that counts its retried jobs).
    `job_queue_arns`: fleet -> its queues (its own, then its fallback placements')."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_queue_arns: Mapping[str, Sequence[str]],
        retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Events", retention=retention, removal_policy=RemovalPolicy.RETAIN)
        self.rules: dict[str, events.Rule] = {}
        self.resumed_rules: dict[str, events.Rule] = {}
        for fleet, queue_arns in job_queue_arns.items():
            self.rules[fleet] = events.Rule(
                self,
                f"{fleet_construct_id(fleet)}Rule",
                description=f"Job state changes of fleet {fleet}, counted into job metrics",
                event_pattern=events.EventPattern(
                    source=["aws.batch"],
                    detail_type=["Batch Job State Change"],
                    detail={
                        # The fleet's queue, and its fallback placements' (capacity_fallback).
                        "jobQueue": list(queue_arns),
                        "status": list(JOB_STATE_METRICS),
                        # The nodes of a multi-node job are addressed as <job id>#<node> (Batch user
                        # guide, "Multi-node parallel jobs"); count the job, not each of its nodes.
                        # Anything-but with a wildcard: EventBridge user guide, "Comparison operators".
                        "jobId": [{"anything-but": {"wildcard": "*#*"}}],
                    },
                ),
                targets=[
                    _LogGroupTarget(
                        self.log_group,
                        targets.LogGroupTargetInput.from_object_v2(
                            timestamp=events.EventField.time, message=job_event_line(fleet)
                        ),
                    )
                ],
            )
            # A retried job (RUNNABLE again after an attempt), as a line of status RESUMED.
            self.resumed_rules[fleet] = events.Rule(
                self,
                f"{fleet_construct_id(fleet)}ResumedRule",
                description=f"Jobs of fleet {fleet} resumed after a failed attempt, counted into {JOBS_RESUMED}",
                event_pattern=resumed_job_pattern(list(queue_arns)),
                targets=[
                    _LogGroupTarget(
                        self.log_group,
                        targets.LogGroupTargetInput.from_object_v2(
                            timestamp=events.EventField.time, message=job_event_line(fleet, status=RESUMED)
                        ),
                    )
                ],
            )
        logs.ResourcePolicy(
            self,
            "EventsWrite",
            policy_statements=[
                iam.PolicyStatement(
                    principals=[iam.ServicePrincipal("events.amazonaws.com")],
                    actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                    resources=[self.log_group.log_group_arn],
                )
            ],
        )
        # One filter per state for all fleets: the Fleet dimension comes from the line.
        for status, metric_name in {**JOB_STATE_METRICS, RESUMED: JOBS_RESUMED}.items():
            self.log_group.add_metric_filter(
                f"{metric_name}Filter",
                filter_pattern=logs.FilterPattern.string_value("$.status", "=", status),
                metric_namespace=NAMESPACE,
                metric_name=metric_name,
                metric_value="1",
                dimensions={FLEET_DIMENSION: "$.fleet"},
            )
