"""What team budgets deploy (training_constructs/budgets/team_budgets.py): nothing without the key; with it
(the p5-four-nodes variant, shared with the other tests), a retained on-demand ledger, the two functions
with IAM scoped to the ledger, this deployment's jobs and the alert topic, and the `Budgets` output that
trainctl reads. cdk-nag and cfn-lint run over the variant in tests/test_nag.py and tests/test_cfn_lint.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from budget_ledger import ledger
from config.metrics import NAMESPACE
from tests.harness import VARIANTS, resources, synth
from training_constructs.budgets import budget_functions

STACK = "TrainingJobs"
VARIANT = "p5-four-nodes"


def template() -> dict[str, Any]:
    return synth(VARIANT).templates[STACK]


def flatten(value: Any) -> str:
    """An Fn::Join of literals and references as one string, references as <LogicalId[.Attr]>."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(flatten(p) for p in parts)
    if "Ref" in value:
        return f"<{value['Ref']}>"
    if "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    if "Fn::ImportValue" in value:
        return f"<{value['Fn::ImportValue']}>"
    raise AssertionError(f"unexpected {value}")


def test_nothing_is_deployed_without_budgets() -> None:
    for variant in ("default", "three-fleets"):
        assert "budgets" not in VARIANTS[variant]
        for name, stack in synth(variant).templates.items():
            assert not resources(stack, "AWS::DynamoDB::Table"), name
            assert not [k for k in stack["Resources"] if k.startswith("TeamBudgets")], name
            assert "Budgets" not in stack.get("Outputs", {}), name


