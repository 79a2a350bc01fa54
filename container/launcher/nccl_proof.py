"""Proof, from NCCL's own INFO lines, that NCCL runs on the aws-ofi-nccl plugin over every EFA device.

    nccl_proof.py --efa N LOG      # judge a log already written (NCCL_DEBUG=INFO): the benchmark's, a trainer's

The preflight (preflight.py) makes the lines itself: one single-rank NCCL communicator from the image's
PyTorch (PROBE) with NCCL_DEBUG=INFO. NCCL loads and initializes its net plugin for every communicator,
one rank included, and then prints `Using network <name>` (NVIDIA/nccl src/init.cc, commAlloc:
ncclNetInit, then INFO "Using network %s"; src/plugin/net.cc: "Initialized NET plugin %s", "Failed to
initialize NET plugin %s", WARN "Failed to initialize any NET plugin"). aws-ofi-nccl says which libfabric
provider it chose and how many NICs it found while it initializes (aws/aws-ofi-nccl src/nccl_ofi_net.cpp,
nccl_net_ofi_query_provider_capabilities: "NET/OFI Selected provider is %s, fabric is %s (found %d nics)").

The verdict acts only on lines it saw. No NCCL INFO line at all, or none that names the network, decides
nothing: absence is not evidence. Its kinds:
  shared  (exit 78, not retried, no node taken out): NCCL is not on the plugin (not found, failed to
          initialize, another network chosen such as Socket or IB) or the plugin chose a provider other
          than efa: the image or the AMI, the same on every node of the fleet
  node    (exit 75, retried, this node taken out): the plugin found fewer EFA NICs than the type has
          (EFA_DEVICES): this node's devices
Stdlib only; runs on Python 3.10.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SHARED = "shared"
NODE = "node"
# The names aws-ofi-nccl registers its ncclNet_t under: "Libfabric" since 1.12, renamed to "AWS Libfabric" (the
# name up to 1.11, which the job definitions' NCCL_NET asks for) or "OFI" when NCCL_NET names it so
# (aws/aws-ofi-nccl src/nccl_ofi_interface_nvidia.cpp, nvidia_plugin_name_fixup). NCCL compares names
# without case (src/plugin/net.cc, strcasecmp).
PLUGIN_NETWORKS = ("libfabric", "aws libfabric", "ofi")

# `<host>:<pid>:<tid> [<dev>] NCCL INFO <message>` (NVIDIA/nccl src/debug.cc); whatever precedes it (a
# timestamp, torchrun's `[rank0]:`) is ignored.
_NCCL_LINE = re.compile(r"NCCL (INFO|WARN) (.*)$")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^,\s]+).*\(found (\d+) nics?\)")
# NCCL 2.28: "NET/Plugin: Could not find: libnccl-net.so" (real: tests/fixtures/nccl/h100-plugin-missing.txt);
# older releases said "No plugin found (libnccl-net.so), using internal implementation" or "Plugin load
# (libnccl-net.so) returned 2 : ...".
_PLUGIN_ABSENT = re.compile(r"NET/Plugin ?: (Could not find|No plugin found|Plugin load .*returned|dlerror)")
_PLUGIN_FAILED = re.compile(r"Failed to initialize (any NET plugin|NET plugin .+)$")

# One single-rank communicator: an all-reduce makes PyTorch create it (its NCCL communicators are lazy).
PROBE = (
    "import torch, torch.distributed as dist; torch.cuda.set_device(0); "
    "dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1); "
    "t = torch.ones(1, device='cuda'); dist.all_reduce(t); torch.cuda.synchronize(); "
    "dist.destroy_process_group(); print('nccl probe done')"
)


@dataclass(frozen=True)
class NcclInit:
    """What NCCL's INFO and WARN lines said about its network, each as the line's message."""

    messages: int = 0  # NCCL INFO or WARN lines seen
    networks: tuple[str, ...] = ()  # every `Using network X`, in order (one per communicator)
    providers: tuple[tuple[str, int, str], ...] = ()  # (provider, nics, message) per plugin initialization
    plugin_absent: str = ""  # the first message saying the plugin library was not found
    plugin_failed: str = ""  # the first message saying a plugin failed to initialize
    plugin_loaded: bool = False


@dataclass(frozen=True)
class Verdict:
    kind: str  # SHARED or NODE
    expected: str
    found: str

    def line(self) -> str:
        return f"{self.expected}, found {self.found}"


def read_init(lines: Iterable[str]) -> NcclInit:
    messages = 0
    networks: list[str] = []
    providers: list[tuple[str, int, str]] = []
    absent = failed = ""
    loaded = False
    for raw in lines:
        match = _NCCL_LINE.search(raw.rstrip("\r\n"))
        if match is None:
            continue
        messages += 1
        message = match.group(2).strip()
        if network := _NETWORK.match(message):
            networks.append(network.group(1))
        elif provider := _OFI_PROVIDER.search(message):
            providers.append((provider.group(1), int(provider.group(2)), message))
        elif _PLUGIN_ABSENT.search(message):
            absent = absent or message
        elif _PLUGIN_FAILED.search(message):
            failed = failed or message
        elif re.search(r"Successfully loaded external (network )?plugin|NET/Plugin: Loaded net plugin", message):
            loaded = True
    return NcclInit(messages, tuple(networks), tuple(providers), absent, failed, loaded)


def _clip(message: str) -> str:
    return message if len(message) <= 120 else message[:117] + "..."


def judge(init: NcclInit, efa_devices: int) -> Verdict | None:
    """The verdict on a node whose type has `efa_devices` EFA interfaces; None when the lines decide nothing."""
    expected = "NCCL on the aws-ofi-nccl plugin (Using network Libfabric)"
    others = [n for n in init.networks if n.casefold() not in PLUGIN_NETWORKS]
    cause = init.plugin_absent or init.plugin_failed
    if others:
        found = f"'Using network {others[0]}'"
        if others[0].casefold() == "socket":
            found += " (a fallback to TCP sockets)"
        return Verdict(SHARED, expected, found + (f" after '{_clip(cause)}'" if cause else ""))
    if not init.networks:
        # NCCL stopped before choosing a network: only a message that names the plugin's failure decides.
        if (init.plugin_absent and not init.plugin_loaded) or "any NET plugin" in init.plugin_failed:
            return Verdict(SHARED, expected, f"'{_clip(cause)}' and no network")
        return None
    for provider, _, message in init.providers:
        if provider != "efa":
            return Verdict(SHARED, "aws-ofi-nccl on libfabric's efa provider", f"'{_clip(message)}'")
    short = [(nics, message) for _, nics, message in init.providers if nics < efa_devices]
    if short:
        nics, message = min(short)
        return Verdict(NODE, f"NCCL on all {efa_devices} EFA devices (EFA_DEVICES)", f"{nics}: '{_clip(message)}'")
    return None


def summary(init: NcclInit) -> str:
    """What the lines showed when judge() found no fault: a note, never a failure."""
    if init.messages == 0:
        return "no NCCL INFO lines (NCCL_DEBUG=INFO not in effect, or NCCL never initialized)"
    if not init.networks:
        return "no 'Using network' line (NCCL did not reach its network choice)"
    if not init.providers:
        return f"'Using network {init.networks[-1]}' but no 'NET/OFI Selected provider' line to count the NICs"
    nics = min(n for _, n, _ in init.providers)
    return f"'Using network {init.networks[-1]}', libfabric's efa provider on {nics} NICs"


def probe_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The job's environment (its NCCL_NET, FI_*, plugin paths) with NCCL's INIT and NET lines on stdout."""
    env = {k: v for k, v in environ.items() if k not in ("NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS")}
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Judge NCCL's INFO lines: aws-ofi-nccl on every EFA device.")
    parser.add_argument("--efa", type=int, required=True, help="the instance type's EFA device count")
    parser.add_argument("log", type=argparse.FileType("r", errors="replace"))
    args = parser.parse_args(argv)
    init = read_init(args.log)
    verdict = judge(init, args.efa)
    if verdict is None:
        print(f"nccl proof: no fault seen: {summary(init)}")
        return 0
    print(f"nccl proof failed ({verdict.kind} fault): expected {verdict.line()}", file=sys.stderr)
    return 75 if verdict.kind == NODE else 78


if __name__ == "__main__":
    sys.exit(main())
