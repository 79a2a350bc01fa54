"""What the job definitions run by default: the command and environment per profile.

Everything here can be overridden at submit time (node overrides of command and environment);
the README shows how.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.catalog import AcceleratorKind, InstanceSpec

# Installed by both Dockerfiles (container/).
LAUNCHER = "/opt/training/distributed_run.sh"
ALLREDUCE_BENCH = "/opt/training/allreduce_bench.py"

# Isaac Lab RL as the seed runs it: RSL-RL's train script, relative to the image's working
# directory /workspace/isaaclab (Isaac Lab 2.x layout), headless, one process per GPU.
ISAACLAB_TRAIN_SCRIPT = "scripts/reinforcement_learning/rsl_rl/train.py"
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

TRAINING_ALLREDUCE_MB = 256
TRAINING_ALLREDUCE_ITERS = 100
BENCH_ALLREDUCE_MB = 1024
BENCH_ALLREDUCE_ITERS = 20


@dataclass(frozen=True)
class Workload:
    command: tuple[str, ...]
    environment: dict[str, str] = field(default_factory=dict)


def _accelerator_environment(instance: InstanceSpec) -> dict[str, str]:
    environment = {"NPROC_PER_NODE": str(instance.processes_per_node)}
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        environment.update(NEURON_EFA_ENVIRONMENT)
    return environment


def _allreduce(size_mb: int, iters: int) -> tuple[str, ...]:
    return (LAUNCHER, ALLREDUCE_BENCH, "--size-mb", str(size_mb), "--iters", str(iters))


def training_workload(instance: InstanceSpec) -> Workload:
    """GPU: Isaac Lab RL. Trainium: the Neuron all-reduce example (replace it with your script)."""
    environment = _accelerator_environment(instance)
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        return Workload(_allreduce(TRAINING_ALLREDUCE_MB, TRAINING_ALLREDUCE_ITERS), environment)
    environment.update(
        {
            "TASK": DEFAULT_TASK,
            "MAX_ITERATIONS": str(DEFAULT_MAX_ITERATIONS),
            # The Isaac Sim container does not start without both; setting them accepts NVIDIA's
            # Omniverse licence terms for the jobs this definition runs (README, "Isaac Lab").
            "ACCEPT_EULA": "Y",
            "PRIVACY_CONSENT": "Y",
        }
    )
    # A shell expands TASK and MAX_ITERATIONS at run time, so a submit-time environment override
    # changes the task without touching the command.
    script = (
        f'exec {LAUNCHER} {ISAACLAB_TRAIN_SCRIPT} --task "$TASK" --max_iterations "$MAX_ITERATIONS" '
        "--headless --distributed"
    )
    return Workload(("/bin/bash", "-c", script), environment)


def benchmark_workload(instance: InstanceSpec) -> Workload:
    """The network smoke test: a large all-reduce across every process of every node."""
    environment = _accelerator_environment(instance)
    if instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        # Prints the transport NCCL chose: "NET/OFI" means EFA, "NET/Socket" a TCP fallback.
        environment["NCCL_DEBUG"] = "INFO"
    return Workload(_allreduce(BENCH_ALLREDUCE_MB, BENCH_ALLREDUCE_ITERS), environment)
