"""Job definitions, queues and the job role, for every catalog type: what decides whether a submitted
job trains or sits RUNNABLE forever."""

import json
import os
import re
import stat
import subprocess

import pytest

from config import metrics
from config.catalog import CATALOG, AcceleratorKind
from config.context import ConfigError, read_settings
from config.gpu_interconnect import INTRA_NODE
from config.job_events import TRAINCTL_CANCEL_REASON
from config.settings import fleet_construct_id as construct_id
from tests.docs_text import all_pages
from tests.harness import EFA_TYPES, ROOT, VARIANTS, fleet_name, resources, synth
from training_constructs.jobs.multi_node_job import PREFLIGHT_EXIT_CODE
from training_constructs.jobs.training_jobs import ECS_EXEC_ACTIONS

STACK = "TrainingJobs"
KINDS = ("TrainingJob", "BenchmarkJob")


def job_definition(variant, fleet_id, kind):
    template = synth(variant).templates[STACK]
    (props,) = [
        r["Properties"]
        for k, r in resources(template, "AWS::Batch::JobDefinition").items()
        if k.startswith(f"{fleet_id}{kind}")
    ]
    return props


def of_type(instance, kind):
    return job_definition("all-types", construct_id(fleet_name(instance)), kind)


def container(props):
    (node_range,) = props["NodeProperties"]["NodeRangeProperties"]
    return node_range["Container"]


def requirement(c, kind):
    values = [int(r["Value"]) for r in c["ResourceRequirements"] if r["Type"] == kind]
    return values[0] if values else None


