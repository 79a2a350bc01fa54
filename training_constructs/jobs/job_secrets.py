"""The execution role that lets jobs take secrets (`jobSecrets`): the ECS agent on a node reads each secret a
job's definition names in `secrets` with this role when the container starts, and hands the values to the
container as environment variables. DescribeJobs and DescribeJobDefinitions show only the ARNs.

Why an execution role, not the job role: "To use this feature, you must have the execution role and
reference it in your job definition. This allows the container agent to pull the necessary Secrets Manager
resources" (Batch user guide, "Specify sensitive data with Secrets Manager", Required IAM permissions for AWS
Batch secrets; the Parameter Store page says the same of ssm:GetParameters). The job role, which the
training code runs as, gets nothing here: a job cannot read a secret its definition does not name.

The role also writes the fleets' job logs: on the ECS-optimized AMIs Batch runs, ecs-init sets
ECS_ENABLE_AWSLOGS_EXECUTIONROLE_OVERRIDE=true, so the awslogs driver of a task that has an execution role
authenticates with that role (aws/amazon-ecs-agent README, agent configuration); without log writes a job
with secrets could not start its logging. Images are still pulled with the instance role on EC2 (ECS
developer guide, "Amazon ECS task execution IAM role": ECR pulls by the execution role are its Fargate and
external-instance cases).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.job_secrets import is_parameter

# What the ECS agent calls for each kind of secret (Batch user guide, Specify sensitive data: Secrets
# Manager and Systems Manager Parameter Store, required IAM permissions).
SECRET_ACTIONS = ("secretsmanager:GetSecretValue",)
PARAMETER_ACTIONS = ("ssm:GetParameters",)


class JobSecretsAccess(Construct):
    """An execution role (ecs-tasks.amazonaws.com) allowed to read exactly the `allowed` ARNs (a trailing *
    as written); `allow_logs` adds the job log groups it writes to. Attribute `role`."""

    def __init__(self, scope: Construct, construct_id: str, *, allowed: Sequence[str]) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description="Training job execution: read the secrets of jobSecrets when a node starts, write job logs",
        )
        secrets = [arn for arn in allowed if not is_parameter(arn)]
        parameters = [arn for arn in allowed if is_parameter(arn)]
        if secrets:
            self.role.add_to_principal_policy(iam.PolicyStatement(actions=list(SECRET_ACTIONS), resources=secrets))
        if parameters:
            self.role.add_to_principal_policy(
                iam.PolicyStatement(actions=list(PARAMETER_ACTIONS), resources=parameters)
            )
        wildcards = [arn for arn in allowed if arn.endswith("*")]
        if wildcards:
            Validations.of(self.role.node.find_child("DefaultPolicy")).acknowledge(
                *(
                    Acknowledgment(
                        id=f"AwsSolutions-IAM5[Resource::{arn}]",
                        reason="a prefix of secrets or parameters the deployment's jobSecrets key names, as written",
                    )
                    for arn in wildcards
                )
            )

    def allow_logs(self, log_groups: Sequence[logs.ILogGroup]) -> None:
        for group in log_groups:
            group.grant_write(self.role)
