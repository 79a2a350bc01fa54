"""Simulated instances for a rehearsal. Each host has its own loopback address (127.0.0.x, so that no node
reaches another through "localhost"), its own state folder (what the boot check, the launcher's take-out
marker and the Xid collector share with the container: NODE_STATE_DIR), and the devices its instance type
has, as files and tools the preflight reads: uverbs files for EFA and `fi_info`, `nvidia-smi` listing the
GPUs, /dev/neuron* files and `neuron-ls`, and `hostname` answering the host's own name and address.

A host outlives attempts, as a warm instance does: a retry lands on the same hosts unless one was taken
out. A host whose take-out marker appears is powered off TAKE_OUT_GRACE_SECONDS later (what the host's
unit does: training_constructs/health/node_recovery.py) and replaced by a fresh one.
"""

from __future__ import annotations

import itertools
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

# training_constructs/health/node_recovery.py TAKE_OUT_GRACE_SECONDS (a test keeps the two equal).
TAKE_OUT_GRACE_SECONDS = 10.0
# container/launcher/node_fault.py XID_FAULTS, TAKE_OUT; container/launcher/preflight.py's shared-fault file.
XID_FAULTS = "xid-faults"
TAKE_OUT = "take-out"
SHARED_FAULT = "shared-fault"
# 127.0.0.1 is left to what listens on "localhost"; hosts take 127.0.0.2 and up.
FIRST_ADDRESS = 2
MAX_ADDRESS = 254


@dataclass(frozen=True)
class Devices:
    """What an instance has, as the preflight counts it (the job definition's expectations)."""

    efa: int = 0
    gpus: int = 0
    neuron: int = 0


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