def environment(c):
    return {e["Name"]: e["Value"] for e in c["Environment"]}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_job_definition_fills_exactly_one_instance_per_node(instance, kind):
    spec = CATALOG[instance]
    props = of_type(instance, kind)
    nodes = props["NodeProperties"]
    assert props["Type"] == "multinode" and props["PlatformCapabilities"] == ["EC2"]
    assert nodes["NumNodes"] == 2 and nodes["MainNode"] == 0
    # One open-ended range covers every node, whatever count is submitted (numNodes override).
    (node_range,) = nodes["NodeRangeProperties"]
    assert node_range["TargetNodes"] == "0:"
    c = node_range["Container"]
    assert c["InstanceType"] == instance
    assert requirement(c, "VCPU") == spec.vcpus
    installed = spec.memory_gib * 1024
    # Below what ECS registers (AWS's 5% buffer), but not wastefully far below.
    assert 0.90 * installed <= requirement(c, "MEMORY") <= 0.95 * installed
    expected_gpus = spec.accelerator_count if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU else None
    assert requirement(c, "GPU") == expected_gpus
    assert "Vcpus" not in c and "Memory" not in c  # only resourceRequirements, never both


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_every_efa_and_neuron_device_is_mapped(instance, kind):
    spec = CATALOG[instance]
    c = container(of_type(instance, kind))
    devices = c["LinuxParameters"]["Devices"]
    uverbs = [d for d in devices if d["HostPath"].startswith("/dev/infiniband/uverbs")]
    neuron = [d for d in devices if d["HostPath"].startswith("/dev/neuron")]
    # One uverbs device per EFA card: p6-b300's ENA-only card 0 adds none (16 on 17 cards).
    assert [d["HostPath"] for d in uverbs] == [f"/dev/infiniband/uverbs{i}" for i in range(spec.efa_interfaces)]
    if spec.accelerator_kind is AcceleratorKind.NEURON:
        assert [d["HostPath"] for d in neuron] == [f"/dev/neuron{i}" for i in range(16)]
    else:
        assert neuron == []
    assert len(devices) == len(uverbs) + len(neuron)
    for d in devices:
        assert d["ContainerPath"] == d["HostPath"]
        assert sorted(d["Permissions"]) == ["MKNOD", "READ", "WRITE"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_memlock_unlimited_and_shared_memory_sized_for_data_loaders(instance, kind):
    c = container(of_type(instance, kind))
    assert c["Ulimits"] == [{"Name": "memlock", "SoftLimit": -1, "HardLimit": -1}]
    shm = c["LinuxParameters"]["SharedMemorySize"]
    memory = requirement(c, "MEMORY")
    assert memory // 4 <= shm <= memory // 2


def test_shared_memory_on_the_seed_instance_is_at_least_the_seed_figure():
    c = container(job_definition("default", "Gpu", "TrainingJob"))
    assert c["InstanceType"] == "g6.12xlarge"
    assert c["LinuxParameters"]["SharedMemorySize"] >= 60000


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_processes_per_node_match_the_accelerators(instance, kind):
    spec = CATALOG[instance]
    env = environment(container(of_type(instance, kind)))
    if spec.accelerator_kind is AcceleratorKind.NEURON:
        # One rank per logical NeuronCore: 32 on trn1/trn1n, 64 on trn2 (LNC 2).
        assert int(env["NPROC_PER_NODE"]) == {"trn1.32xlarge": 32, "trn1n.32xlarge": 32, "trn2.48xlarge": 64}[instance]
        assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    else:
        assert int(env["NPROC_PER_NODE"]) == spec.accelerator_count
        assert "FI_EFA_USE_DEVICE_RDMA" not in env


def test_gpu_training_runs_isaac_lab_through_the_launcher():
    c = container(job_definition("default", "Gpu", "TrainingJob"))
    env = environment(c)
    assert env["TASK"] == "Isaac-Velocity-Rough-H1-v0" and env["MAX_ITERATIONS"] == "100"
    assert env["ACCEPT_EULA"] == "Y" and env["PRIVACY_CONSENT"] == "Y"
    assert c["Command"][:2] == ["/bin/bash", "-c"]
    assert "/opt/training/distributed_run.sh scripts/reinforcement_learning/rsl_rl/train.py" in c["Command"][2]


def run_with_recording_launcher(command: list[str], env: dict[str, str], workdir) -> list[str]:
    """Run a job definition's shell command with a launcher that prints its arguments, one a line."""
    launcher = workdir / "distributed_run.sh"
    launcher.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IEXEC)
    script = command[2].replace("/opt/training/distributed_run.sh", str(launcher))
    result = subprocess.run(
        [*command[:2], script],
        env={"PATH": os.environ["PATH"], **env},
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.splitlines()


def test_isaac_lab_command_takes_task_and_iterations_from_the_environment(tmp_path):
    """Run the job's command in bash with a recording launcher: overrides reach the script."""
    command = container(job_definition("default", "Gpu", "TrainingJob"))["Command"]
    checkpoints = tmp_path / "checkpoints"
    # An image that already has a logs directory: the link must replace it, not land inside it.
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "from-the-image.txt").write_text("x")
    env = {"TASK": "Isaac-Cartpole-v0", "MAX_ITERATIONS": "7", "CHECKPOINT_DIR": str(checkpoints)}
    args = run_with_recording_launcher(command, env, tmp_path)
    # Isaac Lab writes its runs under ./logs, which is the launcher's checkpoint directory.
    assert (tmp_path / "logs").resolve() == checkpoints.resolve() and checkpoints.is_dir()
    assert args[0] == "scripts/reinforcement_learning/rsl_rl/train.py"
    assert args[args.index("--task") + 1] == "Isaac-Cartpole-v0"
    assert args[args.index("--max_iterations") + 1] == "7"
    assert "--headless" in args and "--distributed" in args


@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_benchmark_runs_the_allreduce_across_the_nodes(profile):
    c = container(job_definition("default", profile, "BenchmarkJob"))
    assert c["Command"][:2] == ["/opt/training/distributed_run.sh", "/opt/training/allreduce_bench.py"]
    # A sweep up to 1 GiB (bandwidth needs large messages), within every node first, then across nodes.
    assert c["Command"][c["Command"].index("--sizes") + 1] == "8K:1G"
    assert "--per-node" in c["Command"]


