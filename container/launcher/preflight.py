"""The launcher's per-node preflight, and its choice of socket interface. Called by distributed_run.sh.

    preflight.py     # prints socket_interface=NAME for NCCL and gloo (or nothing), checks the node

Checks, each only when its variable asks for it:
  EFA_DEVICES=N              at least N uverbs devices in EFA_DEVICE_DIR (default /dev/infiniband), and
                             libfabric's EFA provider listed by `fi_info -p efa`
  EXPECTED_GPUS=N            at least N GPUs in `nvidia-smi --list-gpus`
  EXPECT_TORCH_CUDA=1        the training interpreter's PyTorch (PYTHON, else python3) runs a kernel on
                             GPU 0: an image whose PyTorch was built without this GPU's architecture
                             (Blackwell needs CUDA 12.8 builds) fails here, not in the first step
  EXPECT_VULKAN=1            NVIDIA_DRIVER_CAPABILITIES includes graphics (or all), and a Vulkan GPU is
                             visible: `vulkaninfo --summary` lists a GPU device, or, without vulkaninfo,
                             an NVIDIA Vulkan ICD file exists in VULKAN_ICD_DIRS
  EFA_DEVICES=N (N > 0) with EXPECT_TORCH_CUDA=1 (NVIDIA fleets with EFA), unless NCCL_EFA_PROOF=0:
                             one single-rank NCCL communicator from the image's PyTorch, with NCCL_DEBUG=INFO,
                             is on the aws-ofi-nccl plugin with libfabric's efa provider on at least N NICs
                             (nccl_proof.py beside this file judges its INFO lines)
  MIN_NVIDIA_DRIVER=V        the host's NVIDIA driver (NVIDIA_DRIVER_VERSION_FILE, default
                             /proc/driver/nvidia/version) is V or newer: driver_check.py beside this file
  EXPECTED_NEURON_DEVICES=N  at least N /dev/neuron* devices in NEURON_DEVICE_DIR (default /dev), and
                             `neuron-ls --json-output` (the Neuron driver and runtime tools) lists N;
                             with every device present, a neuron-ls that fails or times out is a
                             shared fault (78), never a node fault
Always: an Xid needing a GPU reset (NVIDIA's Xid catalog) that the host recorded in
NODE_STATE_DIR/xid-faults since it booted fails the node (a node fault); a file
NODE_STATE_DIR/shared-fault (default /var/lib/training-node, the host's directory the job definitions
mount), written by the host's boot check for a fault every node of the fleet shares, fails the node
with IMAGE_EXIT, naming the cause it holds.
A failed check prints ONE line to stderr, naming the node, what was expected and what was found, and
exits PREFLIGHT_EXIT (75; the job definitions retry it, and the launcher takes the node out) when a
device count falls short (NCCL's count of EFA NICs included), or IMAGE_EXIT (78; not retried, no node
taken out) when only software failed that every node of the fleet shares: the EFA provider, Vulkan, the
Neuron tools (neuron-ls missing, or failing with every Neuron device present), the driver version, the
image's PyTorch, NCCL off the aws-ofi-nccl plugin (no plugin, a socket fallback). A malformed
variable exits 2. Stdlib only; runs on Python 3.10.

Socket interface: inside an ECS task in awsvpc mode (AWS Batch multi-node jobs), `eth0` is the task
ENI, and ecs-eth0 (the ECS credentials bridge) is unreachable from peers (NVIDIA/nccl#859). ECS sets
ECS_CONTAINER_METADATA_URI_V4 in every container it starts (ECS developer guide, "Task metadata
endpoint version 4"). Elsewhere (Slurm, a workstation) interface names differ (AL2023 names them ens5,
enp*s0: amazon-linux-2023#111), so the interface of the IPv4 default route is used, read from
PROC_NET_ROUTE (default /proc/net/route); lo and docker* never qualify. None found: nothing is printed
and NCCL keeps its own choice, which skips lo and docker* (NCCL environment variables,
NCCL_SOCKET_IFNAME).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# EX_TEMPFAIL (sysexits.h): "temporary failure, the user is invited to retry". The job definitions'
# retry strategy retries this code; every other non-zero exit is the application's.
PREFLIGHT_EXIT = 75
# EX_CONFIG (sysexits.h): the fleet's AMI or image cannot train on this GPU. Not retried: every node
# of the fleet would fail the same way.
IMAGE_EXIT = 78
USAGE_EXIT = 2
NVIDIA_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
# NVIDIA's .run installer writes nvidia_icd.json; its RPM packaging, which the ECS AL2023 GPU AMI's
# driver comes from, writes nvidia_icd.<arch>.json (NVIDIA/yum-packaging-nvidia-driver nvidia-driver.spec;
# NVIDIA/nvidia-container-toolkit internal/discover/graphics.go looks for both). Any NVIDIA name counts;
# the boot check (training_constructs/health/node_scripts/boot_check.py) uses the same pattern.
NVIDIA_ICD_PATTERN = "nvidia_icd*.json"
COMMAND_TIMEOUT_SECONDS = 60
TORCH_PROBE_SECONDS = 300
# The node's state directory, shared with its host (training_constructs/health/node_recovery.py mounts it).
NODE_STATE_DIR = "/var/lib/training-node"
XID_FAULTS = "xid-faults"
# fi_info lives here in images built with the EFA installer, which may not be on PATH.
EFA_BIN = "/opt/amazon/efa/bin"


class Malformed(ValueError):
    """A variable the preflight cannot read."""


def _count(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "")
    if raw == "":
        return None
    if not re.fullmatch(r"[0-9]+", raw):
        raise Malformed(f"{name}='{raw}' is not a non-negative integer")
    return int(raw)


def _run(command: Sequence[str], environ: Mapping[str, str], timeout: int | None = None) -> tuple[int, str] | None:
    """Exit status and output of a command found on PATH (or the EFA bin dir); None when absent."""
    timeout = timeout or COMMAND_TIMEOUT_SECONDS
    path = environ.get("PATH", os.defpath) + os.pathsep + EFA_BIN
    tool = shutil.which(command[0], path=path)
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, *command[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(environ),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"
    return done.returncode, done.stdout + done.stderr


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def check_efa(environ: Mapping[str, str], expected: int) -> list[str]:
    directory = Path(environ.get("EFA_DEVICE_DIR", "/dev/infiniband"))
    found = len(list(directory.glob("uverbs*"))) if directory.is_dir() else 0
    if found < expected:
        return [f"{expected} EFA devices (uverbs*) in {directory}, found {found}"]
    return []


def check_efa_provider(environ: Mapping[str, str], expected: int) -> list[str]:
    if expected == 0:
        return []
    result = _run(["fi_info", "-p", "efa"], environ)
    if result is None:
        return ["libfabric's EFA provider (fi_info -p efa), found no fi_info (libfabric missing from the image)"]
    status, output = result
    if status != 0 or not re.search(r"provider:\s*efa\b", output):
        return [f"libfabric's EFA provider (fi_info -p efa), found exit {status}: {_last_line(output)}"]
    return []


def check_gpus(environ: Mapping[str, str], expected: int) -> list[str]:
    result = _run(["nvidia-smi", "--list-gpus"], environ)
    found = 0 if result is None else len(re.findall(r"^GPU \d+:", result[1], flags=re.MULTILINE))
    return [] if found >= expected else [f"{expected} GPUs (nvidia-smi --list-gpus), found {found}"]


def check_vulkan(environ: Mapping[str, str]) -> list[str]:
    # Isaac Sim needs the driver's graphics userspace, which the NVIDIA container toolkit injects only
    # for the graphics (or all) capability (isaac-sim/IsaacSim#357: "Failed to create any GPU devices").
    capabilities = {c.strip() for c in environ.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",")}
    if not capabilities & {"graphics", "all"}:
        given = environ.get("NVIDIA_DRIVER_CAPABILITIES", "unset")
        return [f"NVIDIA_DRIVER_CAPABILITIES with graphics (Vulkan for Isaac Sim), found {given}"]
    result = _run(["vulkaninfo", "--summary"], environ)
    if result is not None:
        status, output = result
        if status == 0 and re.search(r"deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(DISCRETE|INTEGRATED)_GPU", output):
            return []
        return [f"a Vulkan GPU (vulkaninfo --summary), found exit {status}: {_last_line(output)}"]
    dirs = environ.get("VULKAN_ICD_DIRS", os.pathsep.join(NVIDIA_ICD_DIRS)).split(os.pathsep)
    if any(icd.is_file() for d in dirs for icd in Path(d).glob(NVIDIA_ICD_PATTERN)):
        return []
    return [f"the NVIDIA Vulkan ICD ({NVIDIA_ICD_PATTERN}) in {' or '.join(dirs)}, found none"]


def _neuron_devices(environ: Mapping[str, str]) -> tuple[Path, int]:
    directory = Path(environ.get("NEURON_DEVICE_DIR", "/dev"))
    return directory, len([p for p in directory.glob("neuron*") if re.fullmatch(r"neuron\d+", p.name)])


def _neuron_listing(environ: Mapping[str, str]) -> tuple[int, str, int | None] | None:
    """`neuron-ls --json-output`: exit status, output, and the devices it lists (None when it failed, timed
    out or printed no JSON list); None when the image has no neuron-ls. Run once per preflight: a hung
    tool costs its timeout once."""
    key = (environ.get("PATH", ""), "neuron-ls")
    if key not in _NEURON_LS:
        result = _run(["neuron-ls", "--json-output"], environ)
        listed: int | None = None
        if result is not None and result[0] == 0:
            try:
                listed = len(json.loads(result[1][result[1].index("[") :]))
            except ValueError:
                listed = None
        _NEURON_LS[key] = None if result is None else (result[0], result[1], listed)
    return _NEURON_LS[key]


_NEURON_LS: dict[tuple[str, str], tuple[int, str, int | None] | None] = {}


def check_neuron(environ: Mapping[str, str], expected: int) -> list[str]:
    """A node fault: fewer /dev/neuron* devices than expected, or a working neuron-ls listing fewer."""
    directory, found = _neuron_devices(environ)
    if found < expected:
        return [f"{expected} Neuron devices (/dev/neuron*) in {directory}, found {found}"]
    listing = _neuron_listing(environ)
    if listing is not None and listing[2] is not None and listing[2] < expected:
        return [f"{expected} Neuron devices listed by neuron-ls, found {listing[2]}"]
    return []


def check_neuron_tools(environ: Mapping[str, str]) -> list[str]:
    """A shared fault: with every device present, a neuron-ls that is missing, fails or times out says the
    image's Neuron tools (or what they need, such as instance metadata) are broken, as on every node of
    the fleet; taking this node out would only repeat it on the next one."""
    listing = _neuron_listing(environ)
    if listing is None:
        return ["the Neuron tools (neuron-ls), found none in the image"]
    status, output, listed = listing
    if listed is None:
        _, found = _neuron_devices(environ)
        return [f"a working neuron-ls --json-output with all {found} Neuron devices present, found exit {status}: "
                f"{_last_line(output)}"]  # fmt: skip
    return []


# One kernel launch and a copy back: "no kernel image is available for execution on the device" is
# how CUDA reports a GPU architecture the PyTorch build lacks (CUDA runtime API, cudaErrorNoKernelImageForDevice).
TORCH_CUDA_PROBE = (
    "import torch; major, minor = torch.cuda.get_device_capability(0); "
    "assert (torch.ones(2, device='cuda') * 2).sum().item() == 4.0; "
    "print(f'sm_{major}{minor}', torch.__version__, torch.version.cuda)"
)


def check_torch_cuda(environ: Mapping[str, str]) -> list[str]:
    # Its own, longer limit: Isaac Sim's python.sh sets up its environment, then torch and CUDA start.
    result = _run([environ.get("PYTHON") or "python3", "-c", TORCH_CUDA_PROBE], environ, TORCH_PROBE_SECONDS)
    if result is None:
        return [f"a CUDA kernel from PyTorch ({environ.get('PYTHON') or 'python3'}), found no such interpreter"]
    status, output = result
    if status != 0:
        # PyTorch follows the CUDA error with hints (CUDA_LAUNCH_BLOCKING, ...): report the error.
        errors = [line.strip() for line in output.splitlines() if re.search(r"Error\b|error:", line)]
        found = errors[-1][:200] if errors else _last_line(output)
        return [f"a CUDA kernel from the image's PyTorch on GPU 0, found exit {status}: {found}"]
    return []


def check_driver(environ: Mapping[str, str], minimum: str) -> list[str]:
    # driver_check.py sits beside this file in the NVIDIA images (config/catalog.py has the minimums).
    spec = importlib.util.spec_from_file_location("driver_check", Path(__file__).with_name("driver_check.py"))
    if spec is None or spec.loader is None:
        return [f"driver_check.py beside preflight.py for MIN_NVIDIA_DRIVER={minimum}, found none"]
    driver_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver_check)
    path = environ.get("NVIDIA_DRIVER_VERSION_FILE", driver_check.PROC_VERSION)
    try:
        problem: str | None = driver_check.check(minimum, path)
    except ValueError as error:
        raise Malformed(f"MIN_NVIDIA_DRIVER='{minimum}' is not a driver version") from error
    return [f"an NVIDIA driver of at least {minimum}, found: {problem}"] if problem else []


def _nccl_proof() -> Any:
    """nccl_proof.py beside this file (registered before it runs: its dataclasses look their module up)."""
    if "nccl_proof" not in sys.modules:
        spec = importlib.util.spec_from_file_location("nccl_proof", Path(__file__).with_name("nccl_proof.py"))
        if spec is None or spec.loader is None:
            raise FileNotFoundError("nccl_proof.py")
        sys.modules["nccl_proof"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["nccl_proof"])
    return sys.modules["nccl_proof"]


def nccl_wanted(environ: Mapping[str, str]) -> bool:
    proof = environ.get("NCCL_EFA_PROOF", "")
    if proof not in ("", "0", "1"):
        raise Malformed(f"NCCL_EFA_PROOF='{proof}' is not 0 or 1")
    return proof != "0" and (_count(environ, "EFA_DEVICES") or 0) > 0 and environ.get("EXPECT_TORCH_CUDA") == "1"


def check_nccl(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(node faults, shared faults) that NCCL's own INFO lines show at a single-rank communicator's start:
    fewer EFA NICs than EFA_DEVICES is this node's; no plugin, another network (Socket, IB) or another
    libfabric provider is the image's or the AMI's, the same on every node. Lines that decide nothing
    (none printed, a probe that died before NCCL chose its network) fail nothing: a note says so."""
    proof = _nccl_proof()
    python = environ.get("PYTHON") or "python3"
    result = _run([python, "-c", proof.PROBE], proof.probe_environment(environ), TORCH_PROBE_SECONDS)
    output = "" if result is None else result[1]
    init = proof.read_init(output.splitlines())
    verdict = proof.judge(init, _count(environ, "EFA_DEVICES") or 0)
    if verdict is None:
        ran = f"{python} exited {result[0]}" if result is not None else f"no interpreter {python}"
        print(f"preflight: NCCL on EFA: no fault seen ({ran}): {proof.summary(init)}", file=sys.stderr)
        return [], []
    return ([verdict.line()], []) if verdict.kind == proof.NODE else ([], [verdict.line()])


