"""Job definitions for every catalog type: what decides whether a submitted job trains or sits
RUNNABLE forever. The queues and the job role: tests/test_job_queues.py; fallback placements:
tests/test_job_fallback.py."""

import json
import os
import re
import stat
import subprocess

import pytest

from config import metrics
from config.catalog import CATALOG, AcceleratorKind
from config.context import read_settings
from config.gpu_interconnect import INTRA_NODE
from config.settings import fleet_construct_id as construct_id
from tests.docs_text import all_pages
from tests.harness import EFA_TYPES, ROOT, VARIANTS, fleet_name, resources, synth
from trainctl.fleet.plugin_knobs import PLUGIN_DEFEATING
from training_constructs.jobs import workloads
from training_constructs.jobs.multi_node_job import PREFLIGHT_EXIT_CODE

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


def job_roles(variant):
    """The job containers' roles (the stack also holds the function roles of the boot-check circuit
    breaker, tests/test_fleet_health.py, and of the resumed-job alert, tests/test_monitoring.py)."""
    roles = resources(synth(variant).templates[STACK], "AWS::IAM::Role")
    return {k: r for k, r in roles.items() if not k.startswith(("BootCircuitBreaker", "ResumedJobAlerts"))}


CAPACITY = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
# The llm fleet of "three-fleets": its queue, then one per fallback placement.
LLM_QUEUES = ("LlmQueue", "LlmFallback1Queue", "LlmFallback2Queue", "LlmFallback3Queue")


def queue_ids(template):
    ids = resources(template, "AWS::Batch::JobQueue")
    return [next(k for k in ids if k.startswith(prefix)) for prefix in LLM_QUEUES]


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
        # aws-ofi-nccl picks the EFA provider and sets fork safety itself, and its tuner steps aside when
        # NCCL_PROTO/NCCL_ALGO are set (aws/aws-ofi-nccl doc/efa-env-var.md, src/tuner/nccl_ofi_tuner.cpp).
        assert not PLUGIN_DEFEATING & set(env), PLUGIN_DEFEATING & set(env)


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


def test_types_with_published_runs_past_1_gib_are_swept_to_them_up_to_8_gib():
    """The fabric verdict judges the largest size measured that has a reference (config/fabric_references.py):
    p5's published runs go to 16 GiB (swept to 8), p4d's to 2 GiB; a type without references stops at 1 GiB."""
    from training_constructs.jobs.workloads import bench_sizes

    assert bench_sizes(CATALOG["p5.48xlarge"]) == "8K:8G"
    assert bench_sizes(CATALOG["p4d.24xlarge"]) == "8K:2G"
    assert bench_sizes(CATALOG["g6.12xlarge"]) == "8K:1G"


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
    source = (ROOT / "container" / "launcher" / "preflight.py").read_text()
    launcher = (ROOT / "container" / "launcher" / "ending.py").read_text()
    assert f"PREFLIGHT_EXIT = {PREFLIGHT_EXIT_CODE}\n" in source
    assert f"NODE_FAULT_EXIT = {PREFLIGHT_EXIT_CODE}\n" in launcher


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
    # The fabric verdict finds the published runs by instance type; line rate is no longer a reference.
    assert env["INSTANCE_TYPE"] == instance and "NETWORK_GBPS" not in env
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


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("profile", ["Gpu", "Trainium"])
def test_every_job_definition_turns_on_the_hang_watch_and_the_flight_recorder(profile, kind):
    env = environment(container(job_definition("default", profile, kind)))
    # A few minutes (the launcher never goes below twice the slowest step), and well inside the attempt's
    # timeout so that a hang ends the attempt before Batch's timeout does (a timeout is never retried).
    hang = int(env["HANG_SECONDS"])
    assert 120 <= hang <= 600
    assert hang * 4 <= job_definition("default", profile, kind)["Timeout"]["AttemptDurationSeconds"]
    # PyTorch's flight recorder: a ring buffer, a dump when NCCL's watchdog times out, under the node's
    # progress folder, where the launcher's watch copies it from.
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # (tests/test_hang_watch.py pins PROGRESS_DIR to the launcher's default.)
    assert env["TORCH_FR_DUMP_TEMP_FILE"].startswith(workloads.PROGRESS_DIR + "/") and "PROGRESS_DIR" not in env


def test_a_hang_after_its_retry_ends_the_job_and_a_first_one_is_retried():
    # The launcher's codes for a hang: 75 on the first attempt, 124 after (container/launcher/progress_watch.py).
    rules = job_definition("default", "Gpu", "TrainingJob")["RetryStrategy"]["EvaluateOnExit"]
    retried_codes = {r["OnExitCode"] for r in rules if r["Action"] == "RETRY" and "OnExitCode" in r}
    assert "75" in retried_codes and "124" not in retried_codes
    assert rules[-1] == {"Action": "EXIT", "OnReason": "*"}
