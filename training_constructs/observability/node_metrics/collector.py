#!/usr/bin/env python3
"""Node metrics of a training instance, sent every minute to the local CloudWatch agent.

- EFA: the hardware counters under /sys/class/infiniband/<device>/ports/<port>/hw_counters (names from
  the Linux EFA driver, drivers/infiniband/hw/efa/efa_com_cmd.h), summed over the node's devices and
  ports, as per-minute increases.
- GPU nodes (--gpu): NVIDIA Xid errors, counted from `NVRM: Xid` lines of the kernel log, and the
  power drawn by all GPUs from `nvidia-smi --query-gpu=power.draw` (the CloudWatch agent's nvidia_gpu
  input does not find power in the XML that current drivers write).
- A heartbeat of 1, so that a dashboard can count the nodes of a fleet.
- GPU nodes, meanwhile: every Xid that needs a GPU reset or a new node goes, as it appears in the kernel
  log (`dmesg --follow`), to <state dir>/xid-faults as "<epoch> <code> <line>". The job container reads
  it through the mounted /var/lib/training-node when its trainer dies (container/launcher/node_fault.py): a
  container cannot read the host's kernel log.

Each value goes out as a StatsD line with a Fleet tag to the agent's StatsD listener; the agent adds
the InstanceId dimension and publishes in the TrainingPlatform namespace (CloudWatch agent guide,
"Retrieve custom metrics with StatsD": DogStatsD-style `#key:value` tags become dimensions).

Runs on the host's own python3 (Amazon Linux 2023 ships 3.9), standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

# hw_counters file -> metric name (config/metrics.py EFA_COUNTER_METRICS; a test keeps them equal).
EFA_COUNTERS = {
    "tx_bytes": "EfaTxBytes",
    "rx_bytes": "EfaRxBytes",
    "rdma_read_bytes": "EfaRdmaReadBytes",
    "rdma_write_bytes": "EfaRdmaWriteBytes",
    "retrans_pkts": "EfaRetransmittedPackets",
    "retrans_timeout_events": "EfaRetransmitTimeouts",
    "rx_drops": "EfaRxDrops",
    "unresponsive_remote_events": "EfaUnresponsiveRemoteEvents",
    "impaired_remote_conn_events": "EfaImpairedRemoteConnections",
}
XID_ERRORS = "GpuXidErrors"
GPU_POWER = "GpuPowerDrawWatts"
NODE_HEARTBEAT = "NodeHeartbeat"
FLEET_DIMENSION = "Fleet"
SYSFS_INFINIBAND = Path("/sys/class/infiniband")
STATE_DIR = Path("/var/lib/training-node")
XID_FAULTS = "xid-faults"
DMESG = "/usr/bin/dmesg"
NVIDIA_SMI = "/usr/bin/nvidia-smi"
# The driver logs every Xid as "NVRM: Xid (PCI:<bus id>): <code>, ..." (NVIDIA Xid errors guide).
XID_LINE = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")
# Xids whose immediate action in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid
# Errors with the Xid Catalog", column "Resolution Bucket (Immediate Action)") is a GPU reset or a node
# reboot, not an application restart: 48 double-bit ECC, 64 row-remapping failure, 74 NVLink, 79 fallen
# off the bus, 95 uncontained ECC, 119 and 120 GSP timeout and error, 140 unrecovered ECC, 154 recovery
# action changed (reset or reboot). Others (13, 31, 43, 45, 94) leave the trainer's status alone.
NODE_FAULT_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120, 140, 154})


def read_efa_counters(root: Path) -> dict[str, int] | None:
    """Every counter summed over all devices and ports; None when the node has no EFA device."""
    port_dirs = sorted(root.glob("*/ports/*/hw_counters"))
    if not port_dirs:
        return None
    totals = dict.fromkeys(EFA_COUNTERS, 0)
    for counters in port_dirs:
        for name in EFA_COUNTERS:
            try:
                totals[name] += int((counters / name).read_text().strip())
            except (OSError, ValueError):
                continue  # a counter this device generation does not have (RDMA write, SRD stats)
    return totals


def xid_code(line: str) -> int | None:
    match = XID_LINE.search(line)
    return int(match.group(1)) if match else None


def count_xid_lines(kernel_log: str) -> int:
    return sum(1 for line in kernel_log.splitlines() if XID_LINE.search(line))


def append_shared(path: Path) -> int:
    """`path` opened for appending in the folder jobs share with the host (every job container mounts it
    read-write), never through a link a job may have put there: one is removed (unlink(2) never follows a
    link), and O_NOFOLLOW refuses one planted since (open(2), ELOOP). O_NONBLOCK: a FIFO without a reader fails
    at once (ENXIO) instead of blocking the host. boot_check.py's write_shared keeps the same rule."""
    if os.path.islink(path):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)


