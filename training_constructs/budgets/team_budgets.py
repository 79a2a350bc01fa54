"""Team budgets: a retained on-demand DynamoDB ledger, a function on Batch job state changes that writes it
(and cancels on arrival a job that cannot fit its team's remainder), and a scheduled enforcement that
alerts at 80% and stops a team at 100% (budget_functions.py beside this file, docs/budgets.md).

Idle, this costs about nothing: an on-demand table bills per request and per GB stored (DynamoDB pricing,
on-demand capacity), the functions per invocation, and the enforcement's schedule (every ENFORCE_MINUTES)
is 8,928 short invocations in a 31-day month (31 x 288). docs/costs.md has the figures.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import (
    Acknowledgment,
    AssetHashType,
    BundlingOptions,
    DockerImage,
    Duration,
    ILocalBundling,
    RemovalPolicy,
    Stack,
    Validations,
)
from aws_cdk import aws_batch as batch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from budget_ledger import ledger
from config.settings import BudgetSettings
from training_constructs.budgets import budget_functions
from training_constructs.common.nag_names import nag_name
from training_constructs.common.small_functions import (
    alarm_on_any,
    alarm_on_errors,
    depend_on_policy_only,
    grant_publish_to_alerts,
    logging_role,
)

# The functions run these two files and nothing else, side by side at the asset's root: the handlers and
# the ledger they share with trainctl (budget_functions.py imports it either way).
FUNCTION_FILES = (Path(budget_functions.__file__).resolve(), Path(ledger.__file__).resolve())


@jsii.implements(ILocalBundling)
class _FunctionFiles:
    """Bundles the asset on this machine by copying FUNCTION_FILES into it: no Docker, and the asset's hash
    is that of the two files (AssetHashType.OUTPUT)."""

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: Any) -> bool:
        for source in FUNCTION_FILES:
            shutil.copyfile(source, Path(output_dir) / source.name)
        return True


def function_code() -> lambda_.Code:
    """The two files as one flat asset: CDK bundles it where it synthesizes a stack that has it (and says
    "Bundling asset ..." on stderr), from two folders that Code.from_asset's exclude list cannot join."""
    return lambda_.Code.from_asset(
        str(FUNCTION_FILES[0].parent),
        asset_hash_type=AssetHashType.OUTPUT,
        # The image is never run: local bundling always succeeds.
        bundling=BundlingOptions(image=DockerImage.from_registry("local-bundling-only"), local=_FunctionFiles()),
    )


@dataclass(frozen=True, kw_only=True)
class PricedQueue:
    """A placement's job queue and what an instance-hour there costs."""

    fleet: str
    instance_type: str
    queue: batch.IJobQueue
    usd_per_hour: float


def job_event_pattern(queue_arns: Sequence[str]) -> events.EventPattern:
    """Every state change of the queues' jobs: the job, not each of its nodes (<id>#<n>; Batch user guide,
    "Multi-node parallel jobs")."""
    return events.EventPattern(
        source=["aws.batch"],
        detail_type=["Batch Job State Change"],
        detail={"jobQueue": list(queue_arns), "jobId": [{"anything-but": {"wildcard": "*#*"}}]},
    )


