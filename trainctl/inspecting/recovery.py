"""The story of every attempt of a job: when it ran, how it ended, which node failed and what it found,
and how long Batch took to resume it on fresh nodes.

A job's attempts (DescribeJobs `attempts`) hold each attempt's start, stop, exit code and log stream,
and a retried job keeps its job id (Batch user guide, "Automated job retries"). The node that failed
and what it found is the launcher's line in the main node's log of that attempt
(container/launcher/ending.py): "distributed_run.sh: node N (host): ...", or "node N: Batch says ..." when
the main node's watcher (container/launcher/node_watch.py) saw the child fail in Batch, which `node_line` picks out
of the lines a caller read (`tail` below). A hang's line (container/launcher/progress_watch.py) reads "node N (host):
hang: ...; rank R on node N stopped first (...); stacks at s3://.../evidence/<job id>/attempt-A/; ...": the story
tells it as a hang and prints where the stacks are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

# container/launcher/preflight.py PREFLIGHT_EXIT and IMAGE_EXIT; the launcher's node-fault exit is 75 too.
NODE_FAULT_EXIT = 75
SHARED_FAULT_EXIT = 78
# container/launcher/progress_watch.py HANG_EXIT: a hang seen again after its retry.
HANG_EXIT = 124
# The launcher's line for a node fault: a child's report on the main node, or its own hardware fault; a hang.
NODE_LINE = re.compile(r"distributed_run\.sh: (node \d+(?: \([^)]*\))?: .*)")
HANG_LINE = re.compile(r"^node \d+ \([^)]*\): hang: .*?; stacks (?:at|in) (?P<where>[^;]*)")
ENDINGS = {
    0: "the main node finished its work",
    # 128 + SIGKILL: the kernel's out-of-memory killer, or a stop that outlived its grace.
    137: "the main node was killed (SIGKILL: out of memory, or a stop past its grace; not retried)",
    NODE_FAULT_EXIT: "a node fault or a lost node (retried on fresh nodes)",
    SHARED_FAULT_EXIT: "a fault every node of the fleet shares (not retried)",
    HANG_EXIT: "a hang again after its retry (not retried)",
    1: "the application failed (not retried)",
}
# container/launcher/ending.py TAKEN_OUT: a node's line says so when it wrote its take-out marker.
TAKEN_OUT = "this node asks its host to take it out"
# A first hang is retried with the node-fault code; only a hardware sign takes a node out.
HANG_RETRIED = "a hang (retried once on fresh nodes; a node is taken out only with a hardware sign)"

# (log group, log stream) -> the stream's last lines.
Tail = Callable[[str, str], Sequence[str]]


def node_line(lines: Sequence[str]) -> str | None:
    """The last node-fault line among `lines`, without the launcher's name and its closing advice."""
    found = None
    for line in lines:
        match = NODE_LINE.search(line)
        if match:
            found = match.group(1).split("; ending this job with exit")[0].split("; exiting 75")[0]
    return found


def _when(milliseconds: int) -> str:
    return datetime.fromtimestamp(milliseconds / 1000, UTC).strftime("%H:%M:%S UTC")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def log_group(job: dict[str, Any]) -> str | None:
    """The log group the job's containers write to (its job definition's awslogs options)."""
    containers = [job.get("container", {})]
    containers += [r.get("container", {}) for r in job.get("nodeProperties", {}).get("nodeRangeProperties", [])]
    for container in containers:
        group = container.get("logConfiguration", {}).get("options", {}).get("awslogs-group")
        if group:
            return str(group)
    return None


def attempt_story(job: dict[str, Any], tail: Tail | None = None) -> list[str]:
    """One line per attempt, oldest first; empty when the job has not run yet."""
    attempts: list[dict[str, Any]] = list(job.get("attempts", []))
    group = log_group(job)
    lines = []
    for number, attempt in enumerate(attempts, start=1):
        container = attempt.get("container", {})
        started, stopped = attempt.get("startedAt"), attempt.get("stoppedAt")
        parts = [f"attempt {number} of {len(attempts)}"]
        if started and stopped:
            parts.append(f"ran {_when(int(started))} to {_when(int(stopped))}")
        code = container.get("exitCode")
        reason = str(attempt.get("statusReason") or container.get("reason") or "")
        stream = container.get("logStreamName")
        found = None
        # The launcher's line names the node and quotes what failed: a node fault's, a hang's, or an
        # application error's (the first rank that failed and its error; a SIGKILL leaves no line).
        if code not in (None, 0) and stream and tail and group:
            found = node_line(tail(group, str(stream)))
        hang = HANG_LINE.match(found) if found else None
        if code is not None:
            ending = HANG_RETRIED if hang and code == NODE_FAULT_EXIT else ENDINGS.get(int(code), "the trainer failed")
            if code == 137 and found:
                # The main node's launcher lived to say it: a child was killed, not the main node.
                ending = "a node was killed (SIGKILL: out of memory; the application's, not retried)"
            parts.append(f"exit {code}: {ending}")
        if reason:
            parts.append(f"Batch says: {reason}")
        if reason.startswith("Host EC2"):
            parts.append("its instance was lost (retried on fresh nodes)")
        if found:
            parts.append(found.replace(f"; {TAKEN_OUT}", ""))
            if TAKEN_OUT in found:
                parts.append("the node asked its host to take it out")
        elif code in (NODE_FAULT_EXIT, SHARED_FAULT_EXIT, HANG_EXIT) and stream:
            parts.append(f"the main node's log stream {stream} names the node and what it found")
        if hang:
            parts.append(f"evidence: {hang.group('where').strip()}")
        if number < len(attempts) and stopped:
            resumed = attempts[number].get("startedAt")
            if resumed:
                parts.append(f"resumed {_duration((int(resumed) - int(stopped)) / 1000)} later on fresh nodes")
        lines.append("; ".join(parts))
    return lines


def log_tail(logs: Any, lines: int = 50) -> Tail:
    """A Tail that reads a stream's last `lines` events (GetLogEvents with startFromHead false returns
    the newest events first page; CloudWatch Logs API Reference, GetLogEvents)."""

    def read(group: str, stream: str) -> list[str]:
        try:
            response = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=False, limit=lines)
        except Exception:
            return []
        return [str(event.get("message", "")) for event in response.get("events", [])]

    return read
