"""The boot-time host check as user-data commands: node_scripts/boot_check.py, written to the node
and run before the ECS agent starts, with what the fleet's instance type should have.

Ordering: the ECS agent's unit on the ECS-optimized AL2023 AMIs is `After=cloud-final.service`
(aws/amazon-ecs-agent, packaging/amazon-linux-ami-integrated/ecs.service), and cloud-init runs user
data scripts in cloud-final, so the check finishes before the agent can register the instance.
A node with a node fault masks ecs.service for this boot (starting a masked unit fails, so the agent
never registers and Batch never places a job on it) and powers off; the launch template's shutdown
behaviour `terminate` makes that a termination, and the Auto Scaling group behind the managed
compute environment (Batch user guide, "Managed compute environments") replaces the instance; the
fleet's circuit breaker (training_constructs/health/boot_breaker.py) stops that loop after a few nodes.
A node with only a shared fault (every node of the fleet has it) registers: the check wrote the
cause to SHARED_FAULT_FILE, and the job preflight refuses jobs with it instead (exit 78).
Restarting or stopping the agent from user data is avoided: the agent waits for cloud-final, so
that would deadlock the boot.
"""

from __future__ import annotations

from pathlib import Path

from config.catalog import AcceleratorKind, InstanceSpec
from training_constructs.common.node_files import NodeFile, compact_python

SCRIPT = Path(__file__).parent / "node_scripts" / "boot_check.py"
NODE_PATH = "/usr/local/libexec/training-boot-check.py"
# boot_check.py EXIT_FAILED: the node failed a check. Any other non-zero status means the check
# itself could not run; the node then registers (the job preflight still guards every job) rather
# than a broken check taking the whole fleet down.
EXIT_FAILED = 3
# boot_check.py EXIT_SHARED: only faults every node of the fleet shares; the node registers.
EXIT_SHARED = 4
# The boot check writes a shared fault here (boot_check.py SHARED_FAULT_FILE); the job definitions
# mount the directory into every job container at the same path for the preflight.
SHARED_FAULT_DIR = "/var/lib/training-node"
SHARED_FAULT_FILE = f"{SHARED_FAULT_DIR}/shared-fault"


def node_script() -> bytes:
    """The script as the node gets it: without docstrings and comments (training_constructs/common/node_files.py)."""
    return compact_python(SCRIPT.read_text()).encode()


def host_check_files() -> list[NodeFile]:
    """The files `host_check_commands` runs; the launch template writes them first, in one bundle with the
    other node files (training_constructs/common/node_files.py)."""
    return [(NODE_PATH, node_script())]


def host_check_arguments(instance: InstanceSpec, fleet: str, efa_interfaces: int) -> list[str]:
    arguments = ["--fleet", fleet, "--efa", str(efa_interfaces)]
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        arguments += ["--neuron-devices", str(instance.accelerator_count)]
    else:
        arguments += ["--gpus", str(instance.accelerator_count)]
    if instance.runs_isaac_sim:
        arguments.append("--vulkan")
    return arguments


def host_check_commands(
    *, instance: InstanceSpec, fleet: str, efa_interfaces: int, log_group_name: str, region: str, url_suffix: str
) -> list[str]:
    arguments = [
        *host_check_arguments(instance, fleet, efa_interfaces),
        *("--log-group", log_group_name, "--region", region, "--logs-endpoint", f"https://logs.{region}.{url_suffix}/"),
    ]
    return [
        f"mkdir -p {SHARED_FAULT_DIR}",
        "boot_check_status=0",
        f"python3 {NODE_PATH} {' '.join(arguments)} || boot_check_status=$?",
        f'if [ "$boot_check_status" -eq {EXIT_FAILED} ]; then',
        "  echo 'training boot check FAILED (line above): not registering with ECS; shutting down' >&2",
        "  systemctl mask --runtime ecs.service",
        "  systemctl --no-block poweroff",
        f'elif [ "$boot_check_status" -eq {EXIT_SHARED} ]; then',
        f"  echo 'training boot check: shared fault in {SHARED_FAULT_FILE}; registering' >&2",
        'elif [ "$boot_check_status" -ne 0 ]; then',
        '  echo "training boot check could not run (exit $boot_check_status); registering" >&2',
        "fi",
    ]
