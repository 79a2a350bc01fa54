"""One training lineage across capacity-fallback resubmissions, on moto's Batch and S3 (127.0.0.1): the
real resubmitter makes the successors, and `trainctl show`, `why`, `cancel` and `checkpoints` follow the
lineage from any of its job ids."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from config.job_events import TRAINCTL_CANCEL_REASON
from tests.test_capacity_fallback import NOW, WAITING, Recorder, _add_placements, _cancelled_job, _routes
from tests.trainctl_world import CHECKPOINT_BUCKET, World, moto_environment, served_world
from trainctl.cli import app
from training_constructs.jobs.capacity_fallback import resubmit

# Inside the Capacity Block's window of the third placement (tests/test_capacity_fallback.py's BLOCK).
IN_BLOCK = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with served_world() as world:
        _add_placements(world)
        yield world


@pytest.fixture
def trainctl(world: World) -> Any:
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), env=moto_environment(world.endpoint))


def ok_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _as_batch_describes(world: World, job_id: str, request: dict[str, Any]) -> None:
    """DescribeJobs merges a job's node overrides into its node ranges; moto drops them."""
    job = world.job(job_id)
    described = job.describe
    (override,) = request["nodeOverrides"]["nodePropertyOverrides"]
    added = override["containerOverrides"]["environment"]

    def describe() -> dict[str, Any]:
        result = copy.deepcopy(described())  # not the stored definition's lists
        for node_range in result["nodeProperties"]["nodeRangeProperties"]:
            container = node_range.setdefault("container", {})
            container["environment"] = [*container.get("environment", []), *added]
        return result

    job.describe = describe


def _resubmitted(world: World, detail: dict[str, Any], now: datetime) -> str:
    batch = Recorder(world.client("batch"))
    answer = resubmit.handle(detail, _routes(world), batch, now)
    assert answer["action"] == "resubmitted", answer
    _as_batch_describes(world, answer["successor"], batch.submitted[-1])
    return str(answer["successor"])


@pytest.fixture
def lineage(world: World) -> tuple[str, str, str]:
    """A job cancelled for capacity twice: A on placement 1, B on placement 2, C waiting on placement 3;
    A's checkpoints are in the bucket."""
    first = _cancelled_job(world, "gpu")
    second = _resubmitted(world, first, NOW)
    world.set_job(second, "FAILED", reason=resubmit.CAPACITY_CANCEL)
    (described,) = world.client("batch").describe_jobs(jobs=[second])["jobs"]
    third = _resubmitted(world, described, IN_BLOCK)
    world.set_job(third, "RUNNABLE", reason=WAITING)
    manifest = {"format": 1, "files": {"model_9.pt": {"size": 5, "mtime_ns": 1_795_432_800_000_000_000}}}
    world.client("s3").put_object(
        Bucket=CHECKPOINT_BUCKET, Key=f"gpu/{first['jobId']}/node-0.manifest.json", Body=json.dumps(manifest).encode()
    )
    return str(first["jobId"]), second, third


def test_every_job_of_the_lineage_shows_the_chain_and_the_first_jobs_checkpoints(
    lineage: tuple[str, str, str], trainctl: Any
) -> None:
    first, second, third = lineage
    chain = [{"jobId": first, "status": "FAILED"}, {"jobId": second, "status": "FAILED"},
             {"jobId": third, "status": "RUNNABLE"}]  # fmt: skip
    for job_id in lineage:
        shown = ok_json(trainctl("--json", "show", job_id))
        assert shown["lineage"] == {"id": first, "jobs": chain, "latest": third}, job_id
        assert shown["checkpoints"]["uri"].endswith(f"/gpu/{first}/") and shown["checkpoints"]["files"] == 1

    text = trainctl("show", first).stdout
    assert f"job {first} continues as job {third}, now RUNNABLE" in text
    assert f"{first} FAILED -> {second} FAILED -> {third} RUNNABLE" in text


def test_why_of_an_earlier_job_names_the_live_successor_first(lineage: tuple[str, str, str], trainctl: Any) -> None:
    first, _, third = lineage

    earlier = ok_json(trainctl("--json", "why", first))
    latest = ok_json(trainctl("--json", "why", third))

    assert earlier["reasons"][0].startswith(f"job {first} continues as job {third}, now RUNNABLE")
    assert not any("continues as" in r for r in latest["reasons"])
    assert [j["jobId"] for j in latest["lineage"]] == [j["jobId"] for j in earlier["lineage"]]
    assert any(r.startswith("lineage (capacity fallback resubmissions") for r in latest["reasons"])


def test_checkpoints_of_a_successor_list_the_lineages_prefix(lineage: tuple[str, str, str], trainctl: Any) -> None:
    first, _, third = lineage

    listed = ok_json(trainctl("--json", "checkpoints", third))

    assert listed["uri"] == f"s3://{CHECKPOINT_BUCKET}/gpu/{first}/"
    assert [(f["node"], f["file"]) for f in listed["files"]] == [(0, "model_9.pt")]


def test_cancel_of_the_first_id_stops_the_live_successor(
    world: World, lineage: tuple[str, str, str], trainctl: Any
) -> None:
    first, second, third = lineage

    result = trainctl("cancel", first)

    assert result.exit_code == 0, result.output
    assert f"job {first} already ended FAILED" in result.stdout
    assert f"its live successor {third} (RUNNABLE) is being terminated" in result.stdout
    assert world.job(third).job_stopped_reason == TRAINCTL_CANCEL_REASON
    assert world.job(second).job_stopped_reason == resubmit.CAPACITY_CANCEL  # ended already: left alone

    world.set_job(third, "FAILED", reason=TRAINCTL_CANCEL_REASON)
    again = ok_json(trainctl("--json", "cancel", second))
    assert again["terminated"] is False and again["terminatedJobs"] == []
    assert "as did its lineage" in trainctl("cancel", second).stdout


def test_a_capacity_cancel_not_yet_resubmitted_says_the_successor_may_still_come(world: World, trainctl: Any) -> None:
    job_id = str(_cancelled_job(world, "gpu")["jobId"])

    result = trainctl("cancel", job_id)

    assert result.exit_code == 0, result.output
    assert "has no successor yet: the capacity fallback may still resubmit it" in result.stdout


def test_the_lineages_names_agree_wherever_they_are_written() -> None:
    """The launcher, the resubmitter (a Lambda asset of its own file), the alert's function and trainctl
    each spell the variable and the tags; the launcher's is pinned by tests/test_checkpoints.py."""
    from trainctl.fleet import capacity
    from trainctl.inspecting import checkpoints
    from training_constructs.observability.resumed_alert_function import announce

    assert resubmit.LINEAGE_VARIABLE == checkpoints.LINEAGE_VARIABLE == "CHECKPOINT_LINEAGE"
    assert resubmit.ORIGIN_TAG == capacity.ORIGIN_TAG == announce.ORIGIN_TAG
    assert resubmit.SUCCESSOR_TAG == capacity.SUCCESSOR_TAG


def test_a_job_without_resubmissions_is_a_lineage_of_one(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="alone")
    world.set_job(job_id, "RUNNING")

    shown = ok_json(trainctl("--json", "show", job_id))
    cancelled = ok_json(trainctl("--json", "cancel", job_id))

    assert shown["lineage"] == {"id": job_id, "jobs": [{"jobId": job_id, "status": "RUNNING"}], "latest": job_id}
    assert cancelled["terminatedJobs"] == [job_id]
