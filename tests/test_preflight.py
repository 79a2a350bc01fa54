"""container/launcher/preflight.py against fake device trees and stand-in tools that print what the real ones
print (the H100 node's nvidia-smi and vulkaninfo output in tests/fixtures), in-process; and the
launcher's use of it (exit code, one line, socket interface), one subprocess each."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

# Real output of an NVIDIA H100 node (tests/fixtures/nvidia-h100/README.md says which command).
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h100"
_spec = importlib.util.spec_from_file_location("preflight", ROOT / "container" / "launcher" / "preflight.py")
assert _spec and _spec.loader
preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preflight)

# What `fi_info -p efa` prints on an EFA node (EC2 user guide, "Get started with EFA and NCCL": the
# provider block starts with "provider: efa"), and what libfabric prints without the provider.
FI_INFO_EFA = "provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n    version: 122.0\n    type: FI_EP_RDM\n"
FI_INFO_NONE = "fi_getinfo: -61 (No data available)\n"
ROUTES = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "{iface}\t00000000\t0100100A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    "{iface}\t0000100A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
)


def fixture(name: str) -> str:
    return str(FIXTURES / name)


def tool(bin_dir: Path, name: str, output_file: str, status: int = 0) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\ncat "{output_file}"\nexit {status}\n')
    script.chmod(0o755)


def text_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def devices(directory: Path, prefix: str, count: int) -> str:
    directory.mkdir(exist_ok=True)
    for i in range(count):
        (directory / f"{prefix}{i}").touch()
    return str(directory)


@pytest.fixture
def gpu_node(tmp_path):
    """A healthy Isaac Lab node: 4 GPUs listed, 1 EFA device with its provider, a Vulkan GPU."""
    bin_dir = tmp_path / "bin"
    gpus = text_file(tmp_path, "gpus.txt", "".join(f"GPU {i}: NVIDIA L4 (UUID: GPU-{i})\n" for i in range(4)))
    tool(bin_dir, "nvidia-smi", gpus)
    tool(bin_dir, "fi_info", text_file(tmp_path, "fi.txt", FI_INFO_EFA))
    tool(bin_dir, "vulkaninfo", fixture("vulkaninfo-summary.txt"))
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "EFA_DEVICES": "1",
        "EFA_DEVICE_DIR": devices(tmp_path / "infiniband", "uverbs", 1),
        "EXPECTED_GPUS": "4",
        "EXPECT_VULKAN": "1",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,graphics,utility",
        "PROC_NET_ROUTE": text_file(tmp_path, "route", ROUTES.format(iface="ens5")),
    }


@pytest.fixture
def neuron_node(tmp_path):
    bin_dir = tmp_path / "bin"
    listing = "[" + ",".join(f'{{"neuron_device": {i}, "nc_count": 2}}' for i in range(16)) + "]"
    tool(bin_dir, "neuron-ls", text_file(tmp_path, "neuron-ls.json", listing))
    tool(bin_dir, "fi_info", text_file(tmp_path, "fi.txt", FI_INFO_EFA))
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "EFA_DEVICES": "8",
        "EFA_DEVICE_DIR": devices(tmp_path / "infiniband", "uverbs", 8),
        "EXPECTED_NEURON_DEVICES": "16",
        "NEURON_DEVICE_DIR": devices(tmp_path / "dev", "neuron", 16),
    }


def test_healthy_nodes_pass(gpu_node, neuron_node):
    assert preflight.failures(gpu_node) == []
    assert preflight.failures(neuron_node) == []


def test_the_real_h100_listing_counts_one_gpu(gpu_node, tmp_path):
    tool(tmp_path / "bin", "nvidia-smi", fixture("nvidia-smi-list-gpus.txt"))
    assert preflight.failures({**gpu_node, "EXPECTED_GPUS": "1"}) == []
    assert preflight.failures(gpu_node) == ["4 GPUs (nvidia-smi --list-gpus), found 1"]


def test_missing_efa_devices(gpu_node, tmp_path):
    (found,) = preflight.failures({**gpu_node, "EFA_DEVICE_DIR": str(tmp_path / "none")})
    assert found == f"1 EFA devices (uverbs*) in {tmp_path / 'none'}, found 0"


def test_software_every_node_shares_is_not_a_node_fault(gpu_node, tmp_path):
    # No libfabric, no Vulkan: the image or the AMI lacks them on every node, so the node passes the
    # device checks (exit 75, take-out) and fails the fleet's (exit 78, not retried, nobody taken out).
    (tmp_path / "bin" / "fi_info").unlink()
    tool(tmp_path / "bin", "vulkaninfo", fixture("vulkaninfo-no-icd.txt"), status=1)
    assert preflight.failures(gpu_node) == []
    assert len(preflight.image_failures(gpu_node)) == 2
    assert preflight.main(gpu_node) == preflight.IMAGE_EXIT == 78


def test_missing_efa_provider(gpu_node, tmp_path):
    tool(tmp_path / "bin", "fi_info", text_file(tmp_path, "none.txt", FI_INFO_NONE), status=61)
    (found,) = preflight.image_failures(gpu_node)
    assert found.startswith("libfabric's EFA provider (fi_info -p efa), found exit 61")
    assert "No data available" in found


def test_missing_libfabric(gpu_node, tmp_path):
    (tmp_path / "bin" / "fi_info").unlink()
    (found,) = preflight.image_failures(gpu_node)
    assert "found no fi_info" in found


def test_missing_vulkan_driver(gpu_node, tmp_path):
    tool(tmp_path / "bin", "vulkaninfo", fixture("vulkaninfo-no-icd.txt"), status=1)
    (found,) = preflight.image_failures(gpu_node)
    assert found.startswith("a Vulkan GPU (vulkaninfo --summary), found exit 1")


@pytest.mark.parametrize("capabilities", [None, "compute,utility"])
def test_compute_only_driver_injection_is_refused(gpu_node, capabilities):
    env = {k: v for k, v in gpu_node.items() if k != "NVIDIA_DRIVER_CAPABILITIES"}
    if capabilities:
        env["NVIDIA_DRIVER_CAPABILITIES"] = capabilities
    (found,) = preflight.image_failures(env)
    assert found == f"NVIDIA_DRIVER_CAPABILITIES with graphics (Vulkan for Isaac Sim), found {capabilities or 'unset'}"


@pytest.mark.parametrize("name", ["nvidia_icd.json", "nvidia_icd.x86_64.json", "nvidia_icd.aarch64.json"])
def test_without_vulkaninfo_the_icd_file_decides(gpu_node, tmp_path, name):
    # The .run installer's name, and the RPM packaging's nvidia_icd.<arch>.json (NVIDIA/yum-packaging-
    # nvidia-driver, nvidia-driver.spec), which the ECS AL2023 GPU AMI's driver comes from.
    (tmp_path / "bin" / "vulkaninfo").unlink()
    icd = tmp_path / "icd.d"
    icd.mkdir()
    (icd / "intel_icd.x86_64.json").write_text("{}")  # another vendor's ICD does not count
    env = {**gpu_node, "VULKAN_ICD_DIRS": str(icd)}
    (found,) = preflight.image_failures(env)
    assert found == f"the NVIDIA Vulkan ICD (nvidia_icd*.json) in {icd}, found none"
    (icd / name).write_text("{}")
    assert preflight.image_failures(env) == []


def test_vulkan_is_checked_only_when_asked(gpu_node):
    env = {k: v for k, v in gpu_node.items() if k not in ("EXPECT_VULKAN", "NVIDIA_DRIVER_CAPABILITIES")}
    assert preflight.image_failures(env) == []


def test_wrong_neuron_device_count(neuron_node, tmp_path):
    (Path(neuron_node["NEURON_DEVICE_DIR"]) / "neuron15").unlink()
    (found,) = preflight.failures(neuron_node)
    assert found == f"16 Neuron devices (/dev/neuron*) in {neuron_node['NEURON_DEVICE_DIR']}, found 15"


def test_a_neuron_tool_failure_with_every_device_present_is_a_shared_fault_not_a_node_fault(neuron_node, tmp_path):
    error = text_file(tmp_path, "err.txt", "nrt_init: failed to open the Neuron driver\n")
    tool(tmp_path / "bin", "neuron-ls", error, status=1)
    # Not a node fault: no take-out, and node_fault.judge (which reads failures()) sees no hardware fault.
    assert preflight.failures(neuron_node) == []
    (found,) = preflight.image_failures(neuron_node)
    assert found == (
        "a working neuron-ls --json-output with all 16 Neuron devices present, found exit 1: "
        "nrt_init: failed to open the Neuron driver"
    )


def test_a_neuron_ls_that_hangs_is_a_shared_fault_and_is_run_once(neuron_node, tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    hang = tmp_path / "bin" / "neuron-ls"
    hang.write_text(f"#!/bin/sh\necho run >> {calls}\nexec sleep 30\n")
    monkeypatch.setattr(preflight, "COMMAND_TIMEOUT_SECONDS", 1)
    monkeypatch.setattr(preflight, "_NEURON_LS", {})
    assert preflight.failures(neuron_node) == []
    (found,) = preflight.image_failures(neuron_node)
    assert found.endswith("found exit 124: timed out after 1 s")
    assert calls.read_text() == "run\n"  # the node-fault and shared-fault checks share one run


def test_a_working_neuron_ls_that_lists_fewer_devices_is_a_node_fault(neuron_node, tmp_path):
    listing = "[" + ",".join(f'{{"neuron_device": {i}, "nc_count": 2}}' for i in range(15)) + "]"
    tool(tmp_path / "bin", "neuron-ls", text_file(tmp_path, "short.json", listing))
    assert preflight.failures(neuron_node) == ["16 Neuron devices listed by neuron-ls, found 15"]


def test_missing_neuron_devices_are_a_node_fault_whatever_neuron_ls_says(neuron_node, tmp_path):
    (Path(neuron_node["NEURON_DEVICE_DIR"]) / "neuron3").unlink()
    tool(tmp_path / "bin", "neuron-ls", text_file(tmp_path, "err.txt", "error\n"), status=1)
    (found,) = preflight.failures(neuron_node)
    assert found.endswith("found 15")


def test_the_launcher_exits_78_without_a_take_out_for_a_neuron_tool_failure(neuron_node, tmp_path):
    tool(tmp_path / "bin", "neuron-ls", text_file(tmp_path, "err.txt", "nrt_init: failed\n"), status=1)
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_BATCH_", "MASTER_", "NPROC_"))}
    env |= neuron_node | {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "NODE_STATE_DIR": str(state)}
    env |= {"PREFLIGHT_PYTHON": sys.executable, "AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_NODE_INDEX": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "1"}
    done = subprocess.run(
        [str(ROOT / "container" / "distributed_run.sh"), "t.py"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 78, done.stderr
    assert "a working neuron-ls --json-output with all 16 Neuron devices present" in done.stderr
    assert not (state / "take-out").exists()


def test_a_driver_older_than_the_gpu_needs_is_refused(gpu_node):
    # The H100 node's real /proc/driver/nvidia/version: driver 580.159.04.
    node = {**gpu_node, "NVIDIA_DRIVER_VERSION_FILE": fixture("proc-driver-nvidia-version.txt")}
    # B300's minimum (config/catalog.py) is met; a newer one is not, and the line names both.
    assert preflight.image_failures({**node, "MIN_NVIDIA_DRIVER": "580.95.05"}) == []
    (found,) = preflight.image_failures({**node, "MIN_NVIDIA_DRIVER": "590.1"})
    assert found.startswith("an NVIDIA driver of at least 590.1, found: ") and "580.159.04" in found
    # No minimum set: the driver is not read at all.
    assert preflight.image_failures({**gpu_node, "NVIDIA_DRIVER_VERSION_FILE": "/nonexistent"}) == []


# What PyTorch prints when its build lacks the GPU's architecture, in the form users report it for
# Blackwell GPUs with PyTorch builds older than CUDA 12.8 (not captured on a node here).
NO_KERNEL_IMAGE = (
    ("UserWarning: NVIDIA B200 with CUDA capability sm_100 is not compatible with the current PyTorch installation.\n")
    + """Traceback (most recent call last):
  File "<string>", line 1, in <module>
