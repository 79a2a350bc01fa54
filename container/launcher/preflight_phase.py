"""Preflight: preflight.py checks this node's devices (EFA devices and libfabric's provider, GPUs, a
Vulkan GPU, Neuron devices and tools, NCCL on the aws-ofi-nccl plugin over every EFA: nccl_proof.py)
before anything starts. A node that fails prints one line
naming the node, expected and found, and exits 75 (78 for a fault the fleet shares, 2 for a bad
variable). On the main node a child's report interrupts the checks: the node ends at once, with the
tools the checks still run stopped (they run in their own session, so their whole group is)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ending import Ending, exit_status, for_report
from node_state import NodeState
from node_tools import HERE

POLL_SECONDS = 0.05


@dataclass(frozen=True)
class PreflightResult:
    status: int  # 0, or a verdict of PREFLIGHT_VERDICTS
    last_error: str  # the last line it printed on stderr
    socket_interface: str  # the interface NCCL's and gloo's bootstrap sockets should use


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except OSError:
        with contextlib.suppress(OSError):
            process.terminate()


def run_preflight(node: NodeState) -> PreflightResult | Ending:
    """The checks' verdict, or the ending a child's report asks for while they ran."""
    with tempfile.TemporaryFile() as output, tempfile.TemporaryFile() as errors:
        try:
            process = subprocess.Popen(
                [node.settings.python.preflight, str(HERE / "preflight.py")],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=errors,
                start_new_session=True,
            )
        except OSError as error:
            line = f"cannot run preflight.py with {node.settings.python.preflight}: {error.strerror or error}"
            print(line, file=sys.stderr, flush=True)
            return PreflightResult(127, line, "")
        while True:
            status = process.poll()
            report = node.reported() if node.signals.fault_reported else None
            if report is not None:
                _stop_group(process)
                return for_report(report)
            if status is not None:
                break
            time.sleep(POLL_SECONDS)
        output.seek(0)
        errors.seek(0)
        error_text = errors.read().decode(errors="replace")
        output_text = output.read().decode(errors="replace")
    sys.stderr.write(error_text)
    sys.stderr.flush()
    lines = [line for line in error_text.splitlines() if line]
    # Only its own line counts: an interpreter's wrapper may print more.
    interfaces = [
        line[len("socket_interface=") :] for line in output_text.splitlines() if line.startswith("socket_interface=")
    ]
    return PreflightResult(exit_status(status), lines[-1] if lines else "", interfaces[-1] if interfaces else "")


def export_socket_interface(node: NodeState, interface: str) -> None:
    """Pins NCCL's and gloo's bootstrap sockets (unless set): eth0 inside an ECS awsvpc task (the task
    ENI; ecs-eth0 is the unreachable ECS credentials bridge, NVIDIA/nccl#859), elsewhere the default
    route's interface (preflight.py decides)."""
    if node.settings.batch is not None and interface:
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if not os.environ.get(name):
                os.environ[name] = interface
