"""The jobs stack's queues (FIFO or fair share, one compute environment each, RUNNABLE limits),
their alerts, the job role's permissions and the stack's outputs."""

import json
import re

import pytest

from config.context import read_settings
from config.job_events import QUIET_REASON_PREFIX, TRAINCTL_CANCEL_REASON
from tests.harness import VARIANTS, resources, synth
from tests.test_jobs import CAPACITY, STACK, container, job_roles, queue_ids
from trainctl.submitting.workdir import PREFIX as WORKDIR_PREFIX
from training_constructs.jobs.training_jobs import ECS_EXEC_ACTIONS, NODE_WATCH_ACTIONS


def scheduling_policy(variant):
    template = synth(variant).templates[STACK]
    ((policy_id, policy),) = resources(template, "AWS::Batch::SchedulingPolicy").items()
    return policy_id, policy["Properties"]["FairsharePolicy"]


def test_fair_share_weights_invert_the_context_shares():
    _, policy = scheduling_policy("p5-four-nodes")
    weights = {s["ShareIdentifier"]: s["WeightFactor"] for s in policy["ShareDistribution"]}
    # llama:2 must get twice vision's compute, so half its weight factor (lower weight, more compute).
    assert weights == {"llama": 0.5, "vision": 1.0, "sweep*": 0.25}
    for share in read_settings(VARIANTS["p5-four-nodes"]).jobs.shares:
        assert weights[share.identifier] * share.share == pytest.approx(1.0)
    assert policy["ShareDecaySeconds"] == 3600


def queue(variant, fleet_id):
    template = synth(variant).templates[STACK]
    (props,) = [
        r["Properties"] for k, r in resources(template, "AWS::Batch::JobQueue").items() if k.startswith(fleet_id)
    ]
    return props


@pytest.mark.parametrize("fleet_id", ["Gpu", "Trainium"])
def test_queues_are_fifo_unless_shares_are_given(fleet_id):
    # A fair-share queue refuses submissions without --share-identifier; FIFO is the default.
    assert not resources(synth("default").templates[STACK], "AWS::Batch::SchedulingPolicy")
    assert "SchedulingPolicyArn" not in queue("default", fleet_id)
    policy_id, _ = scheduling_policy("p5-four-nodes")
    assert queue("p5-four-nodes", fleet_id)["SchedulingPolicyArn"] == {"Fn::GetAtt": [policy_id, "Arn"]}


@pytest.mark.parametrize("fleet_id", ["Gpu", "Trainium"])
def test_each_queue_is_on_its_own_compute_environment(fleet_id):
    props = queue("default", fleet_id)
    assert props["State"] == "ENABLED"
    (order,) = props["ComputeEnvironmentOrder"]
    # The imported ARN is the compute stack's export of this fleet's compute environment.
    compute = synth("default").templates["TrainingCompute"]
    (exported,) = [
        o["Value"]
        for o in compute["Outputs"].values()
        if o["Export"]["Name"] == order["ComputeEnvironment"]["Fn::ImportValue"]
    ]
    (ce_id,) = [k for k in resources(compute, "AWS::Batch::ComputeEnvironment") if k.startswith(fleet_id)]
    assert exported == {"Fn::GetAtt": [ce_id, "ComputeEnvironmentArn"]}


STUCK = {
    CAPACITY,
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE",
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
}


@pytest.mark.parametrize(("variant", "minutes"), [("default", 60), ("three-fleets", 30)])
def test_every_queue_cancels_jobs_stuck_runnable(variant, minutes):
    template = synth(variant).templates[STACK]
    queues = resources(template, "AWS::Batch::JobQueue").values()
    short = [template["Resources"][k] for k in queue_ids(template)[:-1]] if variant == "three-fleets" else []
    assert queues
    for q in queues:
        actions = q["Properties"]["JobStateTimeLimitActions"]
        assert {a["Reason"] for a in actions} == STUCK
        for action in actions:
            assert (action["State"], action["Action"]) == ("RUNNABLE", "CANCEL")
            # llm's placements before its last wait 10 minutes for capacity (tests below).
            if not (action["Reason"] == CAPACITY and q in short):
                assert action["MaxTimeSeconds"] == minutes * 60
            assert 600 <= action["MaxTimeSeconds"] <= 86400  # the API's bounds


