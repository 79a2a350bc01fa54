"""container/distributed_run.sh, run with stand-in interpreters that print what they were given:
command construction, Batch variables, socket interfaces, the join timeout, the fabric preflight
and every bad-input case. The real rendezvous is in tests/test_allreduce.py, checkpoints in
tests/test_checkpoints.py. Every address is loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ROOT

LAUNCHER = ROOT / "container" / "distributed_run.sh"
BENCH = ROOT / "container" / "benchmark" / "allreduce_bench.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_BATCH_", "MASTER_", "NPROC_"))}
    # The venv's torchrun first; loopback only.
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PREFLIGHT_PYTHON=sys.executable)
    env.update(extra)
    return env


def launch(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(LAUNCHER), *args],
        cwd=ROOT / "container",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def fake_python(tmp_path):
    """A PYTHON that records its arguments and exits with $FAKE_STATUS."""
    script = tmp_path / "python.sh"
    script.write_text('#!/bin/sh\necho "ARGS: $*"\nexit "${FAKE_STATUS:-0}"\n')
    script.chmod(0o755)
    return str(script)


def run_fake(fake_python: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LAUNCHER), "train.py", "--task", "Isaac-Velocity-Rough-H1-v0"],
        env=base_env(PYTHON=fake_python, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_python_is_honoured_and_arguments_passed_through(fake_python):
    result = run_fake(
        fake_python,
        NPROC_PER_NODE="4",
        AWS_BATCH_JOB_NUM_NODES="2",
        AWS_BATCH_JOB_NODE_INDEX="1",
        AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
        AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.1.2.3",
        AWS_BATCH_JOB_ID="job#1",
    )
    assert result.returncode == 0, result.stderr
    (args,) = [x for x in result.stdout.splitlines() if x.startswith("ARGS: ")]
    assert args.startswith("ARGS: -m torch.distributed.run ")
    for fragment in (
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=4",
        "--rdzv_endpoint=10.1.2.3:29500",
        "--rdzv_backend=c10d",
        "--rdzv_id=job",
        "--rdzv_conf=is_host=0",
    ):
        assert fragment in args
    assert args.endswith("train.py --task Isaac-Velocity-Rough-H1-v0")
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("distributed_run.sh: node 1 of 2")


def test_rendezvous_id_strips_everything_from_hash_at_node_index_ten_and_up(fake_python):
    ids = set()
    for index in (0, 9, 10, 11):
        env = {
            "AWS_BATCH_JOB_NUM_NODES": "12",
            "AWS_BATCH_JOB_NODE_INDEX": str(index),
            "AWS_BATCH_JOB_ID": f"b0e1-77#{index}",
            "MASTER_ADDR": "127.0.0.1",
            "NPROC_PER_NODE": "1",
        }
        result = run_fake(fake_python, **env)
        assert result.returncode == 0, result.stderr
        ids.add(next(a for a in result.stdout.split() if a.startswith("--rdzv_id=")))
    assert ids == {"--rdzv_id=b0e1-77"}


def test_main_node_becomes_rank_zero_whatever_its_index(fake_python):
    ranks = {}
    for index in range(3):
        result = run_fake(
            fake_python,
            AWS_BATCH_JOB_NUM_NODES="3",
            AWS_BATCH_JOB_NODE_INDEX=str(index),
            AWS_BATCH_JOB_MAIN_NODE_INDEX="2",
            MASTER_ADDR="127.0.0.1",
            NPROC_PER_NODE="1",
        )
        assert result.returncode == 0, result.stderr
        ranks[index] = next(a for a in result.stdout.split() if a.startswith("--node_rank="))
        assert ("--rdzv_conf=is_host=1" in result.stdout) == (index == 2)
    assert ranks == {2: "--node_rank=0", 0: "--node_rank=1", 1: "--node_rank=2"}


def test_single_node_without_batch_variables(fake_python):
    result = run_fake(fake_python, NPROC_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    (args,) = [x for x in result.stdout.splitlines() if x.startswith("ARGS: ")]
    assert args.startswith("ARGS: -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=2 train.py")
    assert "rdzv" not in args
    assert "single node, 2 processes" in result.stderr


def test_exit_status_is_the_training_commands(fake_python):
    assert run_fake(fake_python, FAKE_STATUS="7", NPROC_PER_NODE="1").returncode == 7


def test_a_stop_during_the_preflight_ends_the_node_before_training(fake_python, tmp_path):
    # A preflight that takes a while (tools answering slowly); the stop arrives meanwhile. As the
    # container's PID 1, bash would ignore it without a trap and train until the SIGKILL.
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\ntouch "{tmp_path}/preflight"\nsleep 1\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    node = launch(base_env(PYTHON=fake_python, PREFLIGHT_PYTHON=str(slow)), "train.py")
    deadline = time.monotonic() + 20
    while not (tmp_path / "preflight").exists():
        assert time.monotonic() < deadline and node.poll() is None
        time.sleep(0.02)
    node.send_signal(signal.SIGTERM)
    stdout, stderr = node.communicate(timeout=30)
    assert node.returncode == 143 and "ARGS:" not in stdout
    assert "stopped (SIGTERM) before training started" in stderr


def test_preset_master_addr_wins_on_a_child(fake_python):
    result = run_fake(
        fake_python,
        AWS_BATCH_JOB_NUM_NODES="2",
        AWS_BATCH_JOB_NODE_INDEX="1",
        AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.9.9.9",
        MASTER_ADDR="127.0.0.1",
        NPROC_PER_NODE="1",
    )
    assert result.returncode == 0, result.stderr
    assert "--rdzv_endpoint=127.0.0.1:29500" in result.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "2"},
            "AWS_BATCH_JOB_NODE_INDEX=2 is not below AWS_BATCH_JOB_NUM_NODES=2",
        ),
        (
            {"AWS_BATCH_JOB_NUM_NODES": "two", "AWS_BATCH_JOB_NODE_INDEX": "0"},
            "AWS_BATCH_JOB_NUM_NODES='two' is not a positive integer",
        ),
        (
            {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "x"},
            "AWS_BATCH_JOB_NODE_INDEX='x' is not a non-negative integer",
        ),
        (
            {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "5"},
            "AWS_BATCH_JOB_MAIN_NODE_INDEX=5 is not below",
        ),
        ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1"}, "child node 1 has neither MASTER_ADDR nor"),
        ({"NPROC_PER_NODE": "0"}, "NPROC_PER_NODE='0' is not a positive integer"),
        ({"NPROC_PER_NODE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port number"),
    ],
)
def test_inconsistent_input_fails_clearly(fake_python, env, message):
    result = run_fake(fake_python, **{"NPROC_PER_NODE": "1", **env})
    assert result.returncode == 2
    assert message in result.stderr
    assert "ARGS:" not in result.stdout  # nothing was launched


def test_no_script_is_a_usage_error():
    result = subprocess.run([str(LAUNCHER)], env=base_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "usage: distributed_run.sh SCRIPT" in result.stderr


@pytest.fixture
def env_probe(tmp_path):
    """A PYTHON that prints the launcher's arguments and the socket settings it was given."""
    script = tmp_path / "probe.sh"
    script.write_text(
        '#!/bin/sh\necho "ARGS: $*"\necho "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-unset}"\n'
        'echo "GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-unset}"\n'
    )
    script.chmod(0o755)
    return str(script)


