"""The execution role of the platform's small Lambda functions, and the one dependency CDK should give
the function on it."""

from __future__ import annotations

from aws_cdk import CfnResource, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct


def logging_role(scope: Construct, construct_id: str, log_group: logs.ILogGroup) -> iam.Role:
    """A role Lambda assumes that may write to `log_group` only: not the AWS managed
    AWSLambdaBasicExecutionRole, which allows every log group of the account."""
    role = iam.Role(scope, construct_id, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    log_group.grant_write(role)
    return role


def depend_on_policy_only(function: Construct, role: iam.Role) -> None:
    """CDK makes a function with a given role depend on the role and on its policy; the role is
    already a GetAtt of the function (cfn-lint W3005), so keep only the policy dependency."""
    resource = function.node.default_child
    policy = role.node.find_child("DefaultPolicy").node.default_child
    if isinstance(resource, CfnResource) and isinstance(policy, CfnResource):
        resource.add_override("DependsOn", [Stack.of(function).get_logical_id(policy)])