def test_trainium_training_runs_the_neuron_allreduce_example():
    c = container(job_definition("default", "Trainium", "TrainingJob"))
    assert c["Command"][:2] == ["/opt/training/distributed_run.sh", "/opt/training/allreduce_bench.py"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_jobs_get_the_bucket_names_and_the_job_role(profile, kind):
    c = container(job_definition("default", profile, kind))
    env = environment(c)
    assert "TrainingData-DatasetBucketArn" in json.dumps(env["DATASET_BUCKET"])
    assert "TrainingData-CheckpointBucketArn" in json.dumps(env["CHECKPOINT_BUCKET"])
    assert c["JobRoleArn"] == {"Fn::GetAtt": [next(iter(job_roles("default"))), "Arn"]}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("profile", "fleet"), [("Gpu", "gpu"), ("Trainium", "trainium")])
def test_jobs_know_their_fleet_for_metric_dimensions(profile, fleet, kind):
    env = environment(container(job_definition("default", profile, kind)))
    assert env[metrics.FLEET_ENV] == fleet


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_logs_go_to_the_profiles_retained_log_group(profile, kind):
    template = synth("default").templates[STACK]
    options = container(job_definition("default", profile, kind))["LogConfiguration"]
    assert options["LogDriver"] == "awslogs"
    (group_id,) = [k for k in resources(template, "AWS::Logs::LogGroup") if k.startswith(f"{profile}Logs")]
    assert options["Options"]["awslogs-group"] == {"Ref": group_id}
    group = template["Resources"][group_id]
    assert group["DeletionPolicy"] == "Retain" and group["UpdateReplacePolicy"] == "Retain"
    assert group["Properties"]["RetentionInDays"] == 30


def test_log_retention_follows_the_context():
    template = synth("pinned-az-endpoints").templates[STACK]
    days = {r["Properties"]["RetentionInDays"] for r in resources(template, "AWS::Logs::LogGroup").values()}
    assert days == {int(VARIANTS["pinned-az-endpoints"]["logRetentionDays"])}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_retries_infrastructure_failures_and_exits_on_application_errors(profile, kind):
    retry = job_definition("default", profile, kind)["RetryStrategy"]
    rules = retry["EvaluateOnExit"]
    assert retry["Attempts"] == 3 and len(rules) <= 5
    assert {"Action": "RETRY", "OnStatusReason": "Host EC2*"} in rules
    # The catch-all comes last and exits: an application error is never retried.
    assert rules[-1] == {"Action": "EXIT", "OnReason": "*"}
    assert all(r["Action"] == "RETRY" for r in rules[:-1])
    # A node that failed the launcher's preflight is retried: its one exit code, and no other.
    assert [r["OnExitCode"] for r in rules if "OnExitCode" in r] == ["75"]


def test_the_retried_exit_code_is_the_one_the_preflight_exits_with():
    source = (ROOT / "container" / "preflight.py").read_text()
    launcher = (ROOT / "container" / "distributed_run.sh").read_text()
    assert f"PREFLIGHT_EXIT = {PREFLIGHT_EXIT_CODE}\n" in source
    assert f"readonly PREFLIGHT_EXIT={PREFLIGHT_EXIT_CODE}\n" in launcher


def test_timeouts_default_to_the_seed_hour_and_the_benchmark_is_shorter():
    assert job_definition("default", "Gpu", "TrainingJob")["Timeout"] == {"AttemptDurationSeconds": 3600}
    assert job_definition("default", "Gpu", "BenchmarkJob")["Timeout"]["AttemptDurationSeconds"] <= 1800


def test_acceptance_case_p5_four_nodes_with_shares_timeout_and_attempts():
    variant = "p5-four-nodes"
    props = job_definition(variant, "Gpu", "TrainingJob")
    c = container(props)
    assert props["NodeProperties"]["NumNodes"] == 4 and c["InstanceType"] == "p5.48xlarge"
    assert len([d for d in c["LinuxParameters"]["Devices"] if "uverbs" in d["HostPath"]]) == 32
    assert requirement(c, "GPU") == 8 and requirement(c, "VCPU") == 192
    assert props["Timeout"] == {"AttemptDurationSeconds": 7200} and props["RetryStrategy"]["Attempts"] == 5
    # Trainium keeps its own defaults.
    assert job_definition(variant, "Trainium", "TrainingJob")["NodeProperties"]["NumNodes"] == 2


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


