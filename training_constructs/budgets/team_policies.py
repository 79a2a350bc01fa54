"""One IAM managed policy per team of `budgets`: what binds a team's budget to the people who may spend it.
Attached to a team's roles or groups (docs/budgets.md), it lets them submit to this deployment's queues only
as that team, and keeps anyone from moving a job to another team afterwards.

- Fair-share queues: batch:SubmitJob only with the team's share identifier (condition key
  batch:ShareIdentifier; Batch user guide, "Resource: Use the batch:ShareIdentifier condition key"); a
  `prefix*` team matches with StringLike.
- FIFO queues: batch:SubmitJob only with the request tag trainctl:team set to the team (aws:RequestTag), and
  batch:TagResource with the same condition, which a submission that tags its job also needs (Service
  Authorization Reference, AWS Batch: SubmitJob's dependent actions).
- Both: deny batch:UntagResource of the trainctl:team key, and batch:TagResource of that key on a job that
  already has it (aws:ResourceTag is absent while the job is being created, so tagging at submission stays
  allowed).

A policy grants; it takes nothing from a role that has batch:SubmitJob from elsewhere (an administrator's):
the team is bound only for people whose SubmitJob comes from this policy alone. How IAM evaluates
aws:ResourceTag for a job being created is inferred from its documentation, not checked on AWS here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import Acknowledgment, CfnOutput, Stack, Validations
from aws_cdk import aws_iam as iam
from constructs import Construct

from budget_ledger.ledger import TEAM_TAG
from training_constructs.common.nag_names import nag_name


def output_id(team: str, taken: set[str]) -> str:
    """A CloudFormation output id for the team's policy: letters and digits only, unique in the stack."""
    base = "TeamPolicy" + "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", team.rstrip("*")) if part)
    name, number = base, 2
    while name in taken:
        name, number = f"{base}{number}", number + 1
    taken.add(name)
    return name


class TeamPolicies(Construct):
    """Attributes: `policies` (team -> its managed policy), each also a stack output."""

    def __init__(
        self, scope: Construct, construct_id: str, *, teams: Sequence[str], fair_share: bool, queue_arns: Sequence[str]
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        jobs = stack.format_arn(service="batch", resource="job", resource_name="*")
        definitions = stack.format_arn(service="batch", resource="job-definition", resource_name="*")
        self.policies: dict[str, iam.ManagedPolicy] = {}
        taken: set[str] = set()
        for index, team in enumerate(teams):
            if fair_share:
                operator = "StringLike" if team.endswith("*") else "StringEquals"
                submit = [
                    iam.PolicyStatement(
                        actions=["batch:SubmitJob"],
                        resources=[*queue_arns, definitions],
                        conditions={operator: {"batch:ShareIdentifier": team}},
                    )
                ]
            else:
                tagged = {"StringEquals": {f"aws:RequestTag/{TEAM_TAG}": team}}
                submit = [
                    iam.PolicyStatement(
                        actions=["batch:SubmitJob"], resources=[*queue_arns, definitions], conditions=tagged
                    ),
                    iam.PolicyStatement(actions=["batch:TagResource"], resources=[jobs], conditions=tagged),
                ]
            team_key = {"ForAnyValue:StringEquals": {"aws:TagKeys": [TEAM_TAG]}}
            guards = [
                iam.PolicyStatement(
                    effect=iam.Effect.DENY, actions=["batch:UntagResource"], resources=[jobs], conditions=team_key
                ),
                iam.PolicyStatement(
                    effect=iam.Effect.DENY,
                    actions=["batch:TagResource"],
                    resources=[jobs],
                    conditions={**team_key, "Null": {f"aws:ResourceTag/{TEAM_TAG}": "false"}},
                ),
            ]
            policy = iam.ManagedPolicy(
                self,
                f"Team{index}",
                description=f"Submit training jobs as team {team} (budgets) and never move a job to another team",
                statements=[*submit, *guards],
            )
            Validations.of(policy).acknowledge(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{nag_name(stack, definitions)}]",
                    reason="any job definition revision, but only into this deployment's queues and as this team",
                ),
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{nag_name(stack, jobs)}]",
                    reason="tags of jobs: IAM cannot name a job before it exists; conditions bind the team tag",
                ),
            )
            CfnOutput(
                stack,
                output_id(team, taken),
                value=policy.managed_policy_arn,
                description=f"IAM policy to attach to the submitters of team {team} (docs/budgets.md)",
            )
            self.policies[team] = policy