def test_the_ledger_is_an_on_demand_table_that_outlives_the_stack() -> None:
    (table,) = resources(template(), "AWS::DynamoDB::Table").values()
    assert table["DeletionPolicy"] == "Retain" and table["UpdateReplacePolicy"] == "Retain"
    properties = table["Properties"]
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert "ProvisionedThroughput" not in properties
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires", "Enabled": True}
    assert properties["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


def test_the_budgets_document_names_every_placement_queue_at_its_price() -> None:
    stack = template()
    document = json.loads(flatten(stack["Outputs"]["Budgets"]["Value"]))
    (table_id,) = resources(stack, "AWS::DynamoDB::Table")
    assert document["table"] == f"<{table_id}>"
    assert document["teams"] == {"llama": 20000, "vision": 5000, "sweep*": 2500}
    assert document["fairShare"] is True and document["timeoutSeconds"] == 7200
    # The job definitions' attempts: the arrival check's bound for a job that names none.
    benchmarks = {k for k, d in resources(stack, "AWS::Batch::JobDefinition").items() if "Benchmark" in k}
    assert {c.strip("<>") for c in document["checkDefinitions"]} == benchmarks and len(benchmarks) == 2
    assert document["attempts"] == 5  # the variant's jobAttempts (tests/harness.py)
    queues = {f"<{k}.JobQueueArn>" for k in resources(stack, "AWS::Batch::JobQueue")}
    assert {q["queue"] for q in document["queues"]} == queues
    # budgetPrices gives the gpu fleet's p5.48xlarge a reservation's $40; trainium keeps the list price.
    prices = {(q["fleet"], q["instanceType"], q["usdPerHour"]) for q in document["queues"]}
    assert prices == {("gpu", "p5.48xlarge", 40), ("trainium", "trn1.32xlarge", 21.5)}
    functions = {k: f for k, f in resources(stack, "AWS::Lambda::Function").items() if k.startswith("TeamBudgets")}
    assert len(functions) == 2
    for function in functions.values():
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables[budget_functions.BUDGETS_ENV] == stack["Outputs"]["Budgets"]["Value"]


def policy_of(stack: dict[str, Any], function_prefix: str) -> list[dict[str, Any]]:
    (policy,) = [
        p for k, p in resources(stack, "AWS::IAM::Policy").items() if k.startswith(f"TeamBudgets{function_prefix}")
    ]
    return list(policy["Properties"]["PolicyDocument"]["Statement"])


def test_the_functions_may_terminate_any_job_of_the_account_and_region_for_want_of_a_queue_condition() -> None:
    """batch:TerminateJob takes a job ARN and Batch has no condition key that names a job's queue (Service
    Authorization Reference, AWS Batch): the grant is job/* of the account and region, and the code, not
    IAM, keeps the functions to this deployment's queues (tests/test_budget_functions.py pins that).
    TerminateJob, not CancelJob: it also stops a job that already started."""
    stack = template()
    (table_id,) = resources(stack, "AWS::DynamoDB::Table")
    for prefix, batch_actions in (
        ("LedgerFunction", {"batch:TerminateJob"}),
        ("EnforcementFunction", {"batch:TerminateJob"}),
    ):
        statements = policy_of(stack, prefix)
        for statement in statements:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resource = flatten(statement["Resource"]) if not isinstance(statement["Resource"], list) else None
            if any(a.startswith("dynamodb:") for a in actions):
                assert resource == f"<{table_id}.Arn>"
            elif set(actions) & {"batch:CancelJob", "batch:TerminateJob"}:
                assert set(actions) == batch_actions
                assert resource is not None and resource.endswith(":job/*")
            elif set(actions) & {"batch:ListJobs", "batch:DescribeJobs"}:
                # No resource-level permissions for these (Service Authorization Reference, AWS Batch). The
                # ledger function describes every job, and a benchmark job's definition; only the enforcement
                # lists.
                listed = {"batch:ListJobs"} if prefix == "EnforcementFunction" else {"batch:DescribeJobDefinitions"}
                assert set(actions) == {"batch:DescribeJobs"} | listed
                assert statement["Resource"] == "*"
            elif "sns:Publish" in actions:
                assert prefix == "EnforcementFunction" and resource is not None and "JobAlerts" in resource
            else:
                assert set(actions) <= {
                    "logs:CreateLogStream",
                    "logs:PutLogEvents",
                    "kms:Decrypt",
                    "kms:GenerateDataKey*",
                }
        assert not any(
            a == "*" or a == "batch:*"
            for s in statements
            for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        )


def test_job_events_of_every_queue_reach_the_ledger_and_the_enforcement_runs_every_five_minutes() -> None:
    stack = template()
    rules = {
        k: r["Properties"] for k, r in resources(stack, "AWS::Events::Rule").items() if k.startswith("TeamBudgets")
    }
    (events,) = [r for r in rules.values() if "EventPattern" in r]
    queues = [{"Fn::GetAtt": [k, "JobQueueArn"]} for k in resources(stack, "AWS::Batch::JobQueue")]
    assert events["EventPattern"]["detail"]["jobQueue"] == queues
    assert "status" not in events["EventPattern"]["detail"]  # every state: arrival, running, ended
    (schedule,) = [r for r in rules.values() if "ScheduleExpression" in r]
    assert schedule["ScheduleExpression"] == f"rate({budget_functions.ENFORCE_MINUTES} minutes)"


def test_job_events_that_cannot_be_delivered_wait_in_a_queue_that_alarms_to_the_alert_topic() -> None:
    stack = template()
    (events,) = [
        r["Properties"] for k, r in resources(stack, "AWS::Events::Rule").items()
        if k.startswith("TeamBudgets") and "EventPattern" in r["Properties"]
    ]  # fmt: skip
    (target,) = events["Targets"]
    (queue_id,) = [k for k in resources(stack, "AWS::SQS::Queue") if k.startswith("TeamBudgets")]
    assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [queue_id, "Arn"]}}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 8
    (policy,) = [p["Properties"] for p in resources(stack, "AWS::SQS::QueuePolicy").values()
                 if {"Ref": queue_id} in p["Properties"]["Queues"]]  # fmt: skip
    sends = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert any(s["Principal"] == {"Service": "events.amazonaws.com"} and s["Action"] == "sqs:SendMessage"
               for s in sends)  # fmt: skip
    (alarm,) = [a["Properties"] for a in resources(stack, "AWS::CloudWatch::Alarm").values()
                if {"Name": "QueueName", "Value": {"Fn::GetAtt": [queue_id, "QueueName"]}}
                in a["Properties"].get("Dimensions", [])]  # fmt: skip
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible" and alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    (topic,) = resources(stack, "AWS::SNS::Topic")
    assert alarm["AlarmActions"] == [{"Ref": topic}]


def test_the_functions_ship_the_two_ledger_files_only() -> None:
    assembly = synth(VARIANT).assembly
    stack = template()
    keys = {
        f["Properties"]["Code"]["S3Key"]
        for k, f in resources(stack, "AWS::Lambda::Function").items()
        if k.startswith("TeamBudgets")
    }
    (key,) = keys
    folder = Path(assembly.directory) / f"asset.{key.removesuffix('.zip')}"
    assert sorted(p.name for p in folder.iterdir()) == ["budget_functions.py", "ledger.py"]
    # Side by side, as the handler's fallback import expects: the two sources unchanged.
    for module in (budget_functions, ledger):
        assert (folder / Path(module.__file__).name).read_bytes() == Path(module.__file__).read_bytes()
    # The dashboard reads the metric the enforcement writes.
    assert budget_functions.METRIC_NAMESPACE == NAMESPACE