class TeamBudgets(Construct):
    """Attributes: `table`, `ledger_function`, `enforcement_function`, `document` (the budgets document
    as a JSON string: the functions' BUDGETS variable and the jobs stack's `Budgets` output), `lost_events`
    (the job-event rule's dead-letter queue) and `lost_events_alarm`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: BudgetSettings,
        queues: Sequence[PricedQueue],
        timeout_seconds: int,
        attempts: int,
        check_definitions: Sequence[str],
        topic: sns.ITopic,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.table = dynamodb.Table(
            self,
            "Ledger",
            partition_key=dynamodb.Attribute(name="month", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="job", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=ledger.EXPIRES,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.document = stack.to_json_string(
            ledger.document(
                table=self.table.table_name,
                teams={t.team: t.monthly_usd for t in settings.teams},
                default_team=settings.default_team,
                fair_share=settings.fair_share,
                queues=[
                    ledger.QueuePrice(
                        queue=q.queue.job_queue_arn,
                        fleet=q.fleet,
                        instance_type=q.instance_type,
                        usd_per_hour=q.usd_per_hour,
                    )
                    for q in queues
                ],
                timeout_seconds=timeout_seconds,
                attempts=attempts,
                check_definitions=check_definitions,
            )
        )
        queue_arns = [q.queue.job_queue_arn for q in queues]
        job_arns = stack.format_arn(service="batch", resource="job", resource_name="*")
        self.ledger_function = self._function(
            "LedgerFunction",
            handler="on_job_event",
            description="Writes each training job's node-hours and dollars into the budget ledger; stops on "
            "arrival a job that cannot fit its team's budget",
            log_retention=log_retention,
            actions=["batch:TerminateJob"],
            job_arns=job_arns,
            topic=None,
        )
        self.enforcement_function = self._function(
            "EnforcementFunction",
            handler="on_schedule",
            description="Alerts a team at 80% of its monthly budget; at 100% cancels its queued jobs and stops "
            "its running ones (checkpoints kept)",
            log_retention=log_retention,
            actions=["batch:TerminateJob"],
            job_arns=job_arns,
            topic=topic,
        )
        alarm_on_errors(self.ledger_function, topic, "job costs are not recorded and no job is cancelled on arrival")
        alarm_on_errors(self.enforcement_function, topic, "no team is alerted or stopped at its budget")
        # An event EventBridge could not deliver after its retries lands here, not nowhere (EventBridge user
        # guide, "Using dead-letter queues to process undelivered events"), and an alarm says so: the job's
        # entry may then miss an end, which the enforcement closes from DescribeJobs (budget_functions.reconcile).
        self.lost_events = sqs.Queue(
            self,
            "LostJobEvents",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        Validations.of(self.lost_events).acknowledge(
            Acknowledgment(id="AwsSolutions-SQS3", reason="it is the dead-letter queue of the job-event rule's target")
        )
        self.lost_events_alarm = alarm_on_any(
            self,
            "LostJobEventsAlarm",
            self.lost_events.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5), statistic="Maximum"
            ),
            topic,
            "Job state changes did not reach the budget ledger (they wait in the LostJobEvents queue): a job's "
            "cost may be missing until the enforcement reconciles it with Batch; the ledger function's log "
            "group says why.",
        )
        self.job_rule = events.Rule(
            self,
            "JobStateChanges",
            description="Every state change of the training jobs, for the budget ledger",
            event_pattern=job_event_pattern(queue_arns),
            targets=[
                targets.LambdaFunction(self.ledger_function, retry_attempts=8, dead_letter_queue=self.lost_events)
            ],
        )
        self.schedule = events.Rule(
            self,
            "Enforcement",
            description="Budget enforcement: alerts at 80%, stops a team at 100%",
            schedule=events.Schedule.rate(Duration.minutes(budget_functions.ENFORCE_MINUTES)),
            targets=[targets.LambdaFunction(self.enforcement_function, retry_attempts=2)],
        )

    def _function(
        self,
        construct_id: str,
        *,
        handler: str,
        description: str,
        log_retention: logs.RetentionDays,
        actions: list[str],
        job_arns: str,
        topic: sns.ITopic | None,
    ) -> lambda_.Function:
        scope = Construct(self, construct_id)
        log_group = logs.LogGroup(scope, "Logs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)
        role = logging_role(scope, "Role", log_group)
        self.table.grant_read_write_data(role)
        # TerminateJob takes a job ARN and no Batch condition key names a job's queue (Service Authorization
        # Reference, AWS Batch): IAM cannot narrow this to the deployment's queues, the code does (it acts
        # only on jobs of the BUDGETS document's queues; tests/test_budget_functions.py).
        role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[job_arns]))
        environment = {budget_functions.BUDGETS_ENV: self.document}
        # DescribeJobs (both: the ledger's events may lack the job's tags), ListJobs (the enforcement) and
        # DescribeJobDefinitions (arrivals: is a job on a benchmark definition run as defined) support no
        # resource-level permissions (the same reference).
        reads = ["batch:DescribeJobs", *(["batch:ListJobs"] if topic is not None else ["batch:DescribeJobDefinitions"])]
        role.add_to_principal_policy(iam.PolicyStatement(actions=reads, resources=["*"]))
        if topic is not None:
            grant_publish_to_alerts(role, topic)
            environment[budget_functions.TOPIC_ENV] = topic.topic_arn
        function = lambda_.Function(
            scope,
            "Function",
            description=description,
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler=f"{Path(budget_functions.__file__).stem}.{handler}",
            code=function_code(),
            timeout=Duration.minutes(2),
            role=role,
            log_group=log_group,
            environment=environment,
        )
        depend_on_policy_only(function, role)
        self._acknowledge(role, job_arns)
        return function

    def _acknowledge(self, role: iam.Role, job_arns: str) -> None:
        stack = Stack.of(self)
        findings = {
            f"Resource::{nag_name(stack, job_arns)}": (
                "batch:TerminateJob takes a job ARN and no condition key names a job's queue: the functions may "
                "cancel any job in the account and region; the code only touches jobs in this deployment's queues"
            ),
            "Resource::*": (
                "batch:DescribeJobs, ListJobs and DescribeJobDefinitions only, which support no resource-level "
                "permissions"
            ),
        }
        for finding, reason in findings.items():
            Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
                Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason)
            )