def xid_records(directory: Path, since: float) -> list[str]:
    """The lines ("<code> <kernel line>") of NODE_STATE_DIR/xid-faults stamped at or after `since` (epoch
    seconds). The host's node collector (training_constructs/observability/node_metrics/collector.py)
    writes there only the Xids NVIDIA's Xid catalog answers with a GPU reset or a node reboot, each stamped
    with the time the kernel logged it."""
    try:
        text = (directory / XID_FAULTS).read_text(errors="replace")
    except OSError:
        return []
    found = []
    for entry in text.splitlines():
        stamp, _, rest = entry.partition(" ")
        try:
            if float(stamp) >= since:
                found.append(rest.strip())
        except ValueError:
            continue
    return found


def boot_time(environ: Mapping[str, str]) -> float:
    """When the host booted (epoch seconds): a container reads the host kernel's /proc/uptime."""
    uptime = Path(environ.get("PROC_UPTIME", "/proc/uptime")).read_text().split()[0]
    return time.time() - float(uptime)


def check_reset_xids(environ: Mapping[str, str]) -> list[str]:
    """A node fault: the host recorded an Xid needing a GPU reset since it booted. A node that Batch stopped
    may not have judged itself; the GPU keeps the fault until the node reboots, so the next job here fails."""
    try:
        since = boot_time(environ)
    except (OSError, ValueError, IndexError):
        return []
    directory = Path(environ.get("NODE_STATE_DIR") or NODE_STATE_DIR)
    xids = xid_records(directory, since)
    return [f"no NVIDIA Xid needing a GPU reset since boot, found {len(xids)}: {xids[-1][:160]}"] if xids else []