def run_probe(probe: str, **env: str) -> subprocess.CompletedProcess:
    environment = base_env(PYTHON=probe, NPROC_PER_NODE="1", **env)
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run([str(LAUNCHER), "train.py"], env=environment, capture_output=True, text=True, timeout=60)


BATCH_MAIN = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "0", "MASTER_ADDR": "127.0.0.1"}


def test_batch_nodes_pin_nccl_and_gloo_to_the_task_eni(env_probe):
    # Inside an ECS awsvpc task; outside one the default route decides (tests/test_preflight.py).
    result = run_probe(env_probe, **BATCH_MAIN, ECS_CONTAINER_METADATA_URI_V4="http://169.254.170.2/v4/t")
    assert result.returncode == 0, result.stderr
    assert "NCCL_SOCKET_IFNAME=eth0" in result.stdout and "GLOO_SOCKET_IFNAME=eth0" in result.stdout


def test_preset_socket_interfaces_win(env_probe):
    result = run_probe(env_probe, **BATCH_MAIN, NCCL_SOCKET_IFNAME="ens5", GLOO_SOCKET_IFNAME="ens6")
    assert "NCCL_SOCKET_IFNAME=ens5" in result.stdout and "GLOO_SOCKET_IFNAME=ens6" in result.stdout


def test_outside_batch_the_socket_interfaces_are_left_alone(env_probe):
    result = run_probe(env_probe)
    assert "NCCL_SOCKET_IFNAME=unset" in result.stdout and "GLOO_SOCKET_IFNAME=unset" in result.stdout


