"""Short handles for jobs, taken wherever a command takes JOB: a full job id, a unique prefix of one
(at least 8 characters), or a job name that exactly one recent job of this deployment has.

A full id is described directly, without listing. A name is looked up per queue with ListJobs' JOB_NAME
filter; an id prefix needs the queues' recent jobs (ListJobs has no id filter), listed once per command.
The jobs of one capacity-fallback lineage share their name: the name then stands for the lineage's
latest job, as `show`, `cancel` and the rest follow a lineage from any of its ids anyway.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from trainctl.deployment import Deployment, Fleet
from trainctl.display import age
from trainctl.errors import TrainctlError, clip
from trainctl.fleet.capacity import SUCCESSOR_TAG
from trainctl.jobs import DONE, STATES, describe_jobs, list_job_ids, owned_job
from trainctl.submitting.requests import JOB_NAME

# Batch job ids are UUIDs (API SubmitJob, jobId); one written whole is described without listing.
FULL_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIN_PREFIX = 8
ID_PREFIX = re.compile(rf"^[0-9a-f][0-9a-f-]{{{MIN_PREFIX - 1},34}}$")
# How far back a prefix or a name is looked for (and `cancel --sweep` looks for a sweep's jobs).
RECENT = timedelta(days=30)
RECENT_TEXT = "30d"
UNFINISHED = tuple(s for s in STATES if s not in DONE)
# The JOB argument's help, in every command that takes one.
JOB_HELP = f"Job id, a unique prefix of it ({MIN_PREFIX}+ characters), or the name of one recent job."
# Candidates an ambiguous handle's refusal names, so that it stays one short line.
SHOWN_CANDIDATES = 3


def deployment_queues(deployment: Deployment) -> list[str]:
    """Every queue of every fleet, fallback placements' included (a resubmitted job waits or runs there)."""
    return list(dict.fromkeys(view.job_queue for f in deployment.fleets.values() for view in f.placement_views()))


def short_ids(job_ids: Iterable[str]) -> dict[str, str]:
    """Each id cut to the shortest prefix, MIN_PREFIX characters or more, that no other id of the set shares
    (in sorted order an id shares the longest prefix with a neighbour)."""
    ordered = sorted(set(job_ids))

    def shared(a: str, b: str) -> int:
        return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    short = {}
    for i, job_id in enumerate(ordered):
        neighbours = ordered[max(0, i - 1) : i] + ordered[i + 1 : i + 2]
        length = max([MIN_PREFIX - 1] + [shared(job_id, other) for other in neighbours]) + 1
        short[job_id] = job_id[:length]
    return short


