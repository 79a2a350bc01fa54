"""Node faults for distributed_run.sh: the children tell the main node, and a faulty node asks its host
to take it out of the fleet.

    node_fault.py listen --port P --pid PID --out FILE   # main node: wait for a child's report
    node_fault.py report --address A --port P --code C --line TEXT
    node_fault.py judge --since EPOCH [--xid-only]      # after a failed or stopped trainer: a hardware fault?
    node_fault.py mark --line TEXT                      # ask the host to take this node out

Batch decides a multi-node job by its main node alone: a child that fails ends only itself (Batch user
guide, "Multi-node parallel jobs"). So a child that fails before its rendezvous, or whose trainer dies
on a hardware fault, connects to the main node's address on a side port (MASTER_PORT + 1 unless
NODE_REPORT_PORT is set; Batch gives a multi-node job's task ENIs the compute environment's security
groups, or the VPC's default group when it names none, as these fleets do: that group admits all traffic
from its own members, so the port is open to the job's nodes and nothing outside the group) and sends
one line, "<exit code> <job id> <text>". The main node's listener
ignores other jobs' lines, writes the line to FILE and sends the launcher SIGUSR1; the launcher stops
torchrun and exits 75 (78 when the child's fault is one the whole fleet shares) with the child's line.
A progress watch's hang report ("hang <job> <json>", progress_watch.py) is only recorded (listen
--hangs): the main node's watch decides.

Hardware fault: the trainer exited non-zero while this node shows one of
  - an NVIDIA Xid that needs a GPU reset or a new node, written by the host's node collector
    (training_constructs/observability/node_metrics/collector.py) to $NODE_STATE_DIR/xid-faults as
    "<epoch> <code> <line>";
  - the node checks of preflight.py failing now (fewer GPUs, EFA devices or Neuron devices than the
    job expects, or a working neuron-ls listing fewer); a Neuron tool that fails with every device
    present is the image's fault, shared by the fleet, never this node's.
The take-out marker is $NODE_STATE_DIR/take-out (one line: the reason); the host's path unit
(training_constructs/health/node_recovery.py) drains the node in ECS, stops the agent and powers it
off. With it goes one EMF line for NodesTakenOut (Fleet dimension). Stdlib only, Python 3.10.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cold_start import alive  # beside this file in every image, like checkpoint_commit for checkpoint_sync

NODE_STATE_DIR = "/var/lib/training-node"
TAKE_OUT = "take-out"
SHARED_EXIT = 78
# Repeated from config/metrics.py (a test pins them equal).
NAMESPACE = "TrainingPlatform"
FLEET_DIMENSION = "Fleet"
NODES_TAKEN_OUT = "NodesTakenOut"
FLEET_ENV = "TRAINING_FLEET"
MAX_LINE = 300
REPORT_BYTES = 4096
# The first word of a progress watch's report (progress_watch.py): recorded, not an exit.
HANG_REPORT = "hang"


def state_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("NODE_STATE_DIR") or NODE_STATE_DIR)


def listen(port: int, pid: int, out: Path, job: str, poll: float = 1.0, hangs: Path | None = None) -> int:
    """Wait for one child's report on job `job` while the launcher (`pid`) runs; write it to `out` and
    send the launcher SIGUSR1, on which it stops training. Reports on other jobs are ignored. A child's
    hang report ("hang <job> <json>", progress_watch.py) is appended to `hangs` and the wait goes on: the
    main node's progress watch decides."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))  # noqa: S104 - the children reach the main node on its task ENI
        server.listen(16)
        while alive(pid):
            ready, _, _ = select.select([server], [], [], poll)
            if not ready:
                continue
            connection, _ = server.accept()
            with connection:
                connection.settimeout(5)
                try:
                    text = connection.recv(REPORT_BYTES).decode(errors="replace").strip()
                except OSError:
                    continue
            code, _, rest = text.partition(" ")
            reported_job, _, line = rest.partition(" ")
            if code == HANG_REPORT and reported_job == job and line and hangs is not None:
                with hangs.open("a") as record:
                    record.write(line + "\n")
                continue
            if not code.isdigit() or reported_job != job or not line:
                continue
            deliver(out, pid, int(code), line)
            return 0
    return 0