def record_node_faults(state_dir: Path, lines: Iterable[str], now: float | None = None) -> int:
    """Append the Xids among `lines` that need a GPU reset or a new node to <state_dir>/xid-faults."""
    faults = [(xid_code(line), line.strip()) for line in lines if xid_code(line) in NODE_FAULT_XIDS]
    if faults:
        stamp = time.time() if now is None else now
        with os.fdopen(append_shared(state_dir / XID_FAULTS), "a") as out:
            out.writelines(f"{stamp:.3f} {code} {line}\n" for code, line in faults)
    return len(faults)


KERNEL_TIME = re.compile(r"^\[\s*(\d+\.\d+)\]")


def line_time(line: str, boot: float) -> float | None:
    """When the kernel logged `line` ("[ 1234.567890] ...": seconds since boot), as wall-clock time."""
    found = KERNEL_TIME.match(line)
    return boot + float(found.group(1)) if found else None


def follow_kernel_log(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    # `dmesg --follow` prints the whole ring buffer first: each line keeps the time the kernel logged
    # it, so a restarted collector does not make an old Xid look like one of this run's.
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    with subprocess.Popen([DMESG, "--follow"], stdout=subprocess.PIPE, text=True, errors="replace") as dmesg:  # noqa: S603
        for line in dmesg.stdout or ():
            try:
                record_node_faults(state_dir, [line], now=line_time(line, boot))
            except OSError as error:  # what a job put in the shared folder (append_shared): said, not fatal
                print(f"collector: {error}", file=sys.stderr)
    # dmesg ended: without it no Xid is recorded, so end the collector and let systemd restart it.
    print("collector: dmesg ended", file=sys.stderr)
    os._exit(1)


def total_power_watts(query_output: str) -> float | None:
    """Sum of `nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits` lines; None when no
    GPU reported a number ([N/A], or nvidia-smi failed)."""
    watts = []
    for line in query_output.splitlines():
        try:
            watts.append(float(line.strip()))
        except ValueError:
            continue
    return sum(watts) if watts else None


def increases(before: Mapping[str, int], now: Mapping[str, int]) -> dict[str, int]:
    """Per-counter increase; a counter that went down was reset (driver reload) and counts from 0."""
    return {name: value - before[name] if value >= before.get(name, 0) else value for name, value in now.items()}


def statsd_lines(fleet: str, counts: Mapping[str, int], gauges: Mapping[str, float]) -> list[str]:
    tag = f"|#{FLEET_DIMENSION}:{fleet}"
    return [f"{name}:{value}|c{tag}" for name, value in counts.items()] + [
        f"{name}:{value:g}|g{tag}" for name, value in gauges.items()
    ]


def run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)  # noqa: S603 (fixed argv)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def kernel_log() -> str:
    return run([DMESG])


def gpu_power_query() -> str:
    return run([NVIDIA_SMI, "--query-gpu=power.draw", "--format=csv,noheader,nounits"])


class Collector:
    def __init__(self, *, fleet: str, sysfs: Path, gpu: bool) -> None:
        self.fleet = fleet
        self.sysfs = sysfs
        self.gpu = gpu
        self.efa_before = read_efa_counters(sysfs)
        self.xid_before = count_xid_lines(kernel_log()) if gpu else 0
        if self.efa_before is None:
            print(f"training-node-metrics: no EFA device under {sysfs}; EFA metrics stay empty", file=sys.stderr)

    def sample(self) -> list[str]:
        counts: dict[str, int] = {}
        efa_now = read_efa_counters(self.sysfs)
        if efa_now is not None:
            grown = increases(self.efa_before or {}, efa_now)
            counts.update({EFA_COUNTERS[name]: value for name, value in grown.items()})
            self.efa_before = efa_now
        gauges: dict[str, float] = {NODE_HEARTBEAT: 1}
        if self.gpu:
            xid_now = count_xid_lines(kernel_log())
            # The kernel ring buffer can wrap: a lower count means old lines left, not fewer errors.
            counts[XID_ERRORS] = max(0, xid_now - self.xid_before)
            self.xid_before = xid_now
            power = total_power_watts(gpu_power_query())
            if power is not None:
                gauges[GPU_POWER] = power
        return statsd_lines(self.fleet, counts, gauges)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--gpu", action="store_true", help="NVIDIA Xid errors and GPU power (GPU nodes)")
    parser.add_argument("--sysfs", type=Path, default=SYSFS_INFINIBAND)
    parser.add_argument("--statsd", default="127.0.0.1:8125")
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--samples", type=int, default=0, help="stop after this many samples (0: never)")
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR, help="where node-fault Xids go (GPU nodes)")
    args = parser.parse_args(argv)
    if args.gpu:
        threading.Thread(target=follow_kernel_log, args=(args.state_dir,), daemon=True).start()
    host, port = args.statsd.rsplit(":", 1)
    collector = Collector(fleet=args.fleet, sysfs=args.sysfs, gpu=args.gpu)
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while args.samples == 0 or sent < args.samples:
            time.sleep(args.interval)
            lines = collector.sample()
            sock.sendto("\n".join(lines).encode(), (host, int(port)))
            sent += 1


if __name__ == "__main__":
    main()
