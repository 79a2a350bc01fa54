"""Job definitions, queues and the job role, for every catalog type: what decides whether a submitted
job trains or sits RUNNABLE forever."""

import json
import os
import re
import stat
import subprocess

import pytest

from config.catalog import CATALOG, AcceleratorKind
from config.context import read_settings
from tests.harness import ROOT, TYPE_VARIANTS, VARIANTS, resources, synth

STACK = "TrainingJobs"
CASES = [
    (variant, profile, instance)
    for variant, pair in TYPE_VARIANTS.items()
    for profile, instance in zip(("Gpu", "Trainium"), pair, strict=True)
]
IDS = [f"{profile}-{instance}" for _, profile, instance in CASES]
KINDS = ("TrainingJob", "BenchmarkJob")


def job_definition(variant, profile, kind):
    template = synth(variant).templates[STACK]
    (props,) = [
        r["Properties"]
        for k, r in resources(template, "AWS::Batch::JobDefinition").items()
        if k.startswith(f"{profile}{kind}")
    ]
    return props


def container(props):
    (node_range,) = props["NodeProperties"]["NodeRangeProperties"]
    return node_range["Container"]


def requirement(c, kind):
    values = [int(r["Value"]) for r in c["ResourceRequirements"] if r["Type"] == kind]
    return values[0] if values else None


def environment(c):
    return {e["Name"]: e["Value"] for e in c["Environment"]}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_job_definition_fills_exactly_one_instance_per_node(variant, profile, instance, kind):
    spec = CATALOG[instance]
    props = job_definition(variant, profile, kind)
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
@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_every_efa_and_neuron_device_is_mapped(variant, profile, instance, kind):
    spec = CATALOG[instance]
    c = container(job_definition(variant, profile, kind))
    devices = c["LinuxParameters"]["Devices"]
    uverbs = [d for d in devices if d["HostPath"].startswith("/dev/infiniband/uverbs")]
    neuron = [d for d in devices if d["HostPath"].startswith("/dev/neuron")]
    assert [d["HostPath"] for d in uverbs] == [f"/dev/infiniband/uverbs{i}" for i in range(spec.network_cards)]
    if spec.accelerator_kind is AcceleratorKind.NEURON:
        assert [d["HostPath"] for d in neuron] == [f"/dev/neuron{i}" for i in range(16)]
    else:
        assert neuron == []
    assert len(devices) == len(uverbs) + len(neuron)
    for d in devices:
        assert d["ContainerPath"] == d["HostPath"]
        assert sorted(d["Permissions"]) == ["MKNOD", "READ", "WRITE"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_memlock_unlimited_and_shared_memory_sized_for_data_loaders(variant, profile, instance, kind):
    c = container(job_definition(variant, profile, kind))
    assert c["Ulimits"] == [{"Name": "memlock", "SoftLimit": -1, "HardLimit": -1}]
    shm = c["LinuxParameters"]["SharedMemorySize"]
    memory = requirement(c, "MEMORY")
    assert memory // 4 <= shm <= memory // 2


def test_shared_memory_on_the_seed_instance_is_at_least_the_seed_figure():
    c = container(job_definition("default", "Gpu", "TrainingJob"))
    assert c["InstanceType"] == "g6.12xlarge"
    assert c["LinuxParameters"]["SharedMemorySize"] >= 60000


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_processes_per_node_match_the_accelerators(variant, profile, instance, kind):
    spec = CATALOG[instance]
    env = environment(container(job_definition(variant, profile, kind)))
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


def test_isaac_lab_command_takes_task_and_iterations_from_the_environment(tmp_path):
    """Run the job's command in bash with a recording launcher: overrides reach the script."""
    command = container(job_definition("default", "Gpu", "TrainingJob"))["Command"]
    launcher = tmp_path / "distributed_run.sh"
    launcher.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IEXEC)
    script = command[2].replace("/opt/training/distributed_run.sh", str(launcher))
    env = {"PATH": os.environ["PATH"], "TASK": "Isaac-Cartpole-v0", "MAX_ITERATIONS": "7"}
    result = subprocess.run(
        [command[0], command[1], script], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    args = result.stdout.splitlines()
    assert args[0] == "scripts/reinforcement_learning/rsl_rl/train.py"
    assert args[args.index("--task") + 1] == "Isaac-Cartpole-v0"
    assert args[args.index("--max_iterations") + 1] == "7"
    assert "--headless" in args and "--distributed" in args


@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_benchmark_runs_the_allreduce_across_the_nodes(profile):
    c = container(job_definition("default", profile, "BenchmarkJob"))
    assert c["Command"][:2] == ["/opt/training/distributed_run.sh", "/opt/training/allreduce_bench.py"]
    assert int(c["Command"][c["Command"].index("--size-mb") + 1]) >= 1024  # bandwidth needs large messages


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
    assert not any(r.get("OnExitCode") for r in rules)


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


def test_default_share_is_documented_default():
    _, policy = scheduling_policy("default")
    assert policy["ShareDistribution"] == [{"ShareIdentifier": "default", "WeightFactor": 1}]


@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_each_queue_is_fair_share_on_its_own_compute_environment(profile):
    template = synth("default").templates[STACK]
    policy_id, _ = scheduling_policy("default")
    (queue,) = [
        r["Properties"] for k, r in resources(template, "AWS::Batch::JobQueue").items() if k.startswith(profile)
    ]
    assert queue["SchedulingPolicyArn"] == {"Fn::GetAtt": [policy_id, "Arn"]}
    assert queue["State"] == "ENABLED"
    (order,) = queue["ComputeEnvironmentOrder"]
    # The imported ARN is the compute stack's export of this profile's compute environment.
    compute = synth("default").templates["TrainingCompute"]
    (exported,) = [
        o["Value"]
        for o in compute["Outputs"].values()
        if o["Export"]["Name"] == order["ComputeEnvironment"]["Fn::ImportValue"]
    ]
    (ce_id,) = [k for k in resources(compute, "AWS::Batch::ComputeEnvironment") if k.startswith(profile)]
    assert exported == {"Fn::GetAtt": [ce_id, "ComputeEnvironmentArn"]}


def job_roles(variant):
    return resources(synth(variant).templates[STACK], "AWS::IAM::Role")


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
        assert "*" not in resources_
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert "s3:*" not in actions and "*" not in actions


def test_datasets_are_read_only_and_checkpoints_writable():
    writes = ("s3:PutObject", "s3:DeleteObject*", "s3:Abort*")
    on_datasets, on_checkpoints = set(), set()
    for statement in job_policy_statements("default"):
        text = json.dumps(statement["Resource"])
        actions = set(statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]])
        if "DatasetBucketArn" in text:
            on_datasets |= actions
        if "CheckpointBucketArn" in text:
            on_checkpoints |= actions
    assert on_datasets and not on_datasets & set(writes)
    assert "s3:GetObject*" in on_datasets
    assert set(writes) <= on_checkpoints and "s3:GetObject*" in on_checkpoints


