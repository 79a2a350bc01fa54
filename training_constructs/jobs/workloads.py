"""What the job definitions run by default: the command and environment for each kind of fleet.

Everything here can be overridden at submit time (node overrides of command and environment);
docs/jobs.md shows how.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.catalog import AcceleratorKind, InstanceSpec
from config.fabric_references import GIB, REFERENCES
from config.gpu_interconnect import INTRA_NODE

# Installed by every Dockerfile (container/).
LAUNCHER = "/opt/training/distributed_run.sh"
ALLREDUCE_BENCH = "/opt/training/allreduce_bench.py"

# Isaac Lab RL as the seed runs it: RSL-RL's train script, relative to the image's working
# directory /workspace/isaaclab (Isaac Lab 2.x layout), headless, one process per GPU. It writes
# runs under logs/rsl_rl/<experiment>/<run>/ (model_<iteration>.pt); `agent.resume=True` (a Hydra
# override of the agent config) loads the newest run's newest model.
# Where the launcher keeps the checkpoints it restores and uploads (CHECKPOINT_DIR).
CHECKPOINT_DIR = "/tmp/checkpoints"  # noqa: S108 - inside the job's own container
ISAACLAB_TRAIN_SCRIPT = "scripts/reinforcement_learning/rsl_rl/train.py"
ISAACLAB_LOG_DIR = "logs"
DEFAULT_TASK = "Isaac-Velocity-Rough-H1-v0"
DEFAULT_MAX_ITERATIONS = 100

# Libfabric and Neuron collectives settings the AWS Neuron Batch all-reduce sample exports on trn1
# (aws-neuron-samples, torch-neuronx/training/aws-batch/all-reduce): EFA as the only provider,
# device RDMA, fork safety for data-loader workers, and the interface for the bootstrap socket.
NEURON_EFA_ENVIRONMENT = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "CCOM_SOCKET_IFNAME": "eth0",
}
# The name aws-ofi-nccl registers its NCCL network plugin under (aws/aws-ofi-nccl, the ncclNet_t
# `.name` of every plugin version). With NCCL_NET set, NCCL fails when that plugin does not load
# instead of falling back to TCP sockets (NCCL environment variables, NCCL_NET).
AWS_OFI_NCCL_PLUGIN = "AWS Libfabric"

TRAINING_ALLREDUCE_MB = 256
TRAINING_ALLREDUCE_ITERS = 100
# The benchmark sweeps message sizes as nccl-tests' all_reduce_perf is usually run (-b 8K -e 1G -f 2):
# from latency-bound to bandwidth-bound, 18 sizes.
BENCH_ALLREDUCE_SIZES = "8K:1G"
# A type with published two-node runs past 1 GiB is swept to the largest of them, up to 8 GiB, so that the
# fabric verdict judges where the references are most stable (config/fabric_references.py). Its memory
# allows it: the published run measured that size on the same type.
BENCH_MAX_BYTES = 8 * GIB


def bench_sizes(instance: InstanceSpec) -> str:
    """The benchmark's --sizes for this type: 8K:1G, or on to the largest published size up to 8 GiB."""
    published = [
        row.message_bytes
        for row in REFERENCES
        if row.instance_type == instance.name and row.cause is None and row.message_bytes <= BENCH_MAX_BYTES
    ]
    end = max([GIB, *published])
    return BENCH_ALLREDUCE_SIZES if end == GIB else f"8K:{end // GIB}G"


BENCH_ALLREDUCE_ITERS = 20


# The launcher's hang watch (container/launcher/progress_watch.py, docs/health.md): a job in which no node makes
# progress for HANG_SECONDS (never less than twice its slowest step) ends with every node's stacks.
# HANG_SECONDS: a few minutes, as HyperPod's example hang rule (300 s). PyTorch's flight recorder
# (torch/csrc/distributed/c10d: FlightRecorder.hpp reads TORCH_NCCL_TRACE_BUFFER_SIZE, 2000 entries by
# default; ProcessGroupNCCL.hpp TORCH_NCCL_DUMP_ON_TIMEOUT; the dump goes to TORCH_FR_DUMP_TEMP_FILE<rank>)
# writes what each rank's collectives were doing when NCCL's watchdog times out; the watch uploads the files
# from under the launcher's progress folder (PROGRESS_DIR, /tmp/training-progress).
HANG_SECONDS = 300
PROGRESS_DIR = "/tmp/training-progress"  # noqa: S108 - inside the job's own container
HANG_ENVIRONMENT = {
    "HANG_SECONDS": str(HANG_SECONDS),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_FR_DUMP_TEMP_FILE": f"{PROGRESS_DIR}/flight-recorder/rank-",
}


@dataclass(frozen=True)
class Workload:
    command: tuple[str, ...]
    environment: dict[str, str] = field(default_factory=dict)


# Isaac Sim renders through Vulkan, and the NVIDIA container toolkit injects the driver's graphics
# userspace (Vulkan ICD, libGLX_nvidia) only for the graphics capability; compute-only injection
# fails with "Failed to create any GPU devices" (isaac-sim/IsaacSim#357). The variable is read by
# the toolkit that the ECS GPU AMI runs containers with (NVIDIA container toolkit, "Driver
# capabilities"). `all` (compute, utility, graphics, video, display) rather than a narrower list, so
# that the job never gets less than the Isaac Sim image itself asks for. EXPECT_VULKAN makes the
# launcher's preflight prove a Vulkan GPU is visible.
ISAAC_SIM_ENVIRONMENT = {"NVIDIA_DRIVER_CAPABILITIES": "all", "EXPECT_VULKAN": "1"}