def failures(environ: Mapping[str, str]) -> list[str]:
    """The devices this node lacks, each as 'expected ..., found ...' text; empty when it has them all.
    A node fault: another node may have them (exit 75, retried, and the node is taken out)."""
    found: list[str] = check_reset_xids(environ)
    efa = _count(environ, "EFA_DEVICES")
    gpus = _count(environ, "EXPECTED_GPUS")
    neuron = _count(environ, "EXPECTED_NEURON_DEVICES")
    if efa is not None:
        found += check_efa(environ, efa)
    if gpus is not None:
        found += check_gpus(environ, gpus)
    if neuron is not None:
        found += check_neuron(environ, neuron)
    return found


def image_failures(environ: Mapping[str, str]) -> list[str]:
    """What no retry can fix, because every node of the fleet has it: software the image or the AMI
    lacks (libfabric's EFA provider, the Vulkan userspace Isaac Sim needs, the Neuron tools; the boot
    check counts these as shared faults too), a host driver older than the GPU needs, an image whose
    PyTorch cannot run a kernel on the GPU. Exit 78: not retried, and no node is taken out for it."""
    torch_cuda = environ.get("EXPECT_TORCH_CUDA", "")
    if torch_cuda not in ("", "0", "1"):
        raise Malformed(f"EXPECT_TORCH_CUDA='{torch_cuda}' is not 0 or 1")
    vulkan = environ.get("EXPECT_VULKAN", "")
    if vulkan not in ("", "0", "1"):
        raise Malformed(f"EXPECT_VULKAN='{vulkan}' is not 0 or 1")
    found: list[str] = []
    efa = _count(environ, "EFA_DEVICES")
    if efa is not None:
        found += check_efa_provider(environ, efa)
    if vulkan == "1":
        found += check_vulkan(environ)
    if _count(environ, "EXPECTED_NEURON_DEVICES") is not None:
        # After failures(): a tool failure counts as shared only with every device present.
        found += check_neuron_tools(environ)
    if environ.get("MIN_NVIDIA_DRIVER"):
        found += check_driver(environ, environ["MIN_NVIDIA_DRIVER"])
    # After the driver check: an old driver explains a failed kernel better than the kernel does.
    if torch_cuda == "1" and not found:
        found += check_torch_cuda(environ)
    return found