class Handles:
    """Resolves handles for one command run: the recent listing an id prefix needs is made at most once."""

    def __init__(self, batch: Any, deployment: Deployment, *, now_ms: int) -> None:
        self.batch = batch
        self.deployment = deployment
        self.now_ms = now_ms
        self.since_ms = now_ms - int(RECENT.total_seconds() * 1000)
        self._recent: list[dict[str, Any]] | None = None

    def recent(self) -> list[dict[str, Any]]:
        """Summaries of the deployment's jobs created within RECENT, every status (a filter lists all)."""
        if self._recent is None:
            after = [{"name": "AFTER_CREATED_AT", "values": [str(self.since_ms)]}]
            self._recent = [
                s
                for queue in deployment_queues(self.deployment)
                for s in list_job_ids(self.batch, queue, filters=after)
                if int(s.get("createdAt", 0)) >= self.since_ms
            ]
        return self._recent

    def named(self, name: str) -> list[dict[str, Any]]:
        """Recent jobs with exactly this name (JOB_NAME matches regardless of case: API ListJobs, filters)."""
        by_name = [{"name": "JOB_NAME", "values": [name]}]
        return [
            s
            for queue in deployment_queues(self.deployment)
            for s in list_job_ids(self.batch, queue, filters=by_name)
            if s.get("jobName") == name and int(s.get("createdAt", 0)) >= self.since_ms
        ]

    def job_id(self, handle: str) -> str:
        """The full id a handle stands for; one line naming the candidates when it is ambiguous."""
        handle = handle.strip()
        if FULL_ID.match(handle):
            return handle
        found: dict[str, dict[str, Any]] = {}
        if ID_PREFIX.match(handle):
            # The recent listing has the names too: an id-like name costs no second listing.
            found = {
                str(s["jobId"]): s for s in self.recent() if handle in (str(s["jobId"])[: len(handle)], s["jobName"])
            }
        elif JOB_NAME.match(handle):
            found = {str(s["jobId"]): s for s in self.named(handle)}
        if not found:
            raise TrainctlError(
                f"no job {clip(handle)!r} in {self.deployment.region}: give a job id, a prefix of "
                f"{MIN_PREFIX}+ characters "
                f"or the name of a job of this deployment created in the last {RECENT_TEXT} (`trainctl jobs`)"
            )
        if len(found) > 1:
            latest = self._latest_of_one_lineage(list(found))
            if latest:
                return latest
            raise TrainctlError(_ambiguous(handle, list(found.values()), now_ms=self.now_ms))
        return next(iter(found))

    def _latest_of_one_lineage(self, job_ids: list[str]) -> str | None:
        """Where the candidates are one capacity-fallback chain (each but one names its successor among them),
        the chain's latest job."""
        jobs = describe_jobs(self.batch, job_ids)
        successors = {str(j["jobId"]): str((j.get("tags") or {}).get(SUCCESSOR_TAG) or "") for j in jobs}
        ends = [job_id for job_id, successor in successors.items() if successor not in successors]
        return ends[0] if len(ends) == 1 and len(jobs) == len(job_ids) else None

    def owned(self, handle: str) -> tuple[str, dict[str, Any], Fleet]:
        """The job a handle stands for, with its fleet: its full id, the described job and the fleet."""
        job, fleet = owned_job(self.batch, self.deployment, self.job_id(handle))
        return str(job["jobId"]), job, fleet


def _ambiguous(handle: str, candidates: list[dict[str, Any]], *, now_ms: int) -> str:
    """`'h1' is ambiguous: 3 jobs match (5f2c81d0 RUNNING 2h old, ...)`; ids only, as names may be long."""
    candidates.sort(key=lambda s: int(s.get("createdAt", 0)), reverse=True)
    short = short_ids(str(s["jobId"]) for s in candidates)
    shown = [
        f"{short[str(s['jobId'])]} {s.get('status')} {age(now_ms - int(s.get('createdAt', now_ms)))} old"
        for s in candidates[:SHOWN_CANDIDATES]
    ]
    more = f" and {len(candidates) - SHOWN_CANDIDATES} more" if len(candidates) > SHOWN_CANDIDATES else ""
    matches = f"{len(candidates)} jobs match ({', '.join(shown)}{more})"
    return f"{clip(handle)!r} is ambiguous: {matches}; pass a longer id prefix"


def owned(batch: Any, deployment: Deployment, handle: str) -> tuple[str, dict[str, Any], Fleet]:
    """One handle's job (see Handles.owned), for the commands that take one JOB."""
    return Handles(batch, deployment, now_ms=int(time.time() * 1000)).owned(handle)


def unfinished_jobs(batch: Any, deployment: Deployment, *, name: str | None = None) -> list[dict[str, Any]]:
    """This deployment's queued and running jobs (or those of them named `name`), newest first, however old.

    Without a filter ListJobs lists one status at a time (API ListJobs, jobStatus): one listing per queue and
    unfinished status. With JOB_NAME it lists every status (jobStatus is ignored), the finished are dropped here.
    """
    queues = deployment_queues(deployment)
    if name is None:
        found = [s for q in queues for status in UNFINISHED for s in list_job_ids(batch, q, jobStatus=status)]
    else:
        by_name = [{"name": "JOB_NAME", "values": [name]}]
        found = [
            s
            for q in queues
            for s in list_job_ids(batch, q, filters=by_name)
            if s.get("jobName") == name and s.get("status") in UNFINISHED
        ]
    unique = {str(s["jobId"]): s for s in found}
    return sorted(unique.values(), key=lambda s: int(s.get("createdAt", 0)), reverse=True)