def test_rendezvous_waits_half_an_hour_for_late_children_by_default(env_probe):
    assert "--rdzv_conf=is_host=1,join_timeout=1800" in run_probe(env_probe, **BATCH_MAIN).stdout
    result = run_probe(env_probe, **BATCH_MAIN, RDZV_JOIN_TIMEOUT="3600")
    assert "--rdzv_conf=is_host=1,join_timeout=3600" in result.stdout


def test_bad_join_timeout_is_refused(env_probe):
    result = run_probe(env_probe, **BATCH_MAIN, RDZV_JOIN_TIMEOUT="soon")
    assert result.returncode == 2 and "RDZV_JOIN_TIMEOUT='soon' is not a positive integer" in result.stderr
    assert "ARGS:" not in result.stdout


def fake_devices(directory: Path, uverbs: int) -> Path:
    directory.mkdir()
    for i in range(uverbs):
        (directory / f"uverbs{i}").touch()
    (directory / "rdma_cm").touch()  # not an EFA device; must not be counted
    return directory


def fake_fi_info(bin_dir: Path) -> str:
    """A PATH with an fi_info that lists the EFA provider (the preflight asks libfabric too)."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "fi_info"
    tool.write_text('#!/bin/sh\necho "provider: efa"\n')
    tool.chmod(0o755)
    return f"{bin_dir}:{base_env()['PATH']}"


def fake_nvidia_smi(bin_dir: Path, gpus: int) -> str:
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    lines = "".join(f"GPU {i}: NVIDIA L4 (UUID: GPU-{i})\\n" for i in range(gpus))
    tool.write_text(f'#!/bin/sh\nprintf "{lines}"\n')
    tool.chmod(0o755)
    return f"{bin_dir}:{base_env()['PATH']}"


@pytest.mark.parametrize(("attached", "expected", "ok"), [(4, 4, True), (32, 32, True), (3, 4, False), (0, 1, False)])
def test_efa_preflight_counts_uverbs_devices(env_probe, tmp_path, attached, expected, ok):
    devices = fake_devices(tmp_path / "infiniband", attached)
    path = fake_fi_info(tmp_path / "bin")
    result = run_probe(env_probe, **BATCH_MAIN, PATH=path, EFA_DEVICE_DIR=str(devices), EFA_DEVICES=str(expected))
    if ok:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 75 and "ARGS:" not in result.stdout
        (line,) = result.stderr.strip().splitlines()
        assert f"expected {expected} EFA devices (uverbs*) in {devices}, found {attached}" in line


def test_no_efa_expectation_no_check(env_probe, tmp_path):
    result = run_probe(env_probe, **BATCH_MAIN, EFA_DEVICE_DIR=str(tmp_path / "missing"))
    assert result.returncode == 0, result.stderr


def test_missing_device_directory_counts_as_no_devices(env_probe, tmp_path):
    result = run_probe(env_probe, **BATCH_MAIN, EFA_DEVICE_DIR=str(tmp_path / "missing"), EFA_DEVICES="1")
    assert result.returncode == 75 and "expected 1 EFA devices" in result.stderr and "found 0" in result.stderr


@pytest.mark.parametrize(("present", "expected", "ok"), [(4, 4, True), (8, 4, True), (3, 4, False)])
def test_gpu_preflight_counts_what_nvidia_smi_lists(env_probe, tmp_path, present, expected, ok):
    path = fake_nvidia_smi(tmp_path / "bin", present)
    result = run_probe(env_probe, **BATCH_MAIN, PATH=path, EXPECTED_GPUS=str(expected))
    assert (result.returncode == 0) is ok, result.stderr
    if not ok:
        assert f"expected {expected} GPUs (nvidia-smi --list-gpus), found {present}" in result.stderr


def test_gpu_preflight_without_a_driver_finds_none(env_probe):
    result = run_probe(env_probe, **BATCH_MAIN, EXPECTED_GPUS="1")
    assert result.returncode == 75 and "expected 1 GPUs" in result.stderr and "found 0" in result.stderr


@pytest.mark.parametrize("batch", [False, True], ids=["single node: exec", "on Batch: supervised"])
def test_a_trainer_that_cannot_be_run_ends_127_in_one_line(tmp_path, batch):
    env = base_env(PYTHON=str(tmp_path / "no-such-python"), NPROC_PER_NODE="1")
    if batch:
        env |= {"AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_NODE_INDEX": "0", "MASTER_ADDR": "127.0.0.1"}
    result = subprocess.run([str(LAUNCHER), "train.py"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 127, result.stderr
    assert f"distributed_run.sh: cannot run {tmp_path / 'no-such-python'}: " in result.stderr