RuntimeError: CUDA error: no kernel image is available for execution on the device
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""
)


def test_a_pytorch_without_this_gpus_architecture_is_refused(gpu_node, tmp_path):
    python = tmp_path / "bin" / "trainer-python"
    python.write_text(f"#!/bin/sh\ncat <<'EOF' >&2\n{NO_KERNEL_IMAGE}EOF\nexit 1\n")
    python.chmod(0o755)
    node = {**gpu_node, "EXPECT_TORCH_CUDA": "1", "PYTHON": str(python)}
    (found,) = preflight.image_failures(node)
    assert found == (
        "a CUDA kernel from the image's PyTorch on GPU 0, found exit 1: "
        "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    )
    # A PyTorch that runs the probe passes; the probe is what the interpreter is asked to run.
    python.write_text('#!/bin/sh\ncase "$2" in *get_device_capability*) echo "sm_90 2.5.1 12.4";; *) exit 3;; esac\n')
    assert preflight.image_failures(node) == []
    assert preflight.image_failures({**node, "EXPECT_TORCH_CUDA": "0", "PYTHON": "/nonexistent"}) == []


def test_what_every_node_of_the_fleet_shares_exits_78_and_a_node_fault_75(gpu_node, tmp_path, capsys):
    # An old driver (the fleet's AMI) or an image without this GPU's kernels: no retry helps.
    old_driver = {**gpu_node, "NVIDIA_DRIVER_VERSION_FILE": fixture("proc-driver-nvidia-version.txt")}
    old_driver["MIN_NVIDIA_DRIVER"] = "590.1"
    assert preflight.main(old_driver) == preflight.IMAGE_EXIT == 78
    assert "expected an NVIDIA driver of at least 590.1" in capsys.readouterr().err
    # With a node fault as well, the node fault decides (retried) and is the line.
    assert preflight.main({**old_driver, "EXPECTED_GPUS": "8"}) == preflight.PREFLIGHT_EXIT == 75
    assert "expected 8 GPUs" in capsys.readouterr().err


def test_a_fault_the_boot_check_found_fleet_wide_refuses_the_job_with_78_naming_it(gpu_node, tmp_path, capsys):
    state = {**gpu_node, "NODE_STATE_DIR": str(tmp_path)}
    assert preflight.main(state) == 0
    (tmp_path / "shared-fault").write_text("libnvidia-ml.so.1 missing from the AMI (ldconfig -p)\n")
    # Even on a node that also lacks GPUs: the shared fault explains it, and no retry can help.
    assert preflight.main({**state, "EXPECTED_GPUS": "8"}) == preflight.IMAGE_EXIT == 78
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("preflight failed on ") and "libnvidia-ml.so.1 missing from the AMI" in line
    assert len(line) < 300


def test_every_failure_lands_in_one_list(gpu_node, tmp_path):
    env = {**gpu_node, "EFA_DEVICE_DIR": str(tmp_path / "none"), "EXPECTED_GPUS": "8"}
    assert len(preflight.failures(env)) == 2


@pytest.mark.parametrize(
    "name",
    [
        "EFA_DEVICES",
        "EXPECTED_GPUS",
        "EXPECTED_NEURON_DEVICES",
        "EXPECT_VULKAN",
        "MIN_NVIDIA_DRIVER",
        "EXPECT_TORCH_CUDA",
    ],
)
def test_malformed_expectations_are_usage_errors(name, capsys):
    assert preflight.main({name: "four"}) == preflight.USAGE_EXIT
    assert f"{name}='four'" in capsys.readouterr().err


def test_inside_an_ecs_task_the_socket_interface_is_eth0(gpu_node):
    env = {**gpu_node, "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/abc"}
    assert preflight.socket_interface(env) == "eth0"


def test_elsewhere_the_default_route_decides(gpu_node, tmp_path):
    assert preflight.socket_interface(gpu_node) == "ens5"
    only_docker = text_file(tmp_path, "docker", ROUTES.format(iface="docker0"))
    assert preflight.socket_interface({"PROC_NET_ROUTE": only_docker}) is None
    assert preflight.socket_interface({"PROC_NET_ROUTE": str(tmp_path / "no-proc")}) is None


def test_a_route_that_is_down_does_not_count():
    table = ROUTES.format(iface="ens5").replace("\t0003\t", "\t0002\t")
    assert preflight.default_route_interface(table) is None


# The launcher around it: one subprocess each.
LAUNCHER = ROOT / "container" / "distributed_run.sh"
PROBE = '#!/bin/sh\necho "ARGS: $*"\necho "NCCL=${NCCL_SOCKET_IFNAME:-unset} GLOO=${GLOO_SOCKET_IFNAME:-unset}"\n'


def launch(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe.sh"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "NODE_STATE_DIR")}
    base = {**keep, "PYTHON": str(probe), "PREFLIGHT_PYTHON": sys.executable, "NPROC_PER_NODE": "1"}
    # Node 1 tells the main node of its failure; none listens on this free port, so one try.
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        base["NODE_REPORT_PORT"] = str(probe_socket.getsockname()[1])
    base["NODE_REPORT_SECONDS"] = "0"
    batch = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1", "MASTER_ADDR": "127.0.0.1"}
    return subprocess.run(
        [str(LAUNCHER), "train.py"], env={**base, **batch, **env}, capture_output=True, text=True, timeout=60
    )


def test_a_failed_preflight_exits_75_with_one_line_and_starts_nothing(gpu_node, tmp_path):
    result = launch(tmp_path, {**gpu_node, "EXPECTED_GPUS": "8"})
    assert result.returncode == preflight.PREFLIGHT_EXIT == 75
    assert "ARGS:" not in result.stdout
    line, *rest = result.stderr.strip().splitlines()
    assert len(rest) == 1 and rest[0].startswith("node_fault.py: could not tell the main node 127.0.0.1:")
    assert line.startswith("preflight failed on node 1 (")
    assert line.endswith("expected 8 GPUs (nvidia-smi --list-gpus), found 4")


def test_launcher_pins_eth0_only_inside_ecs(gpu_node, tmp_path):
    outside = launch(tmp_path, gpu_node)
    assert outside.returncode == 0, outside.stderr
    assert "NCCL=ens5 GLOO=ens5" in outside.stdout
    inside = launch(tmp_path, {**gpu_node, "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/abc"})
    assert "NCCL=eth0 GLOO=eth0" in inside.stdout


def test_a_chatty_interpreter_wrapper_does_not_become_the_interface(gpu_node, tmp_path):
    # Isaac Sim's python.sh may print before the script runs; only preflight.py's own line counts.
    wrapper = tmp_path / "python.sh"
    wrapper.write_text(f'#!/bin/sh\necho "[Info] setting up the environment"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    result = launch(tmp_path, {**gpu_node, "PREFLIGHT_PYTHON": str(wrapper)})
    assert result.returncode == 0, result.stderr
    assert "NCCL=ens5 GLOO=ens5" in result.stdout