def alert_rule(variant):
    template = synth(variant).templates[STACK]
    (rule,) = [r for k, r in resources(template, "AWS::Events::Rule").items() if k.startswith("JobAlerts")]
    return template, rule["Properties"]


@pytest.mark.parametrize("variant", ["default", "three-fleets"])
def test_failed_and_cancelled_jobs_of_every_queue_reach_an_encrypted_topic(variant):
    template, rule = alert_rule(variant)
    pattern = rule["EventPattern"]
    assert pattern["source"] == ["aws.batch"] and pattern["detail-type"] == ["Batch Job State Change"]
    assert pattern["detail"]["status"] == ["FAILED"]
    queue_ids = sorted(resources(template, "AWS::Batch::JobQueue"))
    assert sorted(q["Fn::GetAtt"][0] for q in pattern["detail"]["jobQueue"]) == queue_ids
    ((topic_id, topic),) = resources(template, "AWS::SNS::Topic").items()
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Ref": topic_id}
    assert "statusReason" in json.dumps(target["InputTransformer"])
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = template["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    assert "events.amazonaws.com" in json.dumps(key["KeyPolicy"])
    (topic_policy,) = resources(template, "AWS::SNS::TopicPolicy").values()
    text = json.dumps(topic_policy)
    assert "events.amazonaws.com" in text and "aws:SecureTransport" in text


def batch_event(queue_arn, status, reason=None):
    """A "Batch Job State Change" event as the Batch user guide's example shows it."""
    detail = {"jobName": "h1", "jobId": "1234", "jobQueue": queue_arn, "status": status}
    if reason is not None:
        detail["statusReason"] = reason
    return {"source": "aws.batch", "detail-type": "Batch Job State Change", "detail": detail}


def alert_matcher(variant):
    """The alert rule's pattern as deployed in `variant`, its queue references resolved to one ARN, and a
    matcher for it: moto's implementation of EventBridge's pattern rules (prefix, anything-but, exists, $or)."""
    from moto.events.models import EventPattern

    _, rule = alert_rule(variant)
    pattern = json.loads(json.dumps(rule["EventPattern"]))
    pattern["detail"]["jobQueue"] = [QUEUE_ARN]
    return pattern, EventPattern.load(json.dumps(pattern))


QUEUE_ARN = "arn:aws:batch:us-east-1:123456789012:job-queue/gpu"
BUDGET_STOP = "trainctl budget: team vision reached $1,010 of its $1,000 budget for November 2026: stopped"


def test_a_trainctl_cancel_pages_nobody_and_every_other_failure_does():
    queue = QUEUE_ARN
    pattern, matcher = alert_matcher("default")
    assert not matcher.matches_event(batch_event(queue, "FAILED", TRAINCTL_CANCEL_REASON))
    assert not matcher.matches_event(batch_event(queue, "FAILED", f"{TRAINCTL_CANCEL_REASON} (sweep gpu-1)"))
    # The documented single-prefix form (no list), with budgets or without.
    assert pattern["detail"]["$or"][0]["statusReason"] == [{"anything-but": {"prefix": QUIET_REASON_PREFIX}}]
    for reason in (
        "Essential container in task exited",
        "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
        # Someone else's TerminateJob, and a reason that only mentions trainctl later on.
        "Terminated by the on-call",
        "node 1: trainctl cancel: cancelled on request",
        "cancelled with trainctl cancel",  # the reason of trainctl before 2026-11-28: it pages now
    ):
        assert matcher.matches_event(batch_event(queue, "FAILED", reason)), reason
    assert matcher.matches_event(batch_event(queue, "FAILED"))
    assert not matcher.matches_event(batch_event(queue, "SUCCEEDED", "Essential container in task exited"))
    assert not matcher.matches_event(batch_event(queue + "-other", "FAILED", "Essential container in task exited"))


def test_with_budgets_a_budget_stop_pages_nobody_per_job():
    # The enforcement alerts once per team; the per-job alert leaves budget stops out, and only there.
    assert VARIANTS["p5-four-nodes"].get("budgets")
    pattern, matcher = alert_matcher("p5-four-nodes")
    assert pattern["detail"]["$or"][0]["statusReason"] == [{"anything-but": {"prefix": QUIET_REASON_PREFIX}}]
    assert not matcher.matches_event(batch_event(QUEUE_ARN, "FAILED", BUDGET_STOP))
    assert not matcher.matches_event(batch_event(QUEUE_ARN, "FAILED", TRAINCTL_CANCEL_REASON))
    assert matcher.matches_event(batch_event(QUEUE_ARN, "FAILED", "Essential container in task exited"))
    assert matcher.matches_event(batch_event(QUEUE_ARN, "FAILED"))


def test_every_deliberate_stop_shares_the_one_quiet_prefix():
    from budget_ledger.ledger import BATCH_REASON_PREFIX

    assert TRAINCTL_CANCEL_REASON.startswith(QUIET_REASON_PREFIX)
    assert BATCH_REASON_PREFIX.startswith(QUIET_REASON_PREFIX)
    # Batch's own reasons never start with it.
    for reason in ("Essential container in task exited", "Host EC2 (instance i-0) terminated.", "CAPACITY:x"):
        assert not reason.startswith(QUIET_REASON_PREFIX)


def test_only_the_alert_rule_may_publish_to_the_alert_topic_through_eventbridge():
    """EventBridge user guide, "Cross-service confused deputy prevention": a rule target's aws:SourceArn is the
    rule's ARN; the topic policy lets events.amazonaws.com publish only for the alert rule."""
    template = synth("default").templates[STACK]
    (rule_id,) = [k for k in resources(template, "AWS::Events::Rule") if k.startswith("JobAlerts")]
    (policy,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::SNS::TopicPolicy"]
    events_statements = [
        s for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if s.get("Principal") == {"Service": "events.amazonaws.com"}
    ]  # fmt: skip
    assert len(events_statements) == 1
    assert events_statements[0]["Effect"] == "Allow"
    assert events_statements[0]["Condition"] == {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [rule_id, "Arn"]}}}


