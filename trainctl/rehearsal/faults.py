"""What a rehearsal can break, and when: `--fault KIND[:NODE][=VALUE][@TRIGGER]`.

Triggers: `start` (attempt 1 starts; the default), `attempt:K` (attempt K starts), `seconds:S` (S seconds
after the job's first attempt started), `checkpoint:K` (K checkpoints of the job's lineage are listed in the
local S3, whichever node saved them: a file directly in the checkpoint folder once per save of it, a
folder there once). Each fault happens once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.errors import TrainctlError

# kind -> (what it does, whose node it hits by default: "child" = the first child, "main", or None).
KINDS: dict[str, tuple[str, str | None]] = {
    "kill-child": ("SIGKILL every process of a child's container (it exits 137)", "child"),
    "kill-main": ("SIGKILL every process of the main node's container (it exits 137)", "main"),
    "lose-host": (
        "the node's instance is terminated: no exit code, reason 'Host EC2 (instance ...) terminated.'",
        "child",
    ),
    "stop-rank": ("SIGSTOP the node's training ranks: a hang", "child"),
    "preflight-fail": ("the node's host loses a device: its next preflight fails", "child"),
    "never-start": (
        "the node's container never runs (CannotPullContainerError) in the attempt it names; the main node's: "
        "no child starts either",
        "child",
    ),
    "xid": ("the node's host records a reset-class NVIDIA Xid (VALUE: the code, default 79)", "child"),
    "kill-upload": ("the instance of the node that uploads the next checkpoint file is lost mid-upload", None),
    "s3-slowdown": ("the local S3 answers 503 SlowDown for VALUE seconds (default 20)", None),
    "capacity-cancel": (
        "the job's next retry finds no capacity: the queue cancels it and the capacity fallback resubmits it",
        None,
    ),
    "slow-preflight": ("the node's device tools answer after VALUE seconds (default 20): a slow preflight", "main"),
    "neuron-tool-fail": ("the node's neuron-ls fails (exit 1) while its Neuron devices are present", "child"),
    "stall-rank": (
        "one training rank of the node sleeps in its own code (runnable, not stopped, silent) while its peers "
        "wait in the next collective (the reference script's REHEARSAL_STALL_FILE hook)",
        "child",
    ),
    "batch-lag": (
        "from then on DescribeJobs shows a node job's end VALUE seconds (default 45) after it happened; the job "
        "itself does not lag",
        None,
    ),
    "slow-node": (
        "the node's training ranks are stopped (SIGSTOP, then SIGCONT) for the share VALUE (default 0.5) of every "
        "100 ms from then on: a node that trains at half speed or slower",
        "child",
    ),
    "cancel": ("the user cancels the running job (`trainctl cancel`: TerminateJob): FAILED, not retried", None),
    "budget-stop": ("the team's budget is spent: the budget enforcement terminates the job, not retried", None),
}
# Faults that act on the job itself (TerminateJob), each with the reason it gives.
TERMINATING = ("cancel", "budget-stop")
TRIGGERS = ("start", "attempt:K", "seconds:S", "checkpoint:K")
_SPEC = re.compile(
    r"^(?P<kind>[a-z0-9-]+)(?::(?P<node>\d+))?(?:=(?P<value>\d+(?:\.\d+)?))?"
    r"(?:@(?P<trigger>start|attempt|seconds|checkpoint)(?::(?P<at>\d+(?:\.\d+)?))?)?$"
)
_VALUE_KINDS = {"xid": 79.0, "s3-slowdown": 20.0, "slow-preflight": 20.0, "batch-lag": 45.0, "slow-node": 0.5}


@dataclass(frozen=True)
class Fault:
    spec: str
    kind: str
    node: int | None  # None: the kind's default node (resolved against the job's nodes)
    value: float | None
    trigger: str  # start, attempt, seconds, checkpoint
    at: float  # the attempt number, seconds or checkpoint count (1 for start)

    def describe(self) -> str:
        return KINDS[self.kind][0]


def parse_fault(spec: str) -> Fault:
    """One --fault value, or one line naming what is wrong and what is allowed."""
    match = _SPEC.match(spec.strip())
    kinds = ", ".join(KINDS)
    if match is None:
        raise TrainctlError(f"--fault {spec!r}: write KIND[:NODE][=VALUE][@TRIGGER], e.g. kill-child@checkpoint:1")
    kind = match["kind"]
    if kind not in KINDS:
        raise TrainctlError(f"--fault {spec!r}: unknown fault {kind!r}; faults: {kinds}"[:200])
    if match["node"] is not None and KINDS[kind][1] is None:
        raise TrainctlError(f"--fault {spec!r}: {kind} hits no single node; drop ':{match['node']}'")
    if match["value"] is not None and kind not in _VALUE_KINDS:
        raise TrainctlError(f"--fault {spec!r}: {kind} takes no =VALUE")
    trigger = match["trigger"] or "start"
    if trigger == "start":
        if match["at"] is not None:
            raise TrainctlError(f"--fault {spec!r}: @start takes no number; triggers: {', '.join(TRIGGERS)}")
        at = 1.0
    else:
        if match["at"] is None:
            raise TrainctlError(f"--fault {spec!r}: @{trigger} needs a number; triggers: {', '.join(TRIGGERS)}")
        at = float(match["at"])
        if trigger in ("attempt", "checkpoint") and (at != int(at) or at < 1):
            raise TrainctlError(f"--fault {spec!r}: @{trigger} counts from 1 in whole numbers")
        if kind == "never-start" and trigger != "attempt":
            raise TrainctlError(f"--fault {spec!r}: never-start names an attempt: @start or @attempt:K")
    if trigger in ("attempt", "start") and kind == "capacity-cancel":
        raise TrainctlError(
            f"--fault {spec!r}: capacity-cancel acts on the job's next retry; give @seconds or @checkpoint"
        )
    value = float(match["value"]) if match["value"] is not None else _VALUE_KINDS.get(kind)
    if kind == "xid" and value is not None and (value != int(value) or value < 1):
        raise TrainctlError(f"--fault {spec!r}: an Xid is a whole number from 1 (the NVIDIA Xid catalog)")
    if kind == "slow-node" and value is not None and not 0 < value < 1:
        raise TrainctlError(f"--fault {spec!r}: slow-node's VALUE is the share of time stopped, above 0 and below 1")
    node = int(match["node"]) if match["node"] is not None else None
    return Fault(spec=spec, kind=kind, node=node, value=value, trigger=trigger, at=at)


def fault_node(fault: Fault, *, nodes: int, main: int) -> int | None:
    """The node index a fault hits, or None for a job-wide fault; refused when the job has no such node."""
    default = KINDS[fault.kind][1]
    if default is None:
        return None
    if fault.node is not None:
        if fault.node >= nodes:
            raise TrainctlError(f"--fault {fault.spec!r}: the job has nodes 0 to {nodes - 1}")
        if fault.kind == "kill-child" and fault.node == main:
            raise TrainctlError(f"--fault {fault.spec!r}: node {main} is the main node; use kill-main")
        if fault.kind == "kill-main" and fault.node != main:
            raise TrainctlError(f"--fault {fault.spec!r}: the main node is node {main}; use kill-child:{fault.node}")
        return fault.node
    if default == "main":
        return main
    children = [n for n in range(nodes) if n != main]
    if not children:
        raise TrainctlError(f"--fault {fault.spec!r} hits a child, and a one-node job has none: pass --nodes 2")
    return children[0]
