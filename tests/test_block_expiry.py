"""The Capacity Block expiry function on moto's Batch (127.0.0.1): EC2's warning for block A stops the
RUNNING, STARTING and RUNNABLE jobs of A's placement queue with the platform's quiet reason and leaves every
other queue's jobs; the capacity resubmitter then sends each stopped job to the next placement with its
lineage. An event that names another reservation is refused loudly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from config.catalog import CATALOG
from config.job_events import QUIET_REASON_PREFIX
from config.settings import CapacityReservation, CapacityWindow, Placement
from tests.trainctl_world import World, served_world
from training_constructs.jobs.capacity_block_expiry import stop_jobs
from training_constructs.jobs.capacity_fallback import resubmit
from training_constructs.jobs.capacity_fallback.routes import FallbackRoute, routes_document

BLOCK_A, BLOCK_B = "cr-0a1b2c3d4e5f60718", "cr-0fedcba9876543210"
END = "2026-12-08T11:30:00Z"
NOW = datetime(2026, 12, 8, 10, 55, tzinfo=UTC)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with served_world() as world:
        yield world


def target(world: World, reservation: str = BLOCK_A, **detail: Any) -> dict[str, Any]:
    """What the rule of the gpu fleet's block (its own placement, reservation A) passes the function."""
    event_detail = {"capacity-reservation-id": reservation, "end-date": END} | detail
    return {
        "queue": world.queues["gpu"],
        "reservation": BLOCK_A,
        "fleet": "gpu",
        "placement": "0",
        "end": END,
        "detail": {k: v for k, v in event_detail.items() if v is not None},
        "resources": [],
    }


def jobs_in(world: World, fleet: str, statuses: dict[str, str]) -> dict[str, str]:
    """Submit one job per (name -> status) to the fleet's queue and put it in that status; name -> job id."""
    ids = {}
    for name, status in statuses.items():
        ids[name] = world.submit(fleet, name=name)
        world.set_job(ids[name], status)
    return ids


def described(world: World, job_id: str) -> dict[str, Any]:
    return dict(world.client("batch").describe_jobs(jobs=[job_id])["jobs"][0])


def termination(world: World, job_id: str) -> str | None:
    """The reason TerminateJob was called with on the job, None if it was not (moto records the call; its
    docker-less jobs do not move on by themselves)."""
    job = world.job(job_id)
    return str(job.job_stopped_reason) if job.stop else None


def ended_by_batch(world: World, job_id: str) -> dict[str, Any]:
    """What Batch does after TerminateJob: the job ends FAILED with the reason as its statusReason (API
    TerminateJob, reason); the job state change event's detail is the job as DescribeJobs gives it."""
    world.set_job(job_id, "FAILED", reason=termination(world, job_id))
    return described(world, job_id)


def test_the_reason_is_quiet_and_the_resubmitter_knows_it() -> None:
    assert stop_jobs.EXPIRY_REASON.startswith(QUIET_REASON_PREFIX)
    assert stop_jobs.EXPIRY_REASON == resubmit.BLOCK_EXPIRY
    reason = stop_jobs.reason_for(BLOCK_A, END)
    assert reason == f"trainctl capacity-block: {BLOCK_A} ends at {END}; stopped for its final checkpoint"


def test_the_warning_for_block_a_stops_only_the_started_and_waiting_jobs_of_as_queue(world: World) -> None:
    mine = jobs_in(world, "gpu", {"run": "RUNNING", "start": "STARTING", "wait": "RUNNABLE", "sub": "SUBMITTED",
                                  "done": "SUCCEEDED"})  # fmt: skip
    others = jobs_in(world, "spare", {"other-run": "RUNNING", "other-wait": "RUNNABLE"})

    result = stop_jobs.handle(target(world), world.client("batch"))

    assert sorted(s["jobId"] for s in result["stopped"]) == sorted([mine["run"], mine["start"], mine["wait"]])
    for name in ("run", "start", "wait"):
        assert termination(world, mine[name]) == stop_jobs.reason_for(BLOCK_A, END)
    assert termination(world, mine["sub"]) is termination(world, mine["done"]) is None
    assert [termination(world, i) for i in others.values()] == [None, None]


def test_an_event_naming_another_reservation_is_refused_and_stops_nothing(world: World, capsys: Any) -> None:
    job = jobs_in(world, "gpu", {"refused-run": "RUNNING"})["refused-run"]
    with pytest.raises(ValueError, match=f"expiration warning for {BLOCK_B} reached the rule of {BLOCK_A}"):
        stop_jobs.handle(target(world, BLOCK_B), world.client("batch"))
    assert termination(world, job) is None
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["level"] == "ERROR" and line["action"] == "refused"


