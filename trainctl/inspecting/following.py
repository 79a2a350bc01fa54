"""Following a job's logs until it ends, as `logs -f` and `submit`/`run --follow` do: every node's stream from
its start, a node that starts late once it has a stream, and after a retry each node's next attempt (a new
stream) from its start, after what the last attempt's stream still held."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainctl.errors import ExitCode, TrainctlError
from trainctl.inspecting.logs import LogLine, NodeStream, StreamReader, interleave, node_streams
from trainctl.jobs import DONE, describe_jobs, num_nodes


class LogFollower:
    """Each chosen node's current log stream, read forward; `poll` returns the lines new since the last poll."""

    def __init__(
        self,
        batch: Any,
        logs: Any,
        default_group: str,
        *,
        nodes: Sequence[int] | None = None,
        on_new_stream: Callable[[NodeStream], None] | None = None,
    ) -> None:
        self._batch = batch
        self._logs = logs
        self._group = default_group
        # None: every node of the job, counted from each DescribeJobs (a job just submitted may not say yet).
        self._nodes = list(nodes) if nodes is not None else None
        self._on_new_stream = on_new_stream
        self._readers: dict[int, StreamReader] = {}

    @property
    def any_stream(self) -> bool:
        return any(r.source.stream is not None for r in self._readers.values())

    def poll(self, job: dict[str, Any]) -> list[LogLine]:
        nodes = self._nodes if self._nodes is not None else list(range(num_nodes(job)))
        per_node: list[list[LogLine]] = []
        for stream in node_streams(self._batch, job, nodes, self._group):
            reader = self._readers.get(stream.node)
            if reader is not None and (stream.stream is None or stream.stream == reader.source.stream):
                # Unchanged, or a retried node between two attempts (it keeps its last stream until the next starts).
                continue
            if reader is not None and reader.source.stream is not None:
                per_node.append(reader.read())
                if self._on_new_stream is not None:
                    self._on_new_stream(stream)
            self._readers[stream.node] = StreamReader(self._logs, stream)
        per_node += [reader.read() for reader in self._readers.values()]
        return interleave(per_node)


def follow_to_end(
    batch: Any,
    follower: LogFollower,
    job_id: str,
    *,
    show: Callable[[list[LogLine]], None],
    poll_seconds: float,
    sleep: Callable[[float], None],
    on_state: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Show every new line of the job's nodes each poll until the job is SUCCEEDED or FAILED (read once more
    after that, so that the last lines come too); `on_state` at every change of state. Returns the ended job."""
    last: object = None
    while True:
        found = describe_jobs(batch, [job_id])
        if not found:
            raise TrainctlError(f"job {job_id} disappeared while being followed", ExitCode.AWS)
        job = found[0]
        if on_state is not None and job.get("status") != last:
            on_state(job)
        last = job.get("status")
        show(follower.poll(job))
        if last in DONE:
            return job
        sleep(poll_seconds)


def stopped_following(job_id: str) -> str:
    """What Ctrl-C while following says: the job was not touched, and how to follow or stop it."""
    return (
        f"stopped following job {job_id}; the job goes on: `trainctl logs -f {job_id}` follows it again, "
        f"`trainctl cancel {job_id}` stops it"
    )


def new_stream_line(stream: NodeStream) -> str:
    return f"node {stream.node}: a new attempt, log stream {stream.stream}"


def check_follow(follow: bool, *, dry_run: bool) -> None:
    if follow and dry_run:
        raise TrainctlError("--follow with --dry-run: a dry run submits no job to follow; drop one of the two")