def test_outputs_name_queues_job_definitions_and_log_groups():
    outputs = synth("default").templates[STACK]["Outputs"]
    for profile in ("Gpu", "Trainium"):
        for name in ("JobQueue", "TrainingJobDefinition", "BenchmarkJobDefinition", "LogGroup"):
            assert f"{profile}{name}" in outputs


def test_jobs_stack_deploys_after_images_and_buckets():
    (artifact,) = [s for s in synth("default").assembly.stacks if s.stack_name == STACK]
    assert {"TrainingRegistry", "TrainingData", "TrainingCompute"} <= {d.id for d in artifact.dependencies}


def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_walkthrough_reads_outputs_that_exist():
    used = set(re.findall(r"\$\(out (Training\w+) (\w+)\)", readme()))
    assert len(used) >= 8
    templates = synth("default").templates
    for stack, key in used:
        assert key in templates[stack]["Outputs"], (stack, key)


def test_readme_node_overrides_are_valid_and_fit_the_job_definition():
    overrides = re.findall(r"--node-overrides '(\{.*?\})'", readme(), re.S)
    assert overrides
    target = job_definition("default", "Gpu", "TrainingJob")["NodeProperties"]["NodeRangeProperties"][0]
    for text in overrides:
        parsed = json.loads(text)
        assert {o["targetNodes"] for o in parsed["nodePropertyOverrides"]} == {target["TargetNodes"]}
        # numNodes may only grow to what the default compute environment can hold.
        assert parsed.get("numNodes", 2) <= read_settings({}).gpu.max_nodes