CAPACITY = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
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


def test_a_trainctl_cancel_pages_nobody_and_every_other_failure_does():
    # The rule's pattern as deployed, with the queue references resolved to one ARN, matched by moto's
    # implementation of EventBridge's pattern rules (prefix, anything-but, exists, $or).
    from moto.events.models import EventPattern

    queue = "arn:aws:batch:us-east-1:123456789012:job-queue/gpu"
    _, rule = alert_rule("default")
    pattern = json.loads(json.dumps(rule["EventPattern"]))
    pattern["detail"]["jobQueue"] = [queue]
    matcher = EventPattern.load(json.dumps(pattern))

    assert not matcher.matches_event(batch_event(queue, "FAILED", TRAINCTL_CANCEL_REASON))
    assert not matcher.matches_event(batch_event(queue, "FAILED", f"{TRAINCTL_CANCEL_REASON} (sweep gpu-1)"))
    for reason in (
        "Essential container in task exited",
        "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
        # Someone else's TerminateJob, and a reason that only mentions trainctl later on.
        "Terminated by the on-call",
        "node 1: cancelled with trainctl cancel",
    ):
        assert matcher.matches_event(batch_event(queue, "FAILED", reason)), reason
    assert matcher.matches_event(batch_event(queue, "FAILED"))
    assert not matcher.matches_event(batch_event(queue, "SUCCEEDED", "Essential container in task exited"))
    assert not matcher.matches_event(batch_event(queue + "-other", "FAILED", "Essential container in task exited"))