def deliver(out: Path, pid: int, code: int, line: str) -> bool:
    """Write "<code> <line>" to the launcher's report file `out` and send the launcher (`pid`) SIGUSR1, on
    which it stops and exits for the report. The first report wins: the listener and the node watcher
    (node_watch.py) may both find a fault, and the launcher reads the file once. False if one was there."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{code} {line[:MAX_LINE]}\n")
    try:
        os.link(tmp, out)  # atomic, and never over an existing report
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGUSR1)
    return True


def report(address: str, port: int, code: int, job: str, line: str, within: float) -> bool:
    """Send "<code> <job> <line>" to the main node, retrying the connection for `within` seconds."""
    return send(address, port, f"{code} {job} {line[:MAX_LINE]}", within)


def send(address: str, port: int, text: str, within: float) -> bool:
    """Send one line (at most the listener's 4096 bytes) to the main node, retrying for `within` seconds."""
    deadline = time.monotonic() + within
    payload = (text[: REPORT_BYTES - 1] + "\n").encode()
    while True:
        try:
            with socket.create_connection((address, port), timeout=5) as connection:
                connection.sendall(payload)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _preflight() -> Any:
    """preflight.py beside this file, loaded fresh: the node checks and the Xid record's reader."""
    spec = importlib.util.spec_from_file_location("preflight", Path(__file__).with_name("preflight.py"))
    if spec is None or spec.loader is None:
        raise ImportError("preflight.py beside node_fault.py")
    preflight = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preflight)
    return preflight


def xid_faults(directory: Path, since: float) -> list[str]:
    """The Xid lines the host's watcher recorded at or after `since` (epoch seconds)."""
    found: list[str] = _preflight().xid_records(directory, since)
    return found


def _preflight_failures(environ: Mapping[str, str]) -> list[str]:
    preflight = _preflight()
    # The device checks only: Vulkan and the image do not break during a run.
    checked = {k: v for k, v in environ.items() if k != "EXPECT_VULKAN"}
    try:
        found: list[str] = preflight.failures(checked)
    except ValueError:
        return []
    return found


def judge(environ: Mapping[str, str], since: float, settle: float, devices: bool = True) -> str | None:
    """A hardware fault on this node, as text; None when the node looks healthy. Waits up to `settle`
    seconds for the host's Xid watcher, which follows the kernel log. devices=False: the Xid record only,
    which cannot hang (a stopped node has ECS's 30 s before SIGKILL; a GPU off the bus can hang nvidia-smi)."""
    directory = state_dir(environ)
    deadline = time.monotonic() + settle
    while True:
        xids = xid_faults(directory, since)
        if xids:
            return f"NVIDIA Xid needing a GPU reset or a new node: {xids[-1][:200]}"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if not devices:
        return None
    missing = _preflight_failures(environ)
    if missing:
        return "expected " + "; expected ".join(missing)
    return None


def emf_line(fleet: str, node: str, reason: str) -> str:
    """NodesTakenOut as an embedded-metric-format line (CloudWatch user guide, "Specification: Embedded
    metric format")."""
    document = {
        "_aws": {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {"Namespace": NAMESPACE, "Dimensions": [[FLEET_DIMENSION]], "Metrics": [{"Name": NODES_TAKEN_OUT}]}
            ],
        },
        FLEET_DIMENSION: fleet,
        NODES_TAKEN_OUT: 1,
        "Node": node,
        "Reason": reason[:MAX_LINE],
    }
    return json.dumps(document, separators=(",", ":"))


def mark(environ: Mapping[str, str], line: str) -> Path:
    """Write the take-out marker for the host and print the metric line."""
    directory = state_dir(environ)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / TAKE_OUT
    tmp = directory / f".{TAKE_OUT}.tmp"
    tmp.write_text(line[:MAX_LINE] + "\n")
    tmp.replace(marker)
    node = environ.get("AWS_BATCH_JOB_NODE_INDEX", "0")
    print(emf_line(environ.get(FLEET_ENV, "unknown"), node, line), flush=True)
    return marker


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("listen")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--hangs", type=Path, help="where children's hang reports are appended")
    p = commands.add_parser("report")
    p.add_argument("--address", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--code", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--line", required=True)
    p.add_argument("--within", type=float, default=30.0)
    p = commands.add_parser("judge")
    p.add_argument("--since", type=float, required=True)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--xid-only", action="store_true", help="judge by the host's Xid record alone")
    p = commands.add_parser("mark")
    p.add_argument("--line", required=True)
    args = parser.parse_args(argv)
    if args.command == "listen":
        return listen(args.port, args.pid, args.out, args.job, hangs=args.hangs)
    if args.command == "report":
        if not report(args.address, args.port, args.code, args.job, args.line, args.within):
            print(f"node_fault.py: could not tell the main node {args.address}:{args.port}", file=sys.stderr)
        return 0
    if args.command == "judge":
        fault = judge(environ, args.since, args.settle, devices=not args.xid_only)
        if fault:
            print(fault)
        return 0
    mark(environ, args.line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
