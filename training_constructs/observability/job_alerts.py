"""Failed training jobs announce themselves (not those the platform stopped on purpose): an EventBridge rule on
Batch job state changes of the app's queues, to an encrypted SNS topic, optionally with an email subscription."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jsii
from aws_cdk import RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from config.job_events import QUIET_REASON_PREFIX

# Batch sends "Batch Job State Change" events for every transition (Batch user guide, "Job state
# change events"). A job the queue cancels for being stuck RUNNABLE ends FAILED with the reason
# (CAPACITY:..., MISCONFIGURATION:...) in statusReason, so FAILED covers both. The event's
# detail.jobQueue is the queue's ARN (the same guide's example event), which the rule matches on.
ALERT_STATUSES = ("FAILED",)


def alert_detail(job_queue_arns: Sequence[str], *, quiet_prefix: str = QUIET_REASON_PREFIX) -> dict[str, Any]:
    """The rule's detail pattern: FAILED jobs of these queues, except those whose reason starts with
    `quiet_prefix`, which every reason the platform stops a job with on purpose starts with
    (config/job_events.py: `trainctl cancel`'s, and the team budgets', whose enforcement sends one alert per
    team instead of one per job).

    One prefix, in EventBridge's documented `anything-but` prefix form (EventBridge user guide, "Comparison
    operators": anything-but, begins with). A FAILED job whose event carries no statusReason still alerts:
    `anything-but` matches only a field that is present, hence the `exists: false` branch (same guide:
    exists, $or).
    """
    return {
        "status": list(ALERT_STATUSES),
        "jobQueue": list(job_queue_arns),
        "$or": [
            {"statusReason": [{"anything-but": {"prefix": quiet_prefix}}]},
            {"statusReason": [{"exists": False}]},
        ],
    }


@jsii.implements(events.IRuleTarget)
class _TopicOfThisRule:
    """The topic as the rule's target, published to only by this rule. aws-cdk-lib's SnsTopic target lets
    events.amazonaws.com publish with no condition, so any account's rule that knows the topic's ARN could;
    here the topic policy's statement carries aws:SourceArn, which for a rule's target is the rule's ARN
    (EventBridge user guide, "Cross-service confused deputy prevention"). The KMS key's grant to EventBridge
    stays without it: nothing documents that the key carries on to KMS, and a condition that never matches
    would lose every alert in silence."""

    def __init__(self, topic: sns.ITopic, message: events.RuleTargetInput) -> None:
        self._topic = topic
        self._message = message

    def bind(self, rule: events.IRule, id: str | None = None) -> events.RuleTargetConfig:
        # The topic policy only: grant_publish would write the same condition into the key's policy too.
        self._topic.add_to_resource_policy(
            iam.PolicyStatement(
                actions=["sns:Publish"],
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                resources=[self._topic.topic_arn],
                conditions={"ArnEquals": {"aws:SourceArn": rule.rule_arn}},
            )
        )
        return events.RuleTargetConfig(arn=self._topic.topic_arn, input=self._message)


class JobAlerts(Construct):
    """Attributes: `topic`, `rule`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_queue_arns: Sequence[str],
        email: str | None,
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
                detail=alert_detail(job_queue_arns),
            ),
            targets=[_TopicOfThisRule(self.topic, message)],
        )
