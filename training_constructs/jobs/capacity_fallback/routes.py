"""What the resubmitter reads: each placement queue's fleet, placement and the placements after it.
Free of CDK imports, so that tests of the handler need no CDK."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from config.job_events import TRAINCTL_FAMILY_SUFFIX
from config.settings import Placement

if TYPE_CHECKING:
    from aws_cdk import aws_batch as batch


@dataclass(frozen=True, kw_only=True)
class FallbackRoute:
    """One fleet's placements in order (its own first) with their queues, and the job definitions
    (their deployed revisions' ARNs) whose families its jobs may be resubmitted with."""

    fleet: str
    placements: Sequence[Placement]
    queues: Sequence[batch.IJobQueue]
    job_definition_arns: Sequence[str]


def routes_document(routes: Sequence[FallbackRoute]) -> dict[str, object]:
    """The resubmitter's ROUTES: queue ARN -> the fleet, the placement and the ones after it."""
    document: dict[str, object] = {}
    for route in routes:
        entries = [
            {
                "queue": queue.job_queue_arn,
                "placement": str(number),
                "label": placement.label,
                "instanceType": placement.instance.name,
                **({"start": placement.window.start, "end": placement.window.end} if placement.window else {}),
            }
            for number, (placement, queue) in enumerate(zip(route.placements, route.queues, strict=True))
        ]
        for number, entry in enumerate(entries):
            document[str(entry["queue"])] = {
                "fleet": route.fleet,
                "placement": entry["placement"],
                "label": entry["label"],
                "next": entries[number + 1 :],
            }
    return document


def definition_families(prefix: str, name: str) -> list[str]:
    """SubmitJob resources for every revision of job definition `name` and of its trainctl family:
    a job submitted before a redeploy names an older revision, one of `trainctl run --image` the
    `<name>-trainctl` family. `prefix` is `arn:<partition>:batch:<region>:<account>:job-definition/`."""
    return [f"{prefix}{name}:*", f"{prefix}{name}{TRAINCTL_FAMILY_SUFFIX}:*"]