def test_ecs_exec_is_on_by_default_and_the_context_key_removes_it_and_its_permissions():
    on = synth("default").templates[STACK]
    off = synth("two-nat").templates[STACK]
    assert VARIANTS["two-nat"]["ecsExec"] == "false"
    for props in resources(on, "AWS::Batch::JobDefinition").values():
        assert container(props["Properties"])["EnableExecuteCommand"] is True
    for props in resources(off, "AWS::Batch::JobDefinition").values():
        assert "EnableExecuteCommand" not in container(props["Properties"])
    exec_statements = [s for s in job_policy_statements("default") if "ssmmessages" in json.dumps(s["Action"])]
    # IAM policy minimization merges the statements on "*": ECS Exec's four channel actions, the one its
    # session logging needs on every log group and the node watcher's DescribeJobs, nothing else.
    assert exec_statements == [
        {
            "Action": [
                "batch:DescribeJobs",
                "logs:DescribeLogGroups",
                "ssmmessages:CreateControlChannel",
                "ssmmessages:CreateDataChannel",
                "ssmmessages:OpenControlChannel",
                "ssmmessages:OpenDataChannel",
            ],
            "Effect": "Allow",
            "Resource": "*",
        }
    ]
    assert "ssmmessages" not in json.dumps(job_policy_statements("two-nat"))
    assert "logs:DescribeLog" not in json.dumps(job_policy_statements("two-nat"))


