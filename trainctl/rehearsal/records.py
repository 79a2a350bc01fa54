"""What a rehearsal ran: its jobs (a capacity cancel makes a new one), their attempts, and each node as
DescribeJobs would show it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.faults import Fault
from trainctl.rehearsal.hosts import HostPool
from trainctl.rehearsal.nodes import NodeRun


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
    # What the launcher uploaded beside the checkpoints when it caught a hang (S3 keys).
    evidence: list[str] = field(default_factory=list)


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


def node_description(job: JobRun, run: NodeRun) -> dict[str, Any]:
    """A node job as DescribeJobs shows it (Batch API, JobDetail and NodeDetails)."""
    if run.ended is None:
        status = "RUNNING" if run.process is not None else "PENDING"
    else:
        status = "SUCCEEDED" if run.exit_code == 0 else "FAILED"
    container: dict[str, Any] = {}
    if run.exit_code is not None:
        container["exitCode"] = run.exit_code
    if run.reason:
        container["reason"] = run.reason
    entry: dict[str, Any] = {
        "jobId": f"{job.job_id}#{run.index}",
        "jobName": job.spec.name,
        "status": status,
        "nodeDetails": {"nodeIndex": run.index, "isMainNode": run.is_main},
        "container": container,
    }
    if run.status_reason and run.ended is not None:
        entry["statusReason"] = run.status_reason
    for key, stamp in (("startedAt", run.started), ("stoppedAt", run.ended if run.started else None)):
        if stamp is not None:
            entry[key] = epoch_milliseconds(stamp)
    return entry


def epoch_milliseconds(monotonic: float) -> int:
    """A monotonic time as DescribeJobs' epoch milliseconds."""
    return int((time.time() - (time.monotonic() - monotonic)) * 1000)
