"""The execution role of jobSecrets (issue 52, item 5) in the templates: it reads exactly the ARNs the key
names and writes the job logs, every job definition names it, and without the key nothing of it exists."""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Template

from tests.harness import JOB_SECRETS, VARIANTS, resources, synth
from training_constructs.jobs.job_secrets import JobSecretsAccess

STACK = "TrainingJobs"
VARIANT = "p5-four-nodes"


def statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    """Every policy statement attached to one role."""
    return [
        statement
        for policy in resources(template, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        node_range["Container"]
        for definition in resources(template, "AWS::Batch::JobDefinition").values()
        for node_range in definition["Properties"]["NodeProperties"]["NodeRangeProperties"]
    ]


def test_the_execution_role_reads_exactly_the_named_secrets_and_writes_the_job_logs() -> None:
    stack = cdk.Stack(cdk.App(), "Jobs")
    group = logs.LogGroup(stack, "Logs")
    secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf"  # noqa: S105 - an ARN
    parameters = "arn:aws-us-gov:ssm:us-gov-west-1:123456789012:parameter/training/*"
    access = JobSecretsAccess(stack, "JobSecrets", allowed=[secret, parameters])
    access.allow_logs([group])
    template = Template.from_stack(stack).to_json()

    ((role_id, role),) = resources(template, "AWS::IAM::Role").items()
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    assert "ManagedPolicyArns" not in role["Properties"]
    ((group_id, _),) = resources(template, "AWS::Logs::LogGroup").items()
    assert statements(template, role_id) == [
        {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": secret},
        {"Action": "ssm:GetParameters", "Effect": "Allow", "Resource": parameters},
        {
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [group_id, "Arn"]},
        },
    ]


def test_with_job_secrets_every_job_definition_names_the_role_and_the_outputs_say_what_it_reads() -> None:
    template = synth(VARIANT).templates[STACK]
    roles = resources(template, "AWS::IAM::Role")
    (role_id,) = [k for k in roles if k.startswith("JobSecretsAccessExecutionRole")]
    found = containers(template)
    assert found and all(c["ExecutionRoleArn"] == {"Fn::GetAtt": [role_id, "Arn"]} for c in found)
    # The job definitions themselves carry no secret: trainctl writes a job's into its revision.
    assert all("Secrets" not in c for c in found)
    outputs = template["Outputs"]
    assert outputs["JobExecutionRole"]["Value"] == {"Fn::GetAtt": [role_id, "Arn"]}
    assert outputs["JobSecrets"]["Value"] == VARIANTS[VARIANT]["jobSecrets"] == ",".join(JOB_SECRETS)
    reads = [s for s in statements(template, role_id) if not s["Action"][0].startswith("logs:")]
    assert sorted((s["Action"], s["Resource"]) for s in reads) == sorted(
        [("secretsmanager:GetSecretValue", JOB_SECRETS[0]), ("ssm:GetParameters", JOB_SECRETS[1])]
    )
    # Only the execution role reads secrets; the job role, which the training code runs as, does not.
    others = [s for k in roles if k != role_id for s in statements(template, k)]
    assert others and not any("secretsmanager" in json.dumps(s) or "ssm:GetParameter" in json.dumps(s) for s in others)


def test_without_job_secrets_the_jobs_stack_has_no_execution_role() -> None:
    template = synth("default").templates[STACK]
    assert all("ExecutionRoleArn" not in c for c in containers(template))
    assert not {"JobExecutionRole", "JobSecrets"} & set(template["Outputs"])
    assert not [k for k in resources(template, "AWS::IAM::Role") if k.startswith("JobSecrets")]
    assert "secretsmanager:GetSecretValue" not in json.dumps(template)
