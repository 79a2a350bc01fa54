"""What the platform's small Lambda functions (the boot-check breaker, the capacity resubmitter, the
cloud build's reporter and starter, the resumed-job announcer) share: a role that writes to the
function's own log group only, publishing to the job-alert topic, the one dependency CDK should give the
function on its role, and an alarm when the function fails."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnResource, Duration, Stack, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct


def logging_role(scope: Construct, construct_id: str, log_group: logs.ILogGroup) -> iam.Role:
    """A role Lambda assumes that may write to `log_group` only: not the AWS managed
    AWSLambdaBasicExecutionRole, which allows every log group of the account."""
    role = iam.Role(scope, construct_id, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    log_group.grant_write(role)
    return role


def grant_publish_to_alerts(role: iam.Role, topic: sns.ITopic) -> None:
    """The role may publish to the (KMS-encrypted) job-alert topic."""
    topic.grant_publish(role)
    # Publishing to an encrypted topic needs kms:GenerateDataKey* and kms:Decrypt on its key (SNS
    # developer guide, "Encryption at rest"); CDK's grant_publish adds them, on that key only.
    Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
            reason="publish to the encrypted job-alert topic: data keys of the topic's own KMS key only",
        )
    )


def depend_on_policy_only(function: Construct, role: iam.Role) -> None:
    """CDK makes a function with a given role depend on the role and on its policy; the role is
    already a GetAtt of the function (cfn-lint W3005), so keep only the policy dependency."""
    resource = function.node.default_child
    policy = role.node.find_child("DefaultPolicy").node.default_child
    if isinstance(resource, CfnResource) and isinstance(policy, CfnResource):
        resource.add_override("DependsOn", [Stack.of(function).get_logical_id(policy)])


def alarm_on_any(
    scope: Construct, construct_id: str, metric: cloudwatch.IMetric, topic: sns.ITopic, description: str
) -> cloudwatch.Alarm:
    """An alarm to `topic` as soon as `metric` reaches 1 in one period; no data is no alarm."""
    alarm = metric.create_alarm(
        scope,
        construct_id,
        alarm_description=description,
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )
    alarm.add_alarm_action(actions.SnsAction(topic))
    return alarm


def alarm_on_errors(function: lambda_.Function, topic: sns.ITopic, what_stops: str) -> cloudwatch.Alarm:
    """An alarm to `topic` when the function fails (its Errors metric: invocations that ended in an
    error, Lambda developer guide, "Using CloudWatch metrics with Lambda"), so that a function acting on
    AWS's events cannot stop working in silence. `what_stops` says what no longer happens meanwhile."""
    return alarm_on_any(
        function,
        "Errors",
        function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
        topic,
        f"The function {function.node.path} failed: {what_stops} until it works again. Its log group has the error.",
    )
