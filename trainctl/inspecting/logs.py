"""Every node's log stream of a multi-node job, interleaved in time, each line marked with its node."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainctl.aws import aws_errors
from trainctl.errors import TrainctlError
from trainctl.jobs import describe_jobs, node_job_id


@dataclass(frozen=True, order=True)
class LogLine:
    # Milliseconds since the epoch, as CloudWatch Logs stamps events; ties keep node order.
    timestamp: int
    node: int
    message: str

    def render(self) -> str:
        return f"[n{self.node}] {self.message}"


def parse_nodes(spec: str, nodes: int) -> list[int]:
    """`all` or a comma-separated list of node indexes, each below the job's node count."""
    if spec == "all":
        return list(range(nodes))
    chosen: list[int] = []
    for part in spec.split(","):
        if not part.strip().isdecimal() or not part.strip().isascii() or int(part) >= nodes:
            raise TrainctlError(f"--node {spec!r}: give 'all' or node indexes 0..{nodes - 1} separated by commas")
        chosen.append(int(part))
    return sorted(set(chosen))


@dataclass(frozen=True)
class NodeStream:
    node: int
    group: str
    # None while the node has not started (no container, no stream yet).
    stream: str | None


def node_streams(batch: Any, job: dict[str, Any], nodes: Sequence[int], default_group: str) -> list[NodeStream]:
    """Where each node logs: the node job's own stream, in the group its log configuration names."""
    job_id = str(job["jobId"])
    if "nodeProperties" not in job:
        container = job.get("container", {})
        return [NodeStream(0, _group(container, default_group), container.get("logStreamName"))]
    by_id = {str(j["jobId"]): j for j in describe_jobs(batch, [node_job_id(job_id, n) for n in nodes])}
    streams = []
    for node in nodes:
        container = by_id.get(node_job_id(job_id, node), {}).get("container", {})
        streams.append(NodeStream(node, _group(container, default_group), container.get("logStreamName")))
    return streams


def _group(container: dict[str, Any], default_group: str) -> str:
    options = container.get("logConfiguration", {}).get("options", {})
    return str(options.get("awslogs-group", default_group))


class StreamReader:
    """Reads a stream forward from its start; each call returns only what is new since the last."""

    def __init__(self, logs: Any, source: NodeStream) -> None:
        self._logs = logs
        self.source = source
        self._token: str | None = None

    def read(self) -> list[LogLine]:
        if self.source.stream is None:
            return []
        lines: list[LogLine] = []
        while True:
            request: dict[str, Any] = {
                "logGroupName": self.source.group,
                "logStreamName": self.source.stream,
                "startFromHead": True,
            }
            if self._token:
                request["nextToken"] = self._token
            with aws_errors():
                response = self._logs.get_log_events(**request)
            events = response.get("events", [])
            lines += [LogLine(int(e["timestamp"]), self.source.node, str(e["message"]).rstrip("\n")) for e in events]
            token = response.get("nextForwardToken")
            # A page may be partly full or empty with more events behind it; the end is a forward token
            # equal to the one passed in (CloudWatch Logs API Reference, GetLogEvents).
            done = token == self._token
            self._token = token
            if done:
                return lines


def interleave(per_node: Iterable[Sequence[LogLine]]) -> list[LogLine]:
    """One time-ordered list from each node's own (already ordered) lines."""
    return list(heapq.merge(*per_node))