def _node_environment(instance: InstanceSpec) -> dict[str, str]:
    """What the launcher's preflight checks on every node, and the ranks it starts."""
    environment = {"NPROC_PER_NODE": str(instance.processes_per_node), "EFA_DEVICES": str(instance.max_efa_interfaces)}
    environment.update(HANG_ENVIRONMENT)
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        environment.update(NEURON_EFA_ENVIRONMENT)
        environment["EXPECTED_NEURON_DEVICES"] = str(instance.accelerator_count)
    else:
        environment["EXPECTED_GPUS"] = str(instance.accelerator_count)
        if instance.max_efa_interfaces:
            # Training too, not only the benchmark: a broken plugin stops the job at its start instead
            # of training over TCP sockets at a fraction of the fabric's speed.
            environment["NCCL_NET"] = AWS_OFI_NCCL_PLUGIN
        # The image's PyTorch must run a kernel on this GPU (a build without its architecture fails
        # only at the first CUDA call otherwise; Blackwell needs CUDA 12.8 builds).
        environment["EXPECT_TORCH_CUDA"] = "1"
        if instance.min_nvidia_driver:
            # container/launcher/driver_check.py refuses an older host driver (config/catalog.py cites it).
            environment["MIN_NVIDIA_DRIVER"] = instance.min_nvidia_driver
    if instance.runs_isaac_sim:
        # On both job definitions, so that the fleet check (the benchmark) proves Vulkan too.
        environment.update(ISAAC_SIM_ENVIRONMENT)
    return environment


def _allreduce(size_mb: int, iters: int) -> tuple[str, ...]:
    return (LAUNCHER, ALLREDUCE_BENCH, "--size-mb", str(size_mb), "--iters", str(iters))


def training_workload(instance: InstanceSpec) -> Workload:
    """Isaac Lab RL where the GPU can run Isaac Sim; a PyTorch script you name on other GPUs; the
    Neuron all-reduce example on Trainium (replace it with your script)."""
    environment = _node_environment(instance)
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        return Workload(_allreduce(TRAINING_ALLREDUCE_MB, TRAINING_ALLREDUCE_ITERS), environment)
    if not instance.runs_isaac_sim:
        # A shell expands TRAIN_SCRIPT and TRAIN_ARGS at run time: submit with your own values.
        environment.update(
            {
                "TRAIN_SCRIPT": ALLREDUCE_BENCH,
                "TRAIN_ARGS": f"--size-mb {TRAINING_ALLREDUCE_MB} --iters {TRAINING_ALLREDUCE_ITERS}",
            }
        )
        script = f'exec {LAUNCHER} "$TRAIN_SCRIPT" $TRAIN_ARGS'
        return Workload(("/bin/bash", "-c", script), environment)
    environment.update(
        {
            "TASK": DEFAULT_TASK,
            "MAX_ITERATIONS": str(DEFAULT_MAX_ITERATIONS),
            # The Isaac Sim container does not start without both; setting them accepts NVIDIA's
            # Omniverse licence terms for the jobs this definition runs (docs/images.md).
            "ACCEPT_EULA": "Y",
            "PRIVACY_CONSENT": "Y",
            # Appended to the script's arguments by the launcher when it restored a model. Isaac Lab's
            # resume alone takes the newest run folder by name, which can be one where another rank
            # wrote only its configuration; load_run names the folder of the newest restored model
            # (the launcher fills in {resume_dir}).
            "RESUME_ARGS": "agent.resume=True agent.load_run={resume_dir}",
            "RESUME_GLOB": "model_*.pt",
        }
    )
    # Isaac Lab's log directory is the launcher's CHECKPOINT_DIR, which it restores before and
    # uploads during and after training. A shell expands TASK and MAX_ITERATIONS at run time, so a
    # submit-time environment override changes the task without touching the command.
    script = (
        f'mkdir -p "$CHECKPOINT_DIR" && rm -rf {ISAACLAB_LOG_DIR} && ln -s "$CHECKPOINT_DIR" {ISAACLAB_LOG_DIR} && '
        f'exec {LAUNCHER} {ISAACLAB_TRAIN_SCRIPT} --task "$TASK" --max_iterations "$MAX_ITERATIONS" '
        "--headless --distributed"
    )
    return Workload(("/bin/bash", "-c", script), environment)


def benchmark_workload(instance: InstanceSpec) -> Workload:
    """The fleet check: an all-reduce sweep within every node at once, judged against the GPUs'
    published interconnect bandwidth, then across every process of every node, judged against published
    runs of the instance type (config/fabric_references.py)."""
    environment = _node_environment(instance)
    environment["INSTANCE_TYPE"] = instance.name
    interconnect = INTRA_NODE.get(instance.name)
    if interconnect is not None and not interconnect.single_gpu:
        environment["NODE_GBPS"] = str(interconnect.gbps)
    if instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        # NCCL_NET comes with every node's environment; INFO prints the transport ("NET/OFI").
        environment["NCCL_DEBUG"] = "INFO"
    command = (LAUNCHER, ALLREDUCE_BENCH, "--sizes", bench_sizes(instance), "--iters", str(BENCH_ALLREDUCE_ITERS))
    return Workload((*command, "--per-node"), environment)