class Host:
    def __init__(self, root: Path, number: int, address: str, devices: Devices) -> None:
        self.number = number
        self.address = address
        self.instance_id = f"i-{secrets.token_hex(8)}"
        self.name = f"ip-{address.replace('.', '-')}"
        self.folder = root / f"host-{number}"
        self.state_dir = self.folder / "state"
        self.bin_dir = self.folder / "bin"
        self.efa_dir = self.folder / "dev" / "infiniband"
        self.neuron_dir = self.folder / "dev"
        self.slow_tools_file = self.folder / "slow-tools"
        self.broken_tools_file = self.folder / "broken-tools"
        for folder in (self.state_dir, self.bin_dir, self.efa_dir):
            folder.mkdir(parents=True, exist_ok=True)
        # What the boot check writes for the jobs (their containers cannot reach IMDS): id and AZ.
        self.availability_zone = "rehearsal-1a"
        (self.state_dir / "instance").write_text(f"{self.instance_id} {self.availability_zone}\n")
        for n in range(devices.efa):
            (self.efa_dir / f"uverbs{n}").touch()
        for n in range(devices.neuron):
            (self.neuron_dir / f"neuron{n}").touch()
        self.taken_out_at: float | None = None
        self.take_out_reason = ""
        self.powered_off = False
        self._tools(devices)

    def _tools(self, devices: Devices) -> None:
        # Every tool waits as long as slow-tools says: a slow preflight (GPU fleets take minutes).
        wait = f'[ -s "{self.slow_tools_file}" ] && sleep "$(cat "{self.slow_tools_file}")"\n'
        # neuron-ls fails while broken-tools exists: the Neuron runtime's tool, not the devices.
        broken = (
            f'[ -e "{self.broken_tools_file}" ] && {{ echo "neuron-ls: rehearsal: the tool fails" >&2; exit 1; }}\n'
        )
        _script(
            self.bin_dir / "hostname",
            f'case "$1" in -I) echo "{self.address} ";; *) echo "{self.name}";; esac\n',
        )
        _script(self.bin_dir / "fi_info", wait + 'echo "provider: efa"\necho "    fabric: efa"\n')
        if devices.gpus:
            listing = "".join(
                f"GPU {n}: Rehearsal GPU (UUID: GPU-{self.number:04d}-{n:04d})\\n" for n in range(devices.gpus)
            )
            gpus_file = self.folder / "gpus"
            gpus_file.write_text(listing.replace("\\n", "\n"))
            _script(self.bin_dir / "nvidia-smi", wait + f'cat "{gpus_file}"\n')
        if devices.neuron:
            _script(
                self.bin_dir / "neuron-ls",
                wait + broken + f'n=$(ls {shlex.quote(str(self.neuron_dir))} | grep -c "^neuron[0-9]*$")\n'
                'printf "["; i=0; while [ $i -lt $n ]; do [ $i -gt 0 ] && printf ","; '
                'printf "{\\"neuron_device\\": %d, \\"nc_count\\": 2}" $i; i=$((i+1)); done; echo "]"\n',
            )

    def env(self) -> dict[str, str]:
        """What the container sees of its host: the state folder and the device paths."""
        return {
            "NODE_STATE_DIR": str(self.state_dir),
            "EFA_DEVICE_DIR": str(self.efa_dir),
            "NEURON_DEVICE_DIR": str(self.neuron_dir),
        }

    def take_out_marker(self) -> str | None:
        try:
            return (self.state_dir / TAKE_OUT).read_text(errors="replace").strip()
        except OSError:
            return None

    def lose_device(self) -> str:
        """Take one device away (the first EFA interface, else a GPU or a Neuron device): a node fault."""
        efa = sorted(self.efa_dir.glob("uverbs*"))
        if efa:
            efa[-1].unlink()
            return f"EFA device {efa[-1].name}"
        gpus = self.folder / "gpus"
        if gpus.exists():
            lines = gpus.read_text().splitlines()
            gpus.write_text("".join(line + "\n" for line in lines[:-1]))
            return "one GPU"
        neuron = sorted(self.neuron_dir.glob("neuron[0-9]*"))
        if neuron:
            neuron[-1].unlink()
            return f"Neuron device {neuron[-1].name}"
        return "nothing (this host has no devices)"

    def record_xid(self, when: float, code: int) -> None:
        """An Xid as the host's collector writes it: "<epoch> <code> <kernel line>"."""
        line = f"{when:.3f} {code} NVRM: Xid (PCI:0000:{self.number:02x}:00): {code}, rehearsal fault\n"
        with (self.state_dir / XID_FAULTS).open("a") as out:
            out.write(line)

    def break_neuron_tool(self) -> None:
        self.broken_tools_file.touch()

    def slow_tools(self, seconds: float) -> None:
        self.slow_tools_file.write_text(f"{seconds:g}\n")

    def describe(self) -> str:
        return f"host {self.number} ({self.instance_id}, {self.address})"


class HostPool:
    """The fleet's instances for one rehearsal: warm hosts are reused; a taken-out host never again."""

    def __init__(self, root: Path, devices: Devices) -> None:
        self.root = root
        self.devices = devices
        self.hosts: list[Host] = []
        self.last: dict[int, Host] = {}
        self._numbers = itertools.count()

    def _new(self) -> Host:
        number = next(self._numbers)
        if FIRST_ADDRESS + number > MAX_ADDRESS:
            raise RuntimeError("a rehearsal ran out of loopback addresses for fresh hosts")
        host = Host(self.root, number, f"127.0.0.{FIRST_ADDRESS + number}", self.devices)
        self.hosts.append(host)
        return host

    def place(self, nodes: int) -> list[Host]:
        """Hosts for `nodes` nodes: each node the host it had last time while that host is still in the
        fleet, else a warm host nobody took, else a fresh one (which node lands where on a retry is not
        documented; keeping it is the simplest reading)."""
        usable = [h for h in self.hosts if h.taken_out_at is None and not h.powered_off]
        chosen: list[Host | None] = [self.last.get(i) if self.last.get(i) in usable else None for i in range(nodes)]
        spare = [h for h in usable if h not in chosen]
        for i in range(nodes):
            if chosen[i] is None:
                chosen[i] = spare.pop(0) if spare else self._new()
        placed = [h for h in chosen if h is not None]
        self.last = dict(enumerate(placed))
        return placed
