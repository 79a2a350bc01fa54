"""Node faults for distributed_run.sh: the children tell the main node, and a faulty node asks its host
to take it out of the fleet.

    node_fault.py listen --port P --pid PID --out FILE --children DIR   # main node: the children's words
    node_fault.py beat --address A --port P --job J --node N --pid PID  # child: "alive" while PID runs
    node_fault.py report --address A --port P --job J --node N --code C --line TEXT [--rank R ...]
    node_fault.py judge --since EPOCH [--xid-only]      # after a failed or stopped trainer: a hardware fault?
    node_fault.py mark --line TEXT                      # ask the host to take this node out

Batch decides a multi-node job by its main node alone: a child that fails ends only itself (Batch user
guide, "Multi-node parallel jobs"). So every child talks to the main node's listener on a side port
(MASTER_PORT + 1 unless NODE_REPORT_PORT is set; Batch gives a multi-node job's task ENIs the compute
environment's security groups, or the VPC's default group when it names none, as these fleets do: that
group admits all traffic from its own members, so the port is open to the job's nodes and nothing
outside the group). One line per connection:

  alive <job> <node>          every ALIVE_SECONDS from the child's start (`beat`): it is there
  end <job> <json>            the child's ending: {"node", "code", "line", "rank", "when", "error"};
                              code 0 when its trainer succeeded, 75 a node fault, 78 a fault the fleet
                              shares, 2 bad input, else its trainer's own status (an application error)
  hang <job> <json>           a progress watch's hang report (progress_watch.py): only recorded
  pace <job> <json>           a straggler watch's window (straggler_watch.py): {"node", "ranks", ...}, kept
                              in CHILDREN/node-<n>.pace
  saved <job> <json>          the child's checkpoint copier finished an upload: {"node", "at"}, kept in
                              CHILDREN/node-<n>.saved

The listener answers a line with CHILDREN/node-<n>.order when the straggler watch wrote one for the node the
line speaks for; `beat` reads the answer and acts on it (a child's keepalive is its next line within 5 s).

The listener ignores other jobs' lines and keeps each child's latest word in CHILDREN/node-<n> (the
ending, JSON) and CHILDREN/node-<n>.alive (its mtime: the last keepalive). It reads connections side by
side, each given a few seconds, and on Batch takes a line only from the address Batch gives the node it
speaks for (report_listener.py). A failing ending is also
written to the launcher's report file FILE and the launcher gets SIGUSR1: it stops training and judges
the ending from every child's word (ending.py after_failure).

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
from report_listener import WAITING_LINES, Connections, Line, Senders, speaker

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
# The first word of each kind of line a child sends.
HANG_REPORT = "hang"  # a progress watch's report (progress_watch.py): recorded, not an exit
ALIVE = "alive"
END = "end"
PACE, SAVED = "pace", "saved"  # straggler_watch.py's lines
ORDER = "straggler"  # straggler_watch.ORDER: an answer that tells a child it is the straggler to replace
# How often a child says it is there; the main node counts a child silent for ending.LOST_SECONDS as lost.
ALIVE_SECONDS = 5.0
ANSWER_SECONDS = 3.0  # the listener answers as it reads the line; it reads each connection within 2 s


def state_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("NODE_STATE_DIR") or NODE_STATE_DIR)


def listen(
    port: int, pid: int, out: Path, job: str, poll: float = 1.0, hangs: Path | None = None,
    children: Path | None = None, verify: bool = False,
) -> int:  # fmt: skip
    """Take the children's lines on job `job` while the launcher (`pid`) runs: keepalives and endings
    into `children`, hang reports appended to `hangs`; a failing ending also into `out`, with SIGUSR1 to
    the launcher, on which it stops training. Lines on other jobs are ignored. With `verify` (on Batch, where
    the node watch writes the children's addresses into `children`), a line is taken only from the address
    of the node it speaks for (report_listener.py)."""
    if children is not None:
        children.mkdir(parents=True, exist_ok=True)
    senders = Senders(children, job) if verify and children is not None else None
    waiting: list[Line] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))  # noqa: S104 - the children reach the main node on its task ENI
        server.listen(64)
        connections = Connections(server, reply=(lambda text: order_for(children, text, job)) if children else None)
        try:
            while alive(pid):
                ready, _, _ = select.select(connections.sockets(), [], [], poll)
                now = time.monotonic()
                waiting += connections.read(ready, now)
                still = []
                for line in waiting:
                    verdict = senders.judge(line) if senders is not None else "take"
                    if verdict == "take":
                        try:
                            take(line.text, job=job, out=out, pid=pid, hangs=hangs, children=children, at=line.at)
                        except Exception as error:
                            print(f"node_fault.py: a line from {line.peer} not taken: {error!r:.120}", file=sys.stderr)
                    elif verdict == "wait":
                        still.append(line)
                waiting = still[-WAITING_LINES:]
        finally:
            connections.close()
    return 0


def order_for(children: Path, text: str, job: str) -> bytes:
    """The answer to a line of job `job`: the straggler watch's order for the node it speaks for, or nothing.
    An order is no secret: it only asks the node that is told to end its own attempt."""
    node = speaker(text, job)
    if node is None:
        return b""
    try:
        return (children / f"node-{node}.order").read_bytes()[:REPORT_BYTES]
    except OSError:
        return b""


def take(
    text: str, *, job: str, out: Path, pid: int, hangs: Path | None, children: Path | None, at: float | None = None
) -> None:
    """One line from a child (see the module's docstring), which arrived `at` (epoch seconds; now if None)."""
    kind, _, rest = text.partition(" ")
    reported_job, _, payload = rest.partition(" ")
    if reported_job != job or not payload:
        return
    if kind == HANG_REPORT and hangs is not None:
        with hangs.open("a") as record:
            record.write(payload + "\n")
    elif kind == ALIVE and children is not None and payload.isdigit():
        mark = children / f"node-{int(payload)}.alive"
        mark.touch()
        if at is not None:  # a line that waited for its sender's address counts from when it came
            os.utime(mark, (at, at))
    elif kind in (PACE, SAVED) and children is not None:
        node = speaker(text, job)  # the node the sender check judged the line by, and no other
        if node is None:
            return
        tmp = children / f".node-{node}.{kind}.tmp"
        tmp.write_text(payload + "\n")
        tmp.replace(children / f"node-{node}.{kind}")
    elif kind == END:
        node = speaker(text, job)
        try:
            ending = json.loads(payload)
            code, line = int(ending["code"]), str(ending["line"])
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
            return
        if node is None:
            return
        if children is not None:
            tmp = children / f".node-{node}.tmp"
            tmp.write_text(json.dumps(ending) + "\n")
            tmp.replace(children / f"node-{node}")
        if code != 0:
            deliver(out, pid, code, line)


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


def report(address: str, port: int, job: str, ending: Mapping[str, Any], within: float) -> bool:
    """Send a child's ending ("end <job> <json>") to the main node, retrying for `within` seconds."""
    fields = {**ending, "line": str(ending.get("line", ""))[:MAX_LINE]}
    return bool(send(address, port, f"{END} {job} {json.dumps(fields, separators=(',', ':'))}", within))


def beat(
    address: str, port: int, job: str, node: int, pid: int, every: float = ALIVE_SECONDS, order: Path | None = None
) -> int:
    """Say "alive" to the main node every `every` seconds while the launcher `pid` runs. An answer that names
    this node the straggler to replace (straggler_watch.py) goes to `order`, once, and the launcher gets
    SIGUSR1: it stops its trainer and ends as a node fault (failure_phase.py)."""
    while alive(pid):
        answer = send(address, port, f"{ALIVE} {job} {node}", within=0, answer=True)
        if order is not None and isinstance(answer, str) and answer.startswith(ORDER + " ") and not order.exists():
            tmp = order.with_name(f".{order.name}.tmp")
            tmp.write_text(answer[len(ORDER) + 1 :][:MAX_LINE] + "\n")
            tmp.replace(order)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + every
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


def send(address: str, port: int, text: str, within: float, answer: bool = False) -> bool | str:
    """Send one line (at most the listener's 4096 bytes) to the main node, retrying for `within` seconds; with
    `answer`, the listener's answer's first line ("" for none) instead of True."""
    deadline = time.monotonic() + within
    payload = (text[: REPORT_BYTES - 1] + "\n").encode()
    while True:
        try:
            with socket.create_connection((address, port), timeout=5) as connection:
                connection.sendall(payload)
                if answer:
                    return _answer(connection)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _answer(connection: socket.socket) -> str:
    """What the listener wrote back before it closed the connection (it closes at once when it has nothing)."""
    connection.settimeout(ANSWER_SECONDS)
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < REPORT_BYTES and b"\n" not in data:
            chunk = connection.recv(REPORT_BYTES)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").split("\n", 1)[0].strip()


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
    p.add_argument("--children", type=Path, help="where each child's latest word is kept")
    p.add_argument("--verify-senders", action="store_true", help="take a line only from its node's address")
    p = commands.add_parser("beat")
    p.add_argument("--address", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--every", type=float, default=ALIVE_SECONDS)
    p.add_argument("--order", type=Path, help="where an order to end as the straggler goes (the launcher's)")
    p = commands.add_parser("report")
    p.add_argument("--address", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--code", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--line", required=True)
    p.add_argument("--rank", type=int)
    p.add_argument("--when", default="")
    p.add_argument("--error", default="")
    p.add_argument("--within", type=float, default=30.0)
    p = commands.add_parser("judge")
    p.add_argument("--since", type=float, required=True)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--xid-only", action="store_true", help="judge by the host's Xid record alone")
    p = commands.add_parser("mark")
    p.add_argument("--line", required=True)
    args = parser.parse_args(argv)
    if args.command == "listen":
        verify = args.verify_senders
        return listen(args.port, args.pid, args.out, args.job, hangs=args.hangs, children=args.children, verify=verify)
    if args.command == "beat":
        return beat(args.address, args.port, args.job, args.node, args.pid, args.every, args.order)
    if args.command == "report":
        ending = {"node": args.node, "code": args.code, "line": args.line, "rank": args.rank}
        ending |= {"when": args.when, "error": args.error}
        if not report(args.address, args.port, args.job, ending, args.within):
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
