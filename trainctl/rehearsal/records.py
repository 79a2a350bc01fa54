"""What a rehearsal ran: its jobs (a capacity cancel makes a new one), their attempts, and each node as
DescribeJobs would show it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.faults import Fault
from trainctl.rehearsal.fleet_facts import FleetFacts, deployed_facts
from trainctl.rehearsal.hosts import HostPool
from trainctl.rehearsal.nodes import NodeRun

LOOPBACK_SOURCE = "127.0.0.1"


@dataclass
class Attempt:
    number: int
    started: float
    nodes: list[NodeRun]
    ended: float | None = None
    exit_code: int | None = None
    reason: str = ""
    status_reason: str = ""
    retry: str = ""
    events: list[tuple[float, str]] = field(default_factory=list)
    checkpoints_at_end: list[str] = field(default_factory=list)

    @property
    def main(self) -> NodeRun:
        return next(n for n in self.nodes if n.is_main)


@dataclass
class JobRun:
    job_id: str
    spec: JobSpec
    placement: int
    attempts: list[Attempt] = field(default_factory=list)
    status: str = "SUBMITTED"
    status_reason: str = ""
    successor: JobRun | None = None
    resubmitted_from: str | None = None
    # Each checkpoint file of the job's lineage and when the rehearsal first saw it complete in S3.
    checkpoint_seen: dict[str, float] = field(default_factory=dict)
    # Each file directly in the checkpoint folder: the saves of it seen (mtimes), oldest first; a file saved
    # again in place counts once per save (runtime.py names the second `NAME (save 2)`).
    checkpoint_saves: dict[str, list[int]] = field(default_factory=dict)
    # What the launcher uploaded beside the checkpoints when it caught a hang (S3 keys).
    evidence: list[str] = field(default_factory=list)
    # TerminateJob's reason, once a cancel or a budget stop ended the job.
    terminated: str = ""
    # A capacity cancel: how long the retry waited RUNNABLE on Batch (the queue's limit; not slept here),
    # and when the rehearsal played the cancel.
    runnable_wait: float = 0.0
    cancelled_at: float | None = None


@dataclass
class Rehearsal:
    """Everything one rehearsal ran: the first job and, after a capacity cancel, its successors."""

    first: JobRun
    faults: list[Fault]
    fired: list[tuple[float, str]] = field(default_factory=list)
    deadline_hit: bool = False
    started: float = 0.0
    ended: float = 0.0
    pools: list[HostPool] = field(default_factory=list)
    # Faults whose trigger never came, and how many requests the local S3 throttled.
    unfired: list[str] = field(default_factory=list)
    throttled: int = 0
    # The fleet's stop timeout and capacity wait, and where they came from.
    facts: FleetFacts = field(default_factory=deployed_facts)

    def jobs(self) -> list[JobRun]:
        found: list[JobRun] = []
        job: JobRun | None = self.first
        while job is not None:
            found.append(job)
            job = job.successor
        return found

    @property
    def last(self) -> JobRun:
        return self.jobs()[-1]


# (when the fault began, seconds): a node job's end shows in DescribeJobs only this long after it happened.
Lag = tuple[float, float]


def node_job(job: JobRun, attempt: Attempt, index: int, *, now: float, lag: Lag | None = None) -> dict[str, Any]:
    """Node job `<id>#<index>` as DescribeJobs shows it while `attempt` runs. Its id is the same in every
    attempt (Batch user guide, "Multi-node parallel jobs": "Each new attempt of a multi-node parallel job
    updates the corresponding attempt of its associated child nodes"). Unverified, as AWS does not say what
    DescribeJobs shows for a node between attempts: until the node starts in this attempt, its entry is the
    one it ended the previous attempt with (its status, startedAt, stoppedAt and exit code), not PENDING.
    The launcher's node watch ignores such an entry (container/launcher/node_watch.py, earlier_attempt)."""
    run = attempt.nodes[index]
    earlier = [a for a in job.attempts if a.number < attempt.number and index < len(a.nodes)]
    if run.process is None and run.ended is None and earlier:
        run = earlier[-1].nodes[index]
    return node_description(job, run, now=now, lag=lag)


def node_description(job: JobRun, run: NodeRun, *, now: float | None = None, lag: Lag | None = None) -> dict[str, Any]:
    """A node job as DescribeJobs shows it (Batch API, JobDetail and NodeDetails). With a lag (the
    batch-lag fault, unverified how long Batch really takes), a node that ended after the lag began is still
    shown as it was before it ended until `lag` seconds have passed: RUNNING with its startedAt (PENDING if it
    never started), no exit code, reason or stoppedAt."""
    ended = run.ended
    if ended is not None and lag is not None and now is not None and ended >= lag[0] and now < ended + lag[1]:
        ended = None
    if ended is None:
        status = "RUNNING" if run.process is not None else "PENDING"
    else:
        status = "SUCCEEDED" if run.exit_code == 0 else "FAILED"
    container: dict[str, Any] = {}
    if run.started is not None:
        # The node's task ENI (Batch API, NetworkInterface), from which alone the main node's listener takes
        # its lines (container/launcher/report_listener.py). A rehearsed host has its own 127.0.0.x, but a
        # connection to another 127.0.0.x leaves from the loopback route's source, 127.0.0.1.
        container["networkInterfaces"] = [{"privateIpv4Address": LOOPBACK_SOURCE}]
    if ended is not None and run.exit_code is not None:
        container["exitCode"] = run.exit_code
    if ended is not None and run.reason:
        container["reason"] = run.reason
    entry: dict[str, Any] = {
        "jobId": f"{job.job_id}#{run.index}",
        "jobName": job.spec.name,
        "status": status,
        "nodeDetails": {"nodeIndex": run.index, "isMainNode": run.is_main},
        "container": container,
    }
    if run.status_reason and ended is not None:
        entry["statusReason"] = run.status_reason
    for key, stamp in (("startedAt", run.started), ("stoppedAt", ended if run.started else None)):
        if stamp is not None:
            entry[key] = epoch_milliseconds(stamp)
    return entry


def epoch_milliseconds(monotonic: float) -> int:
    """A monotonic time as DescribeJobs' epoch milliseconds."""
    return int((time.time() - (time.monotonic() - monotonic)) * 1000)
