"""Capacity fallback by resubmission: a job that a placement's queue cancels for lack of capacity is
submitted again, once, to the fleet's next placement's queue (resubmit.py).

Why not one queue with every placement's compute environment in order: AWS documents no rule that
keeps the nodes of one multi-node parallel job in one compute environment, and it documents that
for MNP jobs a higher-order compute environment with insufficient capacity blocks the whole queue
even when a lower-order one has room (Batch user guide, "Jobs stuck in RUNNABLE due to capacity",
note 3). A queue per placement, each with one compute environment, keeps every job whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aws_cdk import Acknowledgment, Duration, Fn, RemovalPolicy, Stack, Validations
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.metrics import CAPACITY_CANCELS, FALLBACK_RESUBMITS, FLEET_DIMENSION, NAMESPACE, PLACEMENT_DIMENSION
from training_constructs.common.nag_names import nag_name
from training_constructs.common.small_functions import depend_on_policy_only, logging_role
from training_constructs.jobs.capacity_fallback.resubmit import RESUBMITTED_REASONS
from training_constructs.jobs.capacity_fallback.routes import FallbackRoute, definition_families, routes_document

HANDLER_DIR = Path(__file__).resolve().parent


def event_pattern(queue_arns: Sequence[str]) -> events.EventPattern:
    """Capacity cancels and Capacity Block expiry stops of the given queues: the job itself, not one of its
    nodes (<id>#<n>)."""
    return events.EventPattern(
        source=["aws.batch"],
        detail_type=["Batch Job State Change"],
        detail={
            "jobQueue": list(queue_arns),
            "status": ["FAILED"],
            "statusReason": [{"prefix": prefix} for prefix in RESUBMITTED_REASONS],
            "jobId": [{"anything-but": {"wildcard": "*#*"}}],
        },
    )


class CapacityFallback(Construct):
    """Attributes: `function`, `rule`, `log_group` (one JSON line per decision)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        routes: Sequence[FallbackRoute],
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)
        role = logging_role(self, "Role", self.log_group)
        queue_arns = [queue.job_queue_arn for route in routes for queue in route.queues]
        # SubmitJob is authorized on the job queue and the job definition (Service Authorization
        # Reference, AWS Batch: SubmitJob, resource types job-definition and job-queue, the latter's
        # ARN job-definition/<name>:<revision>): the fleets' placement queues, and every revision of
        # their job definitions' families and of the trainctl families beside them. The names are
        # CloudFormation's, unique to this deployment; Ref gives the ARN with its revision.
        stack = Stack.of(self)
        prefix = f"arn:{stack.partition}:batch:{stack.region}:{stack.account}:job-definition/"
        definitions = [
            resource
            for route in routes
            for arn in route.job_definition_arns
            for resource in definition_families(prefix, Fn.select(0, Fn.split(":", Fn.select(1, Fn.split("/", arn)))))
        ]
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["batch:SubmitJob"], resources=queue_arns + definitions)
        )
        # DescribeJobs supports no resource-level permissions (same reference); jobs are tagged on
        # submission and the cancelled one is marked with its successor, on job ARNs only.
        role.add_to_principal_policy(iam.PolicyStatement(actions=["batch:DescribeJobs"], resources=["*"]))
        job_arns = stack.format_arn(service="batch", resource="job", resource_name="*")
        role.add_to_principal_policy(iam.PolicyStatement(actions=["batch:TagResource"], resources=[job_arns]))
        self.function = lambda_.Function(
            self,
            "Function",
            description="Sends a job its queue cancelled for lack of capacity to the fleet's next placement",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="resubmit.handler",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["*", "!resubmit.py"]),
            timeout=Duration.minutes(1),
            role=role,
            log_group=self.log_group,
            environment={"ROUTES": stack.to_json_string(routes_document(routes))},
        )
        self.rule = events.Rule(
            self,
            "CapacityCancels",
            description="Jobs a placement queue cancelled for lack of capacity, for the resubmitter",
            event_pattern=event_pattern(queue_arns),
            targets=[targets.LambdaFunction(self.function, retry_attempts=8)],
        )
        self._count(f"{FALLBACK_RESUBMITS}Filter", '{ $.action = "resubmitted" }', FALLBACK_RESUBMITS, False)
        self._count(f"{CAPACITY_CANCELS}Filter", '{ $.event = "capacity-cancel" }', CAPACITY_CANCELS, True)
        self._acknowledge(role, stack, job_arns, definitions)
        depend_on_policy_only(self.function, role)

    def _count(self, construct_id: str, pattern: str, metric: str, per_placement: bool) -> None:
        dimensions = {FLEET_DIMENSION: "$.fleet"} | ({PLACEMENT_DIMENSION: "$.placement"} if per_placement else {})
        self.log_group.add_metric_filter(
            construct_id,
            filter_pattern=logs.FilterPattern.literal(pattern),
            metric_namespace=NAMESPACE,
            metric_name=metric,
            metric_value="1",
            dimensions=dimensions,
        )

    def _acknowledge(self, role: iam.Role, stack: Stack, job_arns: str, definitions: Sequence[str]) -> None:
        policy = role.node.find_child("DefaultPolicy")
        family = (
            "batch:SubmitJob on every revision of one job definition family of this deployment or its trainctl "
            "family: jobs name the revision they were submitted with, older ones too"
        )
        findings = {f"Resource::{nag_name(stack, resource)}": family for resource in definitions} | {
            "Resource::*": "batch:DescribeJobs only, which supports no resource-level permissions",
            f"Resource::{nag_name(stack, job_arns)}": (
                "batch:TagResource on jobs only: the cancelled job is marked with its successor, whose id is "
                "not known before it exists"
            ),
        }
        for finding, reason in findings.items():
            Validations.of(policy).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