def test_an_event_without_the_documented_id_is_logged_and_its_rules_queue_still_stopped(
    world: World, capsys: Any
) -> None:
    job = jobs_in(world, "gpu", {"odd-run": "RUNNING"})["odd-run"]
    given = target(world, reservation=None) | {"detail": {"something-else": 1}}
    stop_jobs.handle(given, world.client("batch"))
    first = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert first["level"] == "ERROR" and first["action"] == "unexpected-event"
    assert first["event"]["detail"] == {"something-else": 1}
    # Without the detail's end-date the reason says the placement's window end.
    assert termination(world, job) == stop_jobs.reason_for(BLOCK_A, END)


def test_the_reservation_is_read_from_the_resources_arn_when_the_detail_lacks_it() -> None:
    arn = f"arn:aws:ec2:us-west-2:123456789012:capacity-reservation/{BLOCK_B}"
    assert stop_jobs.named_reservation({}, [arn]) == BLOCK_B
    assert stop_jobs.named_reservation({"capacity-reservation-id": BLOCK_A}, [arn]) == BLOCK_A
    assert stop_jobs.named_reservation({}, ["arn:aws:ec2:us-west-2:123456789012:instance/i-0"]) is None


def test_a_stopped_job_goes_on_at_the_next_placement_with_its_lineage(world: World) -> None:
    """The block is the gpu fleet's own placement; the spare queue stands for its fallback placement."""
    job = jobs_in(world, "gpu", {"llama-70b": "RUNNING"})["llama-70b"]
    stop_jobs.handle(target(world), world.client("batch"))
    detail = ended_by_batch(world, job)
    assert detail["statusReason"].startswith(resubmit.BLOCK_EXPIRY)
    block = Placement(
        instance=CATALOG["p5.48xlarge"],
        availability_zone="us-west-2a",
        capacity_reservation=CapacityReservation(reservation_id=BLOCK_A, kind="capacity-block"),
        window=CapacityWindow(start="2026-12-01T11:30:00Z", end=END),
    )
    fallback = Placement(instance=CATALOG["p5.48xlarge"], availability_zone="us-west-2b", capacity_reservation=None)
    queues = [SimpleNamespace(job_queue_arn=world.queues[q]) for q in ("gpu", "spare")]
    route = FallbackRoute(fleet="gpu", placements=(block, fallback), queues=queues, job_definition_arns=[])  # type: ignore[arg-type]

    result = resubmit.handle(detail, routes_document([route]), world.client("batch"), NOW)

    assert result["action"] == "resubmitted" and result["event"] == "block-expiry" and result["to_placement"] == "1"
    successor = described(world, result["successor"])
    assert successor["jobQueue"] == world.queues["spare"]
    assert successor["tags"]["training:fallback-of"] == job
    # moto keeps no node overrides: the lineage is checked on what the resubmitter asks SubmitJob for.
    (node_range,) = resubmit.resubmission(detail, {"queue": "q", "placement": "1", "instanceType": "p5.48xlarge"})[
        "nodeOverrides"
    ]["nodePropertyOverrides"]
    assert {"name": "CHECKPOINT_LINEAGE", "value": job} in node_range["containerOverrides"]["environment"]
    # Delivered again, the event finds the successor and submits no second one.
    again = resubmit.handle(detail, routes_document([route]), world.client("batch"), NOW)
    assert again["action"] == "already-resubmitted" and again["successor"] == result["successor"]


def test_a_stopped_job_on_a_fleets_last_placement_ends_there_said_as_a_block_expiry(world: World) -> None:
    job = jobs_in(world, "gpu", {"last": "RUNNING"})["last"]
    stop_jobs.handle(target(world), world.client("batch"))
    only = Placement(instance=CATALOG["p5.48xlarge"], availability_zone="us-west-2a", capacity_reservation=None)
    route = FallbackRoute(fleet="gpu", placements=(only,), queues=[SimpleNamespace(job_queue_arn=world.queues["gpu"])],
                          job_definition_arns=[])  # type: ignore[arg-type]  # fmt: skip
    result = resubmit.handle(ended_by_batch(world, job), routes_document([route]), world.client("batch"), NOW)
    # Counted apart from capacity cancels (the metric filter counts event "capacity-cancel").
    assert (result["action"], result["event"]) == ("capacity-exhausted", "block-expiry")
