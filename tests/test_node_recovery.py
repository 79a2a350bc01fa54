"""The host side of self-healing: the take-out unit (its steps run on a fake host), the collector's Xid
follower on GPU fleets, the compacted collector the user data carries, the node-state directory every
job container mounts, and NCCL_NET on every GPU training job definition."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.catalog import CATALOG, AcceleratorKind
from tests.harness import EFA_TYPES
from tests.test_host_check import boot_script
from tests.test_jobs import KINDS, container, environment, of_type
from training_constructs.common.node_files import compact_python
from training_constructs.health import node_recovery
from training_constructs.observability.node_metrics import COLLECTOR, collector


def fake_host(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose systemctl, sleep and the console writer append what they were asked to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for tool in ("systemctl", "sleep"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def unit(script: str, name: str) -> list[str]:
    start = script.index(f"cat > /etc/systemd/system/{name} <<'UNIT_EOF'\n")
    body = script[start:].split("\n", 1)[1]
    return body[: body.index("\nUNIT_EOF")].splitlines()


@pytest.mark.parametrize("instance", ["g6.12xlarge", "trn2.48xlarge"])
def test_the_take_out_marker_starts_the_unit_that_masks_the_agent_and_powers_off(instance, tmp_path):
    _, script = boot_script(instance)
    assert unit(script, "training-node-take-out.path") == ["[Path]", "PathExists=/var/lib/training-node/take-out"]
    service = unit(script, "training-node-take-out.service")
    assert service[:2] == ["[Service]", "Type=oneshot"]
    steps = [line.removeprefix("ExecStart=") for line in service[2:]]
    assert "systemctl --no-block start training-node-take-out.path" in script
    # On a fake host: the marker's reason goes to the console, then the agent goes, then the node.
    env, calls = fake_host(tmp_path)
    marker = tmp_path / "take-out"
    marker.write_text("hardware fault: NVIDIA Xid 79, GPU has fallen off the bus\n")
    console = tmp_path / "console"
    for step in steps:
        step = step.replace(node_recovery.TAKE_OUT_MARKER, str(marker)).replace("/dev/console", str(console))
        subprocess.run(["/bin/sh", "-c", step], env=env, check=True, timeout=10)
    assert calls.read_text().splitlines() == [
        "systemctl mask --runtime ecs.service",
        "sleep 10",
        "systemctl --no-block poweroff",
    ]
    assert "GPU has fallen off the bus" in console.read_text()


@pytest.mark.parametrize("instance", ["g6.12xlarge", "trn2.48xlarge"])
def test_the_collector_follows_the_kernel_log_for_node_fault_xids_on_gpu_fleets_only(instance):
    _, script = boot_script(instance)
    (line,) = [x for x in script.splitlines() if x.startswith("ExecStart=/usr/bin/python3 /opt/training-node-metrics/")]
    # --gpu starts the kernel-log follower; its state directory defaults to the mounted one.
    assert (" --gpu" in line) is (CATALOG[instance].accelerator_kind is AcceleratorKind.NVIDIA_GPU)
    assert str(collector.STATE_DIR) == node_recovery.NODE_STATE_DIR


def test_the_compacted_collector_is_the_same_program(tmp_path):
    source = COLLECTOR.read_text()
    compact = compact_python(source)
    assert len(compact) < len(source) * 0.7
    # Same code: the ASTs match once docstrings are gone from both.
    assert ast.dump(_without_docstrings(ast.parse(source))) == ast.dump(_without_docstrings(ast.parse(compact)))
    ast.parse(compact, feature_version=(3, 9))
    script = tmp_path / "collector.py"
    script.write_text(compact)
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and "Node metrics of a training instance" in done.stdout


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(node.body) > 1:
                node.body = node.body[1:]
            elif isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                first.value.value = ""
    return tree


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_every_job_container_mounts_the_node_state_directory_read_write(instance, kind):
    c = container(of_type(instance, kind))
    (volume,) = c["Volumes"]
    assert volume["Host"]["SourcePath"] == "/var/lib/training-node"
    (mount,) = c["MountPoints"]
    assert mount == {"SourceVolume": volume["Name"], "ContainerPath": "/var/lib/training-node", "ReadOnly": False}


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_every_gpu_training_job_refuses_a_socket_fallback(instance):
    env = environment(container(of_type(instance, "TrainingJob")))
    if CATALOG[instance].accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        # aws-ofi-nccl's plugin name: with it set, NCCL fails instead of falling back to TCP sockets.
        assert env["NCCL_NET"] == "AWS Libfabric"
    else:
        assert "NCCL_NET" not in env
