"""Failed training jobs announce themselves (not those `trainctl cancel` ended): an EventBridge rule on Batch job state
changes of the app's queues, to an encrypted SNS topic, optionally with an email subscription."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from config.job_events import TRAINCTL_CANCEL_PREFIX

# Batch sends "Batch Job State Change" events for every transition (Batch user guide, "Job state
# change events"). A job the queue cancels for being stuck RUNNABLE ends FAILED with the reason
# (CAPACITY:..., MISCONFIGURATION:...) in statusReason, so FAILED covers both. The event's
# detail.jobQueue is the queue's ARN (the same guide's example event), which the rule matches on.
ALERT_STATUSES = ("FAILED",)


def alert_detail(job_queue_arns: Sequence[str], *, quiet_prefixes: Sequence[str]) -> dict[str, Any]:
    """The rule's detail pattern: FAILED jobs of these queues, except those whose reason starts with one of
    `quiet_prefixes`: those `trainctl cancel` ended (config/job_events.py) and, with budgets, those a team
    budget stopped (budget_ledger/ledger.py; its enforcement sends one alert per team instead of one per job).

    One prefix is written as EventBridge's documented `anything-but` prefix form (EventBridge user guide,
    "Comparison operators": anything-but, begins with). Several are written as one list, as aws-cdk-lib's
    Match.anythingButPrefix renders them; only deployments with budgets use that form, so a deployment
    without them keeps the documented one. A FAILED job whose event carries no statusReason still alerts:
    `anything-but` matches only a field that is present, hence the `exists: false` branch (same guide:
    exists, $or).
    """
    prefix: str | list[str] = quiet_prefixes[0] if len(quiet_prefixes) == 1 else list(quiet_prefixes)
    return {
        "status": list(ALERT_STATUSES),
        "jobQueue": list(job_queue_arns),
        "$or": [
            {"statusReason": [{"anything-but": {"prefix": prefix}}]},
            {"statusReason": [{"exists": False}]},
        ],
    }


class JobAlerts(Construct):
    """Attributes: `topic`, `rule`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_queue_arns: Sequence[str],
        email: str | None,
        quiet_prefixes: Sequence[str] = (TRAINCTL_CANCEL_PREFIX,),
    ) -> None:
        super().__init__(scope, construct_id)
        # EventBridge can publish to an encrypted topic only with a customer managed key whose
        # policy lets it use the key (SNS developer guide, "Encryption at rest", EventBridge).
        key = kms.Key(
            self,
            "Key",
            description="Encrypts job-alert messages at rest",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
        )
        key.grant(iam.ServicePrincipal("events.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        # CloudWatch alarms publish to it too (the same guide lists cloudwatch.amazonaws.com).
        key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        self.topic = sns.Topic(self, "Topic", display_name="Training job alerts", master_key=key, enforce_ssl=True)
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))

        detail = events.EventField.from_path
        message = events.RuleTargetInput.from_text(
            f"Batch job {detail('$.detail.jobName')} ({detail('$.detail.jobId')}) "
            f"{detail('$.detail.status')}: {detail('$.detail.statusReason')} "
            f"[queue {detail('$.detail.jobQueue')}]"
        )
        self.rule = events.Rule(
            self,
            "Rule",
            description="Failed or cancelled training jobs",
            event_pattern=events.EventPattern(
                source=["aws.batch"],
                detail_type=["Batch Job State Change"],
                detail=alert_detail(job_queue_arns, quiet_prefixes=quiet_prefixes),
            ),
            targets=[targets.SnsTopic(self.topic, message=message)],
        )
