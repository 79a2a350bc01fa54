"""A node that finds a fault in itself takes itself out of its fleet before Batch places the retry: the
user-data commands for the host side, and the host directory every job container mounts.

- NODE_STATE_DIR (/var/lib/training-node) is the node's state shared with its job containers: the
  boot check's `shared-fault`, the node collector's `xid-faults` (node_metrics/collector.py follows
  the kernel log on GPU nodes), the launcher's `take-out` marker. Every job definition mounts it
  read-write at the same path (multi_node_job.py).
- training-node-take-out.path watches for `take-out` (container/launcher/node_fault.py writes it last, after a
  failed device preflight, a hardware fault during training or a stop with a GPU-reset Xid recorded, so
  that the container's exit is on its way to Batch). Its service, one command after the other
  (take_out_steps):
    1. says why on the instance console (EC2 GetConsoleOutput keeps it after the instance is gone);
    2. sets this container instance DRAINING at once (the boot check's `drain`: ECS places no new
       task on a DRAINING instance, ECS developer guide, "Draining Amazon ECS container instances"),
       while the agent keeps running to report the container's exit; a failed drain is said on the
       console and changes nothing else (the "-" prefix: systemd.service, "Command lines");
    3. masks ecs.service for this boot: the ECS agent never starts here again;
    4. checks the host itself (the boot check's `confirm`, bounded by CONFIRM_SECONDS) and sends its one line
       to the fleet's boot-check log group: TakeOutConfirmed 1 only when the host's own device counts or
       kernel log show a node fault. The fleet's circuit breaker counts these lines, never the launcher's
       word, which any job could print. A failed confirmation is said on the console and counts nothing;
       the take-out goes on either way. The agent keeps running meanwhile, so this adds to its time to
       report the exit and takes none of the grace;
    5. waits TAKE_OUT_GRACE_SECONDS for the agent to report the container's exit to Batch;
    6. powers off, which stops the agent first: the launch template's shutdown behaviour `terminate`
       makes that a termination, and the compute environment's Auto Scaling group launches a fresh
       instance.
  The service's output goes to the journal and the instance console (StandardOutput=journal+console).
  Without the drain (no credentials, no endpoint), a retry that Batch placed here within the grace
  fails with the host's termination ("Host EC2*"), which the job definitions retry too.
"""

from __future__ import annotations

from training_constructs.health.host_check import NODE_PATH

NODE_STATE_DIR = "/var/lib/training-node"
TAKE_OUT_MARKER = f"{NODE_STATE_DIR}/take-out"
TAKE_OUT_UNIT = "training-node-take-out"
TAKE_OUT_GRACE_SECONDS = 10
# The host check of a take-out: nvidia-smi gets 60 s (a GPU off the bus can hang it), IMDS and the log call
# seconds each. Type=oneshot has no start timeout of its own (systemd.service, TimeoutStartSec=).
CONFIRM_SECONDS = 120
UNIT_DIR = "/etc/systemd/system"


def take_out_steps(*, region: str, url_suffix: str) -> tuple[str, ...]:
    """The take-out service's commands, in order. Bare command names: systemd resolves them on its fixed
    search path (systemd.service, "Command lines", systemd 239 and later; AL2023 ships 252)."""
    return (
        # The marker sits where jobs write: read through no link (dd's nofollow: open(2) O_NOFOLLOW) and without
        # waiting on a FIFO (nonblock), printable characters only.
        f"sh -c 'echo \"training-node-take-out: node fault ($(dd if={TAKE_OUT_MARKER} iflag=nofollow,nonblock"
        ' bs=300 count=1 2>/dev/null | tr -cd "[:print:]")); powering off" > /dev/console\'',
        f"-python3 {NODE_PATH} drain {region} https://ecs.{region}.{url_suffix}/",
        "systemctl mask --runtime ecs.service",
        f"-timeout {CONFIRM_SECONDS} python3 {NODE_PATH} confirm",
        f"sleep {TAKE_OUT_GRACE_SECONDS}",
        "systemctl --no-block poweroff",
    )


_EOF = "UNIT_EOF"


def _write(path: str, lines: list[str]) -> str:
    return f"cat > {path} <<'{_EOF}'\n" + "\n".join(lines) + f"\n{_EOF}"


def node_recovery_commands(*, region: str, url_suffix: str) -> list[str]:
    """Shell commands for the node's user data (after the boot check's, which write its script)."""
    steps = take_out_steps(region=region, url_suffix=url_suffix)
    return [
        f"mkdir -p {NODE_STATE_DIR}",
        _write(f"{UNIT_DIR}/{TAKE_OUT_UNIT}.path", ["[Path]", f"PathExists={TAKE_OUT_MARKER}"]),
        # Type=oneshot runs its ExecStart lines in order (systemd.service, "Type=").
        _write(
            f"{UNIT_DIR}/{TAKE_OUT_UNIT}.service",
            ["[Service]", "Type=oneshot", "StandardOutput=journal+console", *(f"ExecStart={step}" for step in steps)],
        ),
        # --no-block: user data runs inside cloud-final, which systemd must not wait on.
        f"systemctl daemon-reload && systemctl --no-block start {TAKE_OUT_UNIT}.path",
    ]
