"""A training lineage: a job and the jobs the capacity fallback resubmitted it as, oldest first.

The resubmitter (training_constructs/jobs/capacity_fallback/resubmit.py) tags the cancelled job with its
successor (`training:fallback-job`) and the successor with the job it continues (`training:fallback-of`),
and gives the successor's nodes CHECKPOINT_LINEAGE, under which the launcher keeps the checkpoints
(container/launcher/restore_phase.py): every job of a lineage trains on under one checkpoint prefix. `show`,
`why`, `cancel` and `checkpoints` follow the lineage from any of its job ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.fleet.capacity import ORIGIN_TAG, SUCCESSOR_TAG
from trainctl.jobs import DONE, describe_jobs

# More hops than a fleet has placements; a loop in hand-edited tags ends here too.
MAX_HOPS = 16


@dataclass(frozen=True)
class Lineage:
    jobs: tuple[dict[str, Any], ...]  # oldest first, the asked job among them

    @property
    def latest(self) -> dict[str, Any]:
        return self.jobs[-1]

    @property
    def live(self) -> list[dict[str, Any]]:
        """Jobs not yet ended: at most the latest, unless tags were edited by hand."""
        return [job for job in self.jobs if job.get("status") not in DONE]

    def summary(self) -> list[dict[str, Any]]:
        return [{"jobId": job.get("jobId"), "status": job.get("status")} for job in self.jobs]

    def chain(self) -> str:
        """`A FAILED -> B RUNNING`."""
        return " -> ".join(f"{job.get('jobId')} {job.get('status')}" for job in self.jobs)


def _linked(batch: Any, job: dict[str, Any], tag: str, seen: set[str]) -> dict[str, Any] | None:
    linked = str((job.get("tags") or {}).get(tag) or "")
    if not linked or linked in seen:
        return None
    # A job Batch no longer describes (ended long ago) ends the chain there.
    found = describe_jobs(batch, [linked])
    return found[0] if found else None


def follow(batch: Any, job: dict[str, Any]) -> Lineage:
    """The job's lineage: back through the jobs it continues, forward through its successors."""
    jobs = [job]
    seen = {str(job.get("jobId"))}
    for tag, at_start in ((ORIGIN_TAG, True), (SUCCESSOR_TAG, False)):
        current = job
        while len(jobs) < MAX_HOPS:
            linked = _linked(batch, current, tag, seen)
            if linked is None:
                break
            seen.add(str(linked.get("jobId")))
            if at_start:
                jobs.insert(0, linked)
            else:
                jobs.append(linked)
            current = linked
    return Lineage(tuple(jobs))


def lineage_lines(lineage: Lineage, job_id: str) -> list[str]:
    """What `why` and `show` say about a job that is one of several of its lineage; nothing otherwise."""
    if len(lineage.jobs) < 2:
        return []
    lines = [f"lineage (capacity fallback resubmissions, one checkpoint prefix): {lineage.chain()}"]
    latest = lineage.latest
    if latest.get("jobId") != job_id:
        lines.insert(
            0,
            f"job {job_id} continues as job {latest.get('jobId')}, now {latest.get('status')}: "
            f"`trainctl why {latest.get('jobId')}` tells where it stands",
        )
    return lines