def test_ecs_exec_sessions_may_log_to_the_job_log_groups_and_nowhere_else():
    """ECS developer guide, "Monitor Amazon ECS containers with ECS Exec", IAM permissions required for
    CloudWatch Logs logging: DescribeLogGroups on every log group; CreateLogStream, DescribeLogStreams
    and PutLogEvents on the log group the session writes to (the task's awslogs group, Batch's cluster
    keeping the default logging)."""
    template = synth("three-fleets").templates[STACK]
    job_log_groups = sorted(
        k for k in resources(template, "AWS::Logs::LogGroup") if re.fullmatch(r"(Rl|Llm|Trn)Logs.*", k)
    )
    assert len(job_log_groups) == 3
    statements = job_policy_statements("three-fleets")
    (lookup,) = [s for s in statements if "logs:DescribeLogGroups" in s["Action"]]
    assert lookup["Resource"] == "*"
    assert set(lookup["Action"]) - set(ECS_EXEC_ACTIONS) - set(NODE_WATCH_ACTIONS) == {"logs:DescribeLogGroups"}
    (writes,) = [s for s in statements if "logs:DescribeLogStreams" in s["Action"]]
    assert writes["Action"] == ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]
    assert writes["Resource"] == [{"Fn::GetAtt": [group, "Arn"]} for group in job_log_groups]


def test_alert_email_is_subscribed_only_when_given():
    assert not resources(synth("default").templates[STACK], "AWS::SNS::Subscription")
    (subscription,) = resources(synth("three-fleets").templates[STACK], "AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == VARIANTS["three-fleets"]["alertEmail"]


def job_policy_statements(variant):
    template = synth(variant).templates[STACK]
    return [
        s
        for p in resources(template, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_job_role_is_for_ecs_tasks_only():
    ((_, role),) = job_roles("default").items()
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    assert "ManagedPolicyArns" not in role["Properties"]


def test_no_permission_on_every_resource():
    for statement in job_policy_statements("default"):
        resources_ = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        # ECS Exec's ssmmessages actions and batch:DescribeJobs have no resource type, and ECS Exec's session
        # logging needs logs:DescribeLogGroups on every group: the one statement on "*", exactly them.
        if statement["Action"] == [*NODE_WATCH_ACTIONS, "logs:DescribeLogGroups", *ECS_EXEC_ACTIONS]:
            continue
        assert "*" not in resources_
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert "s3:*" not in actions and "*" not in actions


def test_datasets_are_read_only_and_checkpoints_writable():
    writes = ("s3:PutObject", "s3:DeleteObject", "s3:Abort*")
    on_datasets, on_checkpoints = set(), set()
    for statement in job_policy_statements("default"):
        if statement.get("Effect", "Allow") != "Allow":
            continue
        text = json.dumps(statement["Resource"])
        actions = set(statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])
        if "DatasetBucketArn" in text:
            on_datasets |= actions
        if "CheckpointBucketArn" in text:
            on_checkpoints |= actions
    assert on_datasets and not {a for a in on_datasets if a.startswith(("s3:Put", "s3:Delete", "s3:Abort"))}
    assert "s3:GetObject*" in on_datasets
    assert set(writes) <= on_checkpoints and "s3:GetObject*" in on_checkpoints


def allows(action_pattern: str, action: str) -> bool:
    """Whether an IAM action pattern (wildcards * and ?) covers `action` (IAM matches case-insensitively)."""
    regex = re.escape(action_pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, action.lower()) is not None


def test_allows_matches_iam_wildcards():
    assert allows("s3:DeleteObject*", "s3:DeleteObjectVersion") and allows("s3:*", "s3:DeleteObjectVersion")
    assert allows("*", "s3:DeleteObjectVersion") and not allows("s3:DeleteObject", "s3:DeleteObjectVersion")


@pytest.mark.parametrize("action", ["s3:GetObject", "s3:GetObjectVersion"])
def test_job_role_reads_the_workdirs_trainctl_uploads(action):
    """Every node's launcher reads <dataset bucket>/workdirs/<digest>.tar.gz with the job role, the version
    WORKDIR_URI pins included (GetObject with a versionId needs s3:GetObjectVersion; container/launcher/
    workdir_fetch.py); the test above keeps every write to that bucket away from jobs."""
    dataset_objects = set()
    statements = job_policy_statements("default")
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement.get("Effect", "Allow") != "Allow" or not any(allows(a, action) for a in actions):
            continue
        for resource in statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]:
            parts = resource.get("Fn::Join", ["", []])[1] if isinstance(resource, dict) else []
            if parts[:1] == [{"Fn::ImportValue": "TrainingData-DatasetBucketArn"}]:
                dataset_objects.add("".join(parts[1:]))
    assert dataset_objects & {"/*", f"/{WORKDIR_PREFIX}*"}, dataset_objects
    denied = [s for s in statements if s.get("Effect") == "Deny"]
    assert not any(
        allows(a, action) for s in denied for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    )


def test_job_role_may_list_the_checkpoint_bucket():
    """A restore lists the lineage's node manifests (ListObjectsV2, container/launcher/checkpoint_store.py
    restore_order), and reads a manifest that may not exist yet: both need s3:ListBucket on the bucket itself
    (S3 API reference, ListObjectsV2 "Permissions"; GetObject: without s3:ListBucket a missing key answers 403
    Access Denied, not 404, and the first attempt would stop)."""
    buckets = set()
    for statement in job_policy_statements("default"):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement.get("Effect", "Allow") != "Allow" or not any(allows(a, "s3:ListBucket") for a in actions):
            continue
        for resource in statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]:
            if isinstance(resource, dict) and "Fn::ImportValue" in resource:
                buckets.add(resource["Fn::ImportValue"])
    assert "TrainingData-CheckpointBucketArn" in buckets, buckets


