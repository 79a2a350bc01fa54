"""Lambda handler: when EC2 warns that a Capacity Block ends, stop the jobs of the block's placement queue.

EC2 sends "Capacity Block Expiration Warning" (source aws.ec2) 40 minutes before a block ends and begins
terminating its instances 10 minutes later (EC2 user guide, "Monitor Capacity Blocks using EventBridge";
its example event: detail {"capacity-reservation-id", "end-date"}, resources [the reservation's ARN]).
One EventBridge rule per block placement passes this function the placement's queue and reservation with the
event's detail and resources (construct.py). Every job of that queue that is RUNNABLE, STARTING or RUNNING is
ended with TerminateJob: a started one gets SIGTERM and uploads its final checkpoint within the container's
stop timeout (docs/checkpoints.md), before EC2 takes the instances at T-30. The reason starts with
EXPIRY_REASON, which the capacity resubmitter recognises (capacity_fallback/resubmit.py: the job goes on at
the fleet's next placement once it has ended) and the job alerts leave out (config/job_events.py: a block
ending is expected, not a failure).
Every decision is one JSON line in the function's log. Stdlib, plus the boto3 that Lambda's runtime ships.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# config/job_events.py QUIET_REASON_PREFIX ("trainctl ") then what stopped it; tests pin both, and that
# capacity_fallback/resubmit.py's copy is the same (each handler is deployed as a file of its own).
EXPIRY_REASON = "trainctl capacity-block:"
# The states in which a job still holds or waits for the block's instances. SUBMITTED and PENDING jobs
# wait on dependencies or the scheduler; the queue's capacity limit sends them on if the block is gone.
STOPPED_STATUSES = ("RUNNING", "STARTING", "RUNNABLE")
DETAIL_RESERVATION = "capacity-reservation-id"
DETAIL_END = "end-date"
# Errors worth another delivery of the event: TerminateJob again on a stopped job does no harm.
RETRIED_CODES = frozenset({"ThrottlingException", "TooManyRequestsException", "ServiceUnavailable", "InternalFailure"})


def batch_client() -> Any:
    import boto3  # Lambda's Python runtime includes it

    return boto3.client("batch")


def log(**fields: Any) -> dict[str, Any]:
    print(json.dumps(fields, sort_keys=True, default=str))
    return fields


def reason_for(reservation: str, end: str) -> str:
    return f"{EXPIRY_REASON} {reservation} ends at {end or 'its end'}; stopped for its final checkpoint"


def named_reservation(detail: Mapping[str, Any], resources: Sequence[Any]) -> str | None:
    """The reservation the event is about: the detail's documented field, else the id at the end of a
    capacity-reservation ARN in `resources` (the documented example lists the reservation's ARN there)."""
    named = detail.get(DETAIL_RESERVATION) if isinstance(detail, Mapping) else None
    if named:
        return str(named)
    for resource in resources or []:
        if isinstance(resource, str) and ":capacity-reservation/" in resource:
            return resource.rsplit("/", 1)[-1]
    return None


def _jobs(batch: Any, queue: str, status: str) -> Iterator[Mapping[str, Any]]:
    token: str | None = None
    while True:
        page = batch.list_jobs(jobQueue=queue, jobStatus=status, **({"nextToken": token} if token else {}))
        yield from page.get("jobSummaryList", [])
        token = page.get("nextToken")
        if not token:
            return


def handle(target: Mapping[str, Any], batch: Any) -> dict[str, Any]:
    """`target`: {"queue", "reservation", "fleet", "placement", "end", "detail", "resources"}."""
    reservation, queue = str(target["reservation"]), str(target["queue"])
    base = {"fleet": target.get("fleet"), "placement": target.get("placement"), "reservation": reservation}
    detail = target.get("detail") or {}
    named = named_reservation(detail, target.get("resources") or [])
    if named is not None and named != reservation:
        # The rule matches this reservation only: another one here means the rule and the event disagree.
        log(level="ERROR", action="refused", reason=f"the event names {named}, not this placement's", **base)
        raise ValueError(f"expiration warning for {named} reached the rule of {reservation}: {json.dumps(detail)}")
    if named is None:
        # EC2's documented shape names the reservation; this event does not. The rule matched it for this
        # reservation, so the jobs are stopped all the same, and the event is logged for a person to read.
        log(level="ERROR", action="unexpected-event", event=target, **base)
    end = str((detail.get(DETAIL_END) if isinstance(detail, Mapping) else None) or target.get("end") or "")
    reason = reason_for(reservation, end)
    stopped: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for status in STOPPED_STATUSES:
        for job in _jobs(batch, queue, status):
            job_id = str(job["jobId"])
            if "#" in job_id:
                continue  # a node of a multi-node job: terminating the job stops its nodes
            try:
                batch.terminate_job(jobId=job_id, reason=reason)
            except Exception as error:
                code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
                if not code or code in RETRIED_CODES:
                    raise
                failed.append({"jobId": job_id, "error": str(error)[:300]})
                continue
            stopped.append({"jobId": job_id, "jobName": job.get("jobName"), "status": status})
    result = log(action="stopped", event="block-expiry", end=end, stopped=stopped, failed=failed, **base)
    if failed:
        # The alarm on the function's errors tells a person that some job may lose its last steps.
        raise RuntimeError(f"TerminateJob refused for {len(failed)} job(s) of {queue}: {failed}")
    return result


def handler(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    return handle(event, batch_client())