def default_route_interface(route_table: str) -> str | None:
    """The interface of the IPv4 default route in /proc/net/route text, skipping lo and docker*."""
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[1] != "00000000":
            continue
        name, flags = fields[0], int(fields[3], 16)
        if flags & 0x1 and name != "lo" and not name.startswith("docker"):  # RTF_UP
            return name
    return None


def socket_interface(environ: Mapping[str, str]) -> str | None:
    if environ.get("ECS_CONTAINER_METADATA_URI_V4"):
        return "eth0"
    try:
        table = Path(environ.get("PROC_NET_ROUTE", "/proc/net/route")).read_text()
    except OSError:
        return None
    return default_route_interface(table)


def node_name(environ: Mapping[str, str]) -> str:
    index = environ.get("AWS_BATCH_JOB_NODE_INDEX")
    host = socket.gethostname()
    return f"node {index} ({host})" if index else host


def shared_fault(environ: Mapping[str, str]) -> str | None:
    """The cause the host's boot check wrote to NODE_STATE_DIR/shared-fault (a fault every node of the
    fleet shares, such as a library the AMI lacks); None when there is no such file."""
    path = Path(environ.get("NODE_STATE_DIR") or NODE_STATE_DIR, "shared-fault")
    try:
        cause = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        cause = f"unreadable ({error.strerror})"
    return _last_line(cause) if cause else "no cause written"


def main(environ: Mapping[str, str]) -> int:
    shared = shared_fault(environ)
    if shared is not None:
        print(
            f"preflight failed on {node_name(environ)}: the boot check found a fault every node of this fleet "
            f"shares: {shared}; not retried (fix the fleet's AMI or launch template)",
            file=sys.stderr,
        )
        return IMAGE_EXIT
    try:
        missing = failures(environ)
        # Only on an otherwise sound node: the PyTorch probe takes seconds, and a node fault comes first.
        unfixable = [] if missing else image_failures(environ)
        if not missing and not unfixable and nccl_wanted(environ):
            # Last: it needs a working PyTorch on the GPU, and a device short already explains a short NIC count.
            missing, unfixable = check_nccl(environ)
    except Malformed as error:
        print(f"preflight.py: {error}", file=sys.stderr)
        return USAGE_EXIT
    interface = socket_interface(environ)
    if interface:
        print(f"socket_interface={interface}")
    if missing or unfixable:
        print(
            f"preflight failed on {node_name(environ)}: expected " + "; expected ".join(missing or unfixable),
            file=sys.stderr,
        )
        return PREFLIGHT_EXIT if missing else IMAGE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(os.environ))