def test_the_dashboard_draws_each_teams_spend_against_its_budget() -> None:
    monitoring = synth(VARIANT).templates["TrainingMonitoring"]
    (dashboard,) = resources(monitoring, "AWS::CloudWatch::Dashboard").values()
    body = json.loads(flatten(dashboard["Properties"]["DashboardBody"]))
    graphs = {w["properties"].get("title", ""): w["properties"] for w in body["widgets"] if w["type"] == "metric"}
    llama = graphs["Team llama: USD this month of $20,000"]
    assert llama["metrics"] == [
        [
            NAMESPACE,
            budget_functions.SPENT_METRIC,
            "Team",
            "llama",
            {"label": "spent", "stat": "Maximum"},
        ]
    ]
    assert [a["value"] for a in llama["annotations"]["horizontal"]] == [16000, 20000]
    assert "Team sweep*: USD this month of $2,500" in graphs
    default = synth("default").templates["TrainingMonitoring"]
    assert budget_functions.SPENT_METRIC not in json.dumps(default)


def _team_policies(stack: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each team policy's statements, by the team its description names."""
    found = {}
    for policy in resources(stack, "AWS::IAM::ManagedPolicy").values():
        described = policy["Properties"].get("Description", "")
        if described.startswith("Submit training jobs as team "):
            found[described.split()[5]] = policy["Properties"]["PolicyDocument"]["Statement"]
    return found


def test_each_team_gets_a_policy_that_submits_only_as_that_team_and_never_retags() -> None:
    stack = template()
    policies = _team_policies(stack)
    teams = json.loads(VARIANTS[VARIANT]["budgets"])
    assert set(policies) == set(teams)
    queues = [{"Fn::GetAtt": [k, "JobQueueArn"]} for k in resources(stack, "AWS::Batch::JobQueue")]
    fair_share = "shares" in VARIANTS[VARIANT]
    for team, statements in policies.items():
        submits = [s for s in statements if s["Action"] == "batch:SubmitJob"]
        assert len(submits) == 1 and submits[0]["Effect"] == "Allow"
        assert all(q in submits[0]["Resource"] for q in queues)
        if fair_share:
            operator = "StringLike" if team.endswith("*") else "StringEquals"  # sweep* covers sweep7
            assert submits[0]["Condition"] == {operator: {"batch:ShareIdentifier": team}}
        else:
            tagged = {"StringEquals": {f"aws:RequestTag/{ledger.TEAM_TAG}": team}}
            assert submits[0]["Condition"] == tagged
            (tag,) = [s for s in statements if s["Action"] == "batch:TagResource" and s["Effect"] == "Allow"]
            assert tag["Condition"] == tagged
        denied = {s["Action"]: s["Condition"] for s in statements if s["Effect"] == "Deny"}
        team_key = {"ForAnyValue:StringEquals": {"aws:TagKeys": [ledger.TEAM_TAG]}}
        assert denied["batch:UntagResource"] == team_key
        assert denied["batch:TagResource"] == {**team_key, "Null": {f"aws:ResourceTag/{ledger.TEAM_TAG}": "false"}}
    outputs = {k: v for k, v in stack["Outputs"].items() if k.startswith("TeamPolicy")}
    assert len(outputs) == len(teams)
    assert all("Ref" in o["Value"] for o in outputs.values())


def test_on_fifo_queues_a_team_policy_needs_the_team_tag_to_submit_and_to_tag() -> None:
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from training_constructs.budgets.team_policies import TeamPolicies

    stack = cdk.Stack(cdk.App(), "Jobs")
    queue = "arn:aws:batch:us-east-1:123456789012:job-queue/gpu"
    TeamPolicies(stack, "TeamPolicies", teams=["llama", "vision"], fair_share=False, queue_arns=[queue])
    policies = _team_policies(Template.from_stack(stack).to_json())
    assert set(policies) == {"llama", "vision"}
    for team, statements in policies.items():
        tagged = {"StringEquals": {f"aws:RequestTag/{ledger.TEAM_TAG}": team}}
        allowed = {s["Action"]: s for s in statements if s["Effect"] == "Allow"}
        assert set(allowed) == {"batch:SubmitJob", "batch:TagResource"}
        assert all(s["Condition"] == tagged for s in allowed.values())
        assert queue in allowed["batch:SubmitJob"]["Resource"]


def test_output_ids_are_letters_and_digits_and_unique() -> None:
    from training_constructs.budgets.team_policies import output_id

    taken: set[str] = set()
    assert [output_id(t, taken) for t in ("llama", "vision-v2", "vision_v2", "sweep*")] == [
        "TeamPolicyLlama", "TeamPolicyVisionV2", "TeamPolicyVisionV22", "TeamPolicySweep",
    ]  # fmt: skip
