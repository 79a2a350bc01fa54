"""Capacity waits in plain words: per fleet and placement, whether Batch reports insufficient capacity
now and since when, and where a waiting job goes next.

Batch sets `CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - ...` as a RUNNABLE job's statusReason while EC2
cannot launch the instances, and cancels it with "Canceled by JobStateTimeLimit action due to
reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY" when the queue's time limit passes (Batch user
guide, "Jobs stuck in RUNNABLE due to capacity"). On a fleet with fallback placements the
resubmitter (training_constructs/jobs/capacity_fallback) then submits the job to the next placement and
tags both jobs. Batch does not say when it set a reason: "since" is the creation of the oldest job
that waits with it, an upper bound on how long the placement has been short.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainctl.deployment import Fleet, PlacementRef
from trainctl.jobs import describe_jobs, list_job_ids

CAPACITY_CODE = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
CAPACITY_CANCEL = f"Canceled by JobStateTimeLimit action due to reason: {CAPACITY_CODE}"
# Tags the resubmitter sets (training_constructs/jobs/capacity_fallback/resubmit.py).
SUCCESSOR_TAG = "training:fallback-job"
ORIGIN_TAG = "training:fallback-of"
# trainctl's own key on a described queue (trainctl/fleet/compute.py): the fleet's placements and which
# one the queue is. Not a Batch field.
PLACEMENT_KEY = "trainctlPlacement"
_WINDOW = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\dZ)\.\.(\d{4}-\d\d-\d\dT\d\d:\d\dZ)")


@dataclass(frozen=True)
class PlacementCapacity:
    placement: int
    label: str
    queue: str
    # Jobs RUNNABLE there for which Batch reports insufficient capacity now.
    short_jobs: int
    # Creation of the oldest of them (epoch ms), or None when the placement is not short.
    short_since: int | None

    @property
    def short(self) -> bool:
        return self.short_jobs > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "placement": self.placement,
            "label": self.label,
            "short": self.short,
            "shortJobs": self.short_jobs,
            "shortSince": _when(self.short_since) if self.short_since else None,
        }


def _when(milliseconds: int) -> str:
    return datetime.fromtimestamp(milliseconds / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _minutes(seconds: float) -> str:
    return f"{max(0, round(seconds / 60))} min"


def placements_of(fleet: Fleet) -> tuple[PlacementRef, ...]:
    """The fleet's placements; a fleet without fallback has one, its own."""
    return fleet.placements or (PlacementRef(label="the fleet's own", queue=fleet.job_queue),)


def fleet_capacity(batch: Any, fleet: Fleet) -> list[PlacementCapacity]:
    found = []
    for number, ref in enumerate(placements_of(fleet)):
        ids = [str(s["jobId"]) for s in list_job_ids(batch, ref.queue, jobStatus="RUNNABLE")]
        short = [j for j in describe_jobs(batch, ids) if str(j.get("statusReason", "")).startswith(CAPACITY_CODE)]
        since = min((int(j.get("createdAt", 0)) for j in short), default=None)
        found.append(PlacementCapacity(number, ref.label, ref.queue, len(short), since))
    return found


NO_CAPACITY_WAIT = "no capacity wait reported"


def capacity_summary(placements: list[PlacementCapacity]) -> str:
    """One line: which placements are short and since when, or that none is."""
    short = [p for p in placements if p.short]
    if not short:
        return NO_CAPACITY_WAIT
    every = " (every placement)" if len(short) == len(placements) else ""
    parts = [f"{p.label} since {_when(p.short_since or 0)}" for p in short]
    return f"short of capacity{every}: " + "; ".join(parts)


def queue_with_placement(queue: dict[str, Any] | None, fleet: Fleet) -> dict[str, Any] | None:
    """The described queue with the fleet's placements attached, for `trainctl why`."""
    if queue is None:
        return None
    refs = placements_of(fleet)
    info = {"fleet": fleet.name, "number": fleet.placement, "placements": [[r.label, r.queue] for r in refs]}
    return {**queue, PLACEMENT_KEY: info}


def _open_now(label: str, now: datetime) -> bool:
    window = _WINDOW.search(label)
    if not window:
        return True
    start, end = (datetime.strptime(t, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC) for t in window.groups())
    return start <= now < end


def _next(placements: list[list[str]], number: int, now: datetime) -> tuple[int, str] | None:
    for later in range(number + 1, len(placements)):
        if _open_now(placements[later][0], now):
            return later, placements[later][0]
    return None


def _capacity_limit(queue: dict[str, Any]) -> int | None:
    for action in queue.get("jobStateTimeLimitActions", []):
        if action.get("state") == "RUNNABLE" and action.get("reason") == CAPACITY_CODE:
            return int(action["maxTimeSeconds"])
    return None


def wait_reasons(job: dict[str, Any], queue: dict[str, Any] | None, now: datetime) -> list[str]:
    """What a capacity wait means for this job: fleet, placement, how long, and what happens next.
    Empty when the job is not waiting for, or was not cancelled for, capacity."""
    reason = str(job.get("statusReason", ""))
    status = job.get("status")
    waiting = status == "RUNNABLE" and reason.startswith(CAPACITY_CODE)
    cancelled = status == "FAILED" and reason.startswith(CAPACITY_CANCEL)
    info = (queue or {}).get(PLACEMENT_KEY)
    if not (waiting or cancelled) or not info:
        return []
    placements, number = info["placements"], int(info["number"])
    where = f"fleet {info['fleet']}, placement {number + 1} of {len(placements)} ({placements[number][0]})"
    tags = job.get("tags") or {}
    lines = []
    if tags.get(ORIGIN_TAG):
        lines.append(f"sent here by the capacity fallback after job {tags[ORIGIN_TAG]} was cancelled for capacity")
    following = _next(placements, number, now)
    if cancelled:
        if tags.get(SUCCESSOR_TAG):
            lines.insert(0, f"{where}: no capacity; the fallback resubmitted it as job {tags[SUCCESSOR_TAG]}")
        elif following:
            lines.insert(0, f"{where}: no capacity; it goes to placement {following[0] + 1} ({following[1]})")
        else:
            lines.insert(0, f"{where}: no capacity, and no later placement is open: the job ends here")
        return lines
    created = int(job.get("createdAt", 0))
    waited = now.timestamp() - created / 1000
    lines.insert(0, f"{where}: EC2 has no capacity; waiting {_minutes(waited)} (since {_when(created)})")
    limit = _capacity_limit(queue or {})
    after = (
        f"in about {_minutes(created / 1000 + limit - now.timestamp())}" if limit else "when the queue's limit passes"
    )
    if following:
        lines.append(
            f"next: if capacity does not come, it is cancelled {after} and sent to placement "
            f"{following[0] + 1} ({following[1]})"
        )
    else:
        lines.append(
            f"next: this is the fleet's last open placement; if capacity does not come, the queue cancels "
            f"it {after} and it ends"
        )
    return lines