def test_ecs_exec_is_on_by_default_and_the_context_key_removes_it_and_its_permissions():
    on = synth("default").templates[STACK]
    off = synth("two-nat").templates[STACK]
    assert VARIANTS["two-nat"]["ecsExec"] == "false"
    for props in resources(on, "AWS::Batch::JobDefinition").values():
        assert container(props["Properties"])["EnableExecuteCommand"] is True
    for props in resources(off, "AWS::Batch::JobDefinition").values():
        assert "EnableExecuteCommand" not in container(props["Properties"])
    exec_statements = [s for s in job_policy_statements("default") if "ssmmessages" in json.dumps(s["Action"])]
    assert exec_statements == [
        {
            "Action": [
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


def test_alert_email_is_subscribed_only_when_given():
    assert not resources(synth("default").templates[STACK], "AWS::SNS::Subscription")
    (subscription,) = resources(synth("three-fleets").templates[STACK], "AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == VARIANTS["three-fleets"]["alertEmail"]


def job_roles(variant):
    """The job containers' roles (the stack also holds the boot-check circuit breaker's function role,
    tests/test_fleet_health.py)."""
    roles = resources(synth(variant).templates[STACK], "AWS::IAM::Role")
    return {k: r for k, r in roles.items() if not k.startswith("BootCircuitBreaker")}


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
        # ECS Exec's ssmmessages actions have no resource type: the one statement on "*", exactly them.
        if statement["Action"] == list(ECS_EXEC_ACTIONS):
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


def test_docs_walkthrough_reads_outputs_that_exist():
    used = set(re.findall(r"\$\(out (Training\w+) (\w+)\)", all_pages()))
    assert len(used) >= 8
    templates = synth("default").templates
    for stack, key in used:
        assert key in templates[stack]["Outputs"], (stack, key)


def test_docs_node_overrides_are_valid_and_fit_the_job_definition():
    overrides = re.findall(r"--node-overrides '(\{.*?\})'", all_pages(), re.S)
    assert overrides
    target = job_definition("default", "Gpu", "TrainingJob")["NodeProperties"]["NodeRangeProperties"][0]
    for text in overrides:
        parsed = json.loads(text)
        assert {o["targetNodes"] for o in parsed["nodePropertyOverrides"]} == {target["TargetNodes"]}
        # numNodes may only grow to what the default compute environment can hold.
        assert parsed.get("numNodes", 2) <= read_settings({}).fleet("gpu").max_nodes


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_preflight_expectations_match_the_launch_template(instance, kind):
    spec = CATALOG[instance]
    env = environment(container(of_type(instance, kind)))
    compute = synth("all-types").templates["TrainingCompute"]
    prefix = f"{construct_id(fleet_name(instance))}LaunchTemplate"
    (lt,) = [r for k, r in resources(compute, "AWS::EC2::LaunchTemplate").items() if k.startswith(prefix)]
    interfaces = lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    attached = [i for i in interfaces if i.get("InterfaceType") == "efa"]
    assert int(env["EFA_DEVICES"]) == len(attached)
    if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        assert int(env["EXPECTED_GPUS"]) == spec.accelerator_count
        assert "EXPECTED_NEURON_DEVICES" not in env
        assert env["EXPECT_TORCH_CUDA"] == "1"  # the image's PyTorch runs a kernel on this GPU
    else:
        assert "EXPECTED_GPUS" not in env
        # As many Neuron devices as the definition maps into the container.
        mapped = [
            d for d in container(of_type(instance, kind))["LinuxParameters"]["Devices"] if "neuron" in d["HostPath"]
        ]
        assert int(env["EXPECTED_NEURON_DEVICES"]) == len(mapped) == spec.accelerator_count
    # Blackwell GPUs need a recent driver; the figure reaches the node for its driver check.
    assert env.get("MIN_NVIDIA_DRIVER") == spec.min_nvidia_driver


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_isaac_sim_fleets_get_the_graphics_driver_and_prove_vulkan(instance, kind):
    env = environment(container(of_type(instance, kind)))
    if CATALOG[instance].runs_isaac_sim:
        # graphics (Vulkan, GL) besides compute: `all` has both (NVIDIA container toolkit).
        capabilities = set(env["NVIDIA_DRIVER_CAPABILITIES"].split(","))
        assert capabilities == {"all"} or {"compute", "utility", "graphics"} <= capabilities
        assert env["EXPECT_VULKAN"] == "1"
    else:
        assert "NVIDIA_DRIVER_CAPABILITIES" not in env and "EXPECT_VULKAN" not in env


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_isaac_lab_only_where_the_gpu_can_run_isaac_sim(instance):
    spec = CATALOG[instance]
    c = container(of_type(instance, "TrainingJob"))
    runs_isaac_lab = "rsl_rl/train.py" in json.dumps(c["Command"])
    assert runs_isaac_lab is spec.runs_isaac_sim
    if spec.accelerator_model in ("A100", "H100", "H200"):
        assert not runs_isaac_lab and "ACCEPT_EULA" not in environment(c)
    if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU and not spec.runs_isaac_sim:
        # The generic PyTorch definition: the launcher on the script named in TRAIN_SCRIPT.
        assert c["Command"] == ["/bin/bash", "-c", 'exec /opt/training/distributed_run.sh "$TRAIN_SCRIPT" $TRAIN_ARGS']
        assert environment(c)["TRAIN_SCRIPT"].startswith("/opt/training/")


def test_isaac_lab_exactly_on_the_rt_core_fleets_of_all_types():
    # Written out: the families whose GPU has RT cores (T4, A10G, L4, L40S, RTX PRO 4500 and 6000
    # Blackwell); V100 (p3dn) has none.
    isaac = {i for i in EFA_TYPES if "rsl_rl/train.py" in json.dumps(container(of_type(i, "TrainingJob"))["Command"])}
    assert isaac == {i for i in EFA_TYPES if i.split(".")[0] in ("g4dn", "g5", "g6", "gr6", "g6e", "g7", "g7e")}
    assert "p3dn.24xlarge" not in isaac
    assert {"g7e.8xlarge", "g7e.12xlarge", "g7e.24xlarge", "g7e.48xlarge"} <= isaac
    for p6 in ("p6-b200.48xlarge", "p6-b300.48xlarge"):
        assert '"$TRAIN_SCRIPT"' in container(of_type(p6, "TrainingJob"))["Command"][2]  # generic PyTorch


def test_p6_b300_maps_16_efa_devices_and_expects_16():
    c = container(of_type("p6-b300.48xlarge", "TrainingJob"))
    uverbs = [d["HostPath"] for d in c["LinuxParameters"]["Devices"] if "uverbs" in d["HostPath"]]
    assert uverbs == [f"/dev/infiniband/uverbs{i}" for i in range(16)]
    assert environment(c)["EFA_DEVICES"] == "16"
    assert environment(c)["MIN_NVIDIA_DRIVER"] == "580.95.05"


def test_generic_pytorch_command_passes_script_and_arguments(tmp_path):
    command = container(job_definition("p5-four-nodes", "Gpu", "TrainingJob"))["Command"]
    env = {"TRAIN_SCRIPT": "/work/train.py", "TRAIN_ARGS": "--lr 0.1 --epochs 3"}
    assert run_with_recording_launcher(command, env, tmp_path) == ["/work/train.py", "--lr", "0.1", "--epochs", "3"]


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_training_checkpoints_go_to_the_fleets_prefix_of_the_checkpoint_bucket(instance):
    env = environment(container(of_type(instance, "TrainingJob")))
    uri = env["CHECKPOINT_URI"]
    assert uri["Fn::Join"][1][0] == "s3://"
    assert "TrainingData-CheckpointBucketArn" in json.dumps(uri)
    assert uri["Fn::Join"][1][-1] == f"/{fleet_name(instance)}"
    assert env["CHECKPOINT_DIR"].startswith("/")
    assert "CHECKPOINT_URI" not in environment(container(of_type(instance, "BenchmarkJob")))


def test_isaac_lab_resumes_from_a_restored_checkpoint():
    env = environment(container(job_definition("default", "Gpu", "TrainingJob")))
    assert env["RESUME_ARGS"] == "agent.resume=True agent.load_run={resume_dir}"
    # Only when a model came back: RSL-RL's resume fails on a run directory without model_<n>.pt.
    assert env["RESUME_GLOB"] == "model_*.pt"


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_benchmark_refuses_a_socket_fallback_and_knows_the_published_bandwidth(instance):
    spec = CATALOG[instance]
    env = environment(container(of_type(instance, "BenchmarkJob")))
    assert int(env["NETWORK_GBPS"]) == spec.network_gbps
    # The per-node verdict's reference: the GPUs' interconnect, where there are GPUs to connect.
    if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU and spec.accelerator_count > 1:
        assert int(env["NODE_GBPS"]) == INTRA_NODE[instance].gbps > 0
    else:
        assert "NODE_GBPS" not in env
    if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        # aws-ofi-nccl's plugin name: NCCL fails instead of falling back to TCP sockets.
        assert env["NCCL_NET"] == "AWS Libfabric"
        assert env["NCCL_DEBUG"] == "INFO"
    else:
        assert "NCCL_NET" not in env


def test_three_fleets_get_three_queues_and_their_job_definitions():
    template = synth("three-fleets").templates[STACK]
    # Plus one queue per fallback placement of llm (tests below).
    assert len(resources(template, "AWS::Batch::JobQueue")) == 3 + 3
    assert len(resources(template, "AWS::Batch::JobDefinition")) == 6
    kinds = {}
    for fleet_id, instance, nodes in (
        ("Rl", "g6e.48xlarge", 2),
        ("Llm", "p5e.48xlarge", 4),
        ("Trn", "trn2.48xlarge", 2),
    ):
        props = job_definition("three-fleets", fleet_id, "TrainingJob")
        c = container(props)
        assert c["InstanceType"] == instance and props["NodeProperties"]["NumNodes"] == nodes
        assert requirement(c, "VCPU") == CATALOG[instance].vcpus
        kinds[fleet_id] = "rsl_rl" in json.dumps(c["Command"])
    assert kinds == {"Rl": True, "Llm": False, "Trn": False}
    outputs = template["Outputs"]
    for fleet_id in ("Rl", "Llm", "Trn"):
        assert f"{fleet_id}JobQueue" in outputs and f"{fleet_id}BenchmarkJobDefinition" in outputs


# ----------------------------------------------------------------------------------------------- fallback
LLM_QUEUES = ("LlmQueue", "LlmFallback1Queue", "LlmFallback2Queue", "LlmFallback3Queue")


def queue_ids(template):
    ids = resources(template, "AWS::Batch::JobQueue")
    return [next(k for k in ids if k.startswith(prefix)) for prefix in LLM_QUEUES]


def test_each_placement_has_a_queue_of_its_own_compute_environment_only():
    """One compute environment per queue: a job is placed in one placement or none, never across two."""
    template = synth("three-fleets").templates[STACK]
    compute = synth("three-fleets").templates["TrainingCompute"]
    # Compute environments are exported by GetAtt; other exports (the boot-check log groups) are Refs.
    exports = {
        o["Export"]["Name"]: o["Value"]["Fn::GetAtt"][0]
        for o in compute["Outputs"].values()
        if "Export" in o and "Fn::GetAtt" in o["Value"]
    }
    environments = []
    prefixes = ("Llm", "LlmFallback1", "LlmFallback2", "LlmFallback3")
    for queue_id, prefix in zip(queue_ids(template), prefixes, strict=True):
        (order,) = template["Resources"][queue_id]["Properties"]["ComputeEnvironmentOrder"]
        environment = exports[order["ComputeEnvironment"]["Fn::ImportValue"]]
        assert environment.startswith(prefix) and not environment[len(prefix) :].startswith("Fallback")
        environments.append(environment)
    assert len(set(environments)) == 4


def test_every_placement_but_the_last_waits_ten_minutes_for_capacity():
    template = synth("three-fleets").templates[STACK]
    limits = []
    for queue_id in queue_ids(template):
        actions = template["Resources"][queue_id]["Properties"]["JobStateTimeLimitActions"]
        limits.append({a["Reason"]: a["MaxTimeSeconds"] for a in actions})
    # 600 s is the least the API allows (API JobStateTimeLimitAction, maxTimeSeconds).
    assert [limit[CAPACITY] for limit in limits] == [600, 600, 600, 30 * 60]
    assert all(limit["MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"] == 30 * 60 for limit in limits)


def capacity_fallback(template):
    def one(resource_type, prefix):
        (found,) = [r for k, r in resources(template, resource_type).items() if k.startswith(prefix)]
        return found

    return (
        one("AWS::Lambda::Function", "CapacityFallback"),
        one("AWS::Events::Rule", "CapacityFallback"),
        one("AWS::IAM::Policy", "CapacityFallbackRole"),
    )


def test_only_fleets_with_fallback_get_the_resubmitter():
    assert not [k for k in synth("default").templates[STACK]["Resources"] if k.startswith("CapacityFallback")]
    template = synth("three-fleets").templates[STACK]
    function, _, _ = capacity_fallback(template)
    text = json.dumps(function["Properties"]["Environment"]["Variables"]["ROUTES"])
    # Every placement of llm and nothing of rl or trn.
    assert all(q in text for q in queue_ids(template))
    assert "RlQueue" not in text and "TrnQueue" not in text


def test_the_resubmitter_may_submit_only_to_the_fleets_queues_and_job_definitions():
    template = synth("three-fleets").templates[STACK]
    _, _, policy = capacity_fallback(template)
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (submit,) = [s for s in statements if s["Action"] == "batch:SubmitJob"]
    definitions = [k for k in resources(template, "AWS::Batch::JobDefinition") if k.startswith("Llm")]
    expected = [{"Fn::GetAtt": [q, "JobQueueArn"]} for q in queue_ids(template)] + [{"Ref": d} for d in definitions]
    assert sorted(map(json.dumps, submit["Resource"])) == sorted(map(json.dumps, expected))
    (describe,) = [s for s in statements if s["Action"] == "batch:DescribeJobs"]
    assert describe["Resource"] == "*"  # DescribeJobs has no resource-level permissions
    (tag,) = [s for s in statements if s["Action"] == "batch:TagResource"]
    assert ":job/*" in json.dumps(tag["Resource"])


def _sample_event(queue, **detail):
    return {
        "version": "0",
        "id": "7a5c4f2e-0000-0000-0000-000000000000",
        "detail-type": "Batch Job State Change",
        "source": "aws.batch",
        "account": "123456789012",
        "time": "2026-11-24T21:00:00Z",
        "region": "us-west-2",
        "resources": [],
        "detail": {
            "jobQueue": queue,
            "jobId": "4c9fa98c-175c-461e-a8f8-4ce4e5ab0462",
            "status": "FAILED",
            "statusReason": f"Canceled by JobStateTimeLimit action due to reason: {CAPACITY}",
            **detail,
        },
    }


def test_the_rule_matches_capacity_cancels_of_the_placements_and_nothing_else():
    """The synthesized pattern, each queue's ARN in place of its GetAtt, through moto's EventBridge
    matcher (an implementation of EventBridge's pattern semantics: prefix, anything-but, wildcard)."""
    from moto.events.models import EventPattern

    template = synth("three-fleets").templates[STACK]
    _, rule, _ = capacity_fallback(template)
    arn = {q: f"arn:aws:batch:us-west-2:123456789012:job-queue/{q}" for q in queue_ids(template)}
    text = json.dumps(rule["Properties"]["EventPattern"])
    text = re.sub(r'\{"Fn::GetAtt": \["([A-Za-z0-9]+)", "JobQueueArn"\]\}', lambda m: json.dumps(arn[m[1]]), text)
    matcher = EventPattern.load(text)
    first, *_, last = arn.values()
    assert matcher.matches_event(_sample_event(first)) and matcher.matches_event(_sample_event(last))
    resource_reason = "Canceled by JobStateTimeLimit action due to reason: MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
    for event in (
        _sample_event("arn:aws:batch:us-west-2:123456789012:job-queue/RlQueue"),
        _sample_event(first, statusReason="Essential container in task exited"),
        _sample_event(first, statusReason=resource_reason),
        _sample_event(first, status="RUNNABLE", statusReason=f"{CAPACITY} - Service cannot fulfill the capacity"),
        # A node of a multi-node job (<id>#<n>): the job itself is the one to resubmit.
        _sample_event(first, jobId="4c9fa98c-175c-461e-a8f8-4ce4e5ab0462#1"),
    ):
        assert not matcher.matches_event(event), event["detail"]


def test_placements_output_lists_each_placement_and_its_queue_in_order():
    template = synth("three-fleets").templates[STACK]
    separator, items = template["Outputs"]["LlmPlacements"]["Value"]["Fn::Join"]
    assert separator == ";"
    parts = [item["Fn::Join"][1] for item in items]
    assert [p[0] for p in parts] == [
        "us-west-2b p5e.48xlarge|",
        "us-west-2c p5e.48xlarge|",
        "us-west-2b p5.48xlarge|",
        "us-west-2a p5e.48xlarge cr-0a1b2c3d4e5f60718 (capacity-block 2026-12-01T11:30Z..2026-12-08T11:30Z)|",
    ]
    assert [p[1]["Fn::GetAtt"][0] for p in parts] == queue_ids(template)
    assert "RlPlacements" not in template["Outputs"]


def test_a_different_shape_fallback_is_refused_in_one_line():
    llm = {"instanceType": "p5e.48xlarge", "fallback": [{"instanceType": "p5en.48xlarge"}]}
    with pytest.raises(ConfigError) as refused:
        read_settings({"fleets": json.dumps({"llm": llm})})
    message = str(refused.value)
    assert "\n" not in message and len(message) <= 220
    assert message.startswith("context key fleets.llm.fallback[0].instanceType='p5en.48xlarge': not the shape of")
    assert message.endswith("p5.48xlarge, p5e.48xlarge")