def test_job_role_can_never_delete_a_checkpoint_version():
    statements = job_policy_statements("default")
    for statement in statements:
        if statement.get("Effect", "Allow") == "Allow":
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert not any(allows(a, "s3:DeleteObjectVersion") for a in actions), statement
    (deny,) = [s for s in statements if s.get("Effect") == "Deny"]
    assert deny["Action"] == "s3:DeleteObjectVersion"
    text = json.dumps(deny["Resource"])
    assert "CheckpointBucketArn" in text and "DatasetBucketArn" in text and text.count("/*") == 2


def test_outputs_name_queues_job_definitions_and_log_groups():
    outputs = synth("default").templates[STACK]["Outputs"]
    for profile in ("Gpu", "Trainium"):
        for name in ("JobQueue", "TrainingJobDefinition", "BenchmarkJobDefinition", "LogGroup"):
            assert f"{profile}{name}" in outputs


def test_jobs_stack_deploys_after_images_and_buckets():
    (artifact,) = [s for s in synth("default").assembly.stacks if s.stack_name == STACK]
    assert {"TrainingRegistry", "TrainingData", "TrainingCompute"} <= {d.id for d in artifact.dependencies}


def test_the_job_role_may_describe_jobs_and_do_nothing_else_in_batch():
    """The main node's watcher (container/launcher/node_watch.py) calls DescribeJobs on its child node jobs, and nothing
    else in Batch. DescribeJobs takes no resource type (Service Authorization Reference, AWS Batch), so "*";
    with ECS Exec off it stands alone on "*"."""
    assert NODE_WATCH_ACTIONS == ("batch:DescribeJobs",)
    for variant in ("default", "two-nat"):
        ((role_id, _),) = job_roles(variant).items()
        policies = resources(synth(variant).templates[STACK], "AWS::IAM::Policy").values()
        (statements,) = [
            p["Properties"]["PolicyDocument"]["Statement"]
            for p in policies
            if p["Properties"]["Roles"] == [{"Ref": role_id}]
        ]
        batch_actions = [
            (action, statement["Resource"])
            for statement in statements
            for action in (statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])
            if action.startswith("batch:")
        ]
        assert batch_actions == [("batch:DescribeJobs", "*")], variant
        if variant == "two-nat":  # no ECS Exec: the one statement on "*"
            assert {"Action": "batch:DescribeJobs", "Effect": "Allow", "Resource": "*"} in statements
