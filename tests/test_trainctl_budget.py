"""Budgets and price before launch in trainctl, on moto's AWS APIs on 127.0.0.1: the jobs stack carries a
`Budgets` output (FIFO teams by the trainctl:team tag, the gpu fleet at $10 an instance-hour) and the ledger
table it names. A job that fits is accepted with its price line; one that would exceed the team's remainder
is refused in one line with the figures and nothing is submitted; `--dry-run` shows the estimate and the
remainder; `trainctl budget` and `trainctl why` tell the figures."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from budget_ledger import ledger
from tests.test_budget_functions import create_ledger, spend
from tests.trainctl_world import DATASET_BUCKET, World, moto_environment, served_world
from trainctl.cli import app
from trainctl.errors import ExitCode
from trainctl.submitting import estimate

TABLE = "ledger"
DOCUMENT: dict[str, Any] = {
    "table": TABLE,
    "teams": {"llama": 1000, "vision": 100},
    "defaultTeam": "llama",
    "fairShare": False,
    "timeoutSeconds": 3600,
}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with served_world() as world:
        yield world


@pytest.fixture
def trainctl(world: World) -> Any:
    runner = CliRunner()

    def run(*args: str, stdin: str | None = None) -> Any:
        return runner.invoke(app, list(args), env=moto_environment(world.endpoint), input=stdin)

    return run


@pytest.fixture(scope="module")
def ledger_table(world: World) -> Any:
    """The Budgets output on the world's jobs stack, and the ledger table it names."""
    cloudformation = world.client("cloudformation")
    body = json.loads(json.dumps(cloudformation.get_template(StackName="TrainingJobs")["TemplateBody"]))
    document = DOCUMENT | {
        "queues": [{"queue": world.queues["gpu"], "fleet": "gpu", "instanceType": "g6.12xlarge", "usdPerHour": 10}]
    }
    body["Outputs"]["Budgets"] = {"Value": json.dumps(document)}
    cloudformation.update_stack(StackName="TrainingJobs", TemplateBody=json.dumps(body))
    resource = boto3.resource(
        "dynamodb", region_name="us-east-1", endpoint_url=world.endpoint,
        aws_access_key_id="testing", aws_secret_access_key="testing",  # noqa: S106 - moto accepts any key
    )  # fmt: skip
    return create_ledger(resource, TABLE)


@pytest.fixture
def table(ledger_table: Any) -> Any:
    """The ledger, empty: each test seeds the spend it counts on."""
    for item in ledger_table.scan()["Items"]:
        ledger_table.delete_item(Key={"month": item["month"], "job": item["job"]})
    return ledger_table


def job_ids(world: World) -> set[str]:
    pages = (
        world.client("batch")
        .get_paginator("list_jobs")
        .paginate(jobQueue=world.queues["gpu"], filters=[{"name": "JOB_NAME", "values": ["*"]}])
    )
    return {j["jobId"] for page in pages for j in page["jobSummaryList"]}


def test_without_budgets_the_price_line_alone_and_budget_says_how_to_set_them(world: World, trainctl: Any) -> None:
    # 2 nodes (the job definition's) x g6.12xlarge's $4.6016 x a 2 h timeout: $9.2032/hour, $18.41 at most.
    result = trainctl("submit", "gpu", "--timeout", "7200", "--dry-run")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["jobName"].startswith("gpu-training-")
    assert result.stderr.strip() == (
        "estimate: $9.20/hour (2 x g6.12xlarge at $4.60); at most $18.41 (2 x g6.12xlarge x 2 h)"
    )
    result = trainctl("budget")
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.strip() == (
        "trainctl: no budgets in this deployment: set the budgets context key and redeploy (docs/budgets.md)"
    )


def test_a_job_that_fits_is_accepted_with_its_price_and_the_teams_remainder(
    world: World, trainctl: Any, table: Any
) -> None:
    spend(table, "llama", 400, "llama-earlier")
    result = trainctl("submit", "gpu", "--team", "llama", "--timeout", "3600")
    assert result.exit_code == 0, result.output
    # 2 nodes x $10 (the budget's price for the gpu queue) x 1 h.
    assert result.stderr.strip() == (
        "estimate: $20.00/hour (2 x g6.12xlarge at $10.00); at most $20.00 (2 x g6.12xlarge x 1 h); "
        "team llama has $600 left of $1,000 this month"
    )
    job = world.client("batch").describe_jobs(jobs=[result.stdout.strip()])["jobs"][0]
    assert job["tags"][ledger.TEAM_TAG] == "llama"


def test_a_job_that_would_exceed_the_remainder_is_refused_in_one_line_and_not_submitted(
    world: World, trainctl: Any, table: Any
) -> None:
    spend(table, "vision", 90, "vision-earlier")
    before = job_ids(world)
    result = trainctl("submit", "gpu", "--team", "vision", "--timeout", "14400")
    month = ledger.month_name(ledger.month_of(int(time.time() * 1000)))
    assert result.exit_code == ExitCode.USAGE, result.output
    # $100 - $90 = $10 left; 2 x $10 x 4 h = $80.
    assert result.stderr.strip() == (
        f"trainctl: budget: team vision has $10.00 of $100 left in {month}; this job may cost up to $80.00 "
        f"(2 x g6.12xlarge x 4 h): {ledger.REMEDY}"
    )
    assert job_ids(world) == before
    # A sweep counts every job: 3 points x 2 nodes x $10 x 1 h = $60.
    sweep = trainctl("sweep", "gpu", "--grid", "LR=0.1,0.01,0.001", "--team", "vision")
    assert sweep.exit_code == ExitCode.USAGE
    assert "this job may cost up to $60.00 (3 jobs x 2 x g6.12xlarge x 1 h)" in sweep.stderr
    assert job_ids(world) == before


def test_dry_run_shows_the_estimate_the_remainder_and_the_refusal_to_come(trainctl: Any, table: Any) -> None:
    spend(table, "vision", 90, "vision-earlier")
    result = trainctl("submit", "gpu", "--team", "vision", "--timeout", "14400", "--dry-run")
    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)
    assert request["tags"] == {ledger.TEAM_TAG: "vision"}
    line, refusal = result.stderr.strip().splitlines()
    assert line.endswith("at most $80.00 (2 x g6.12xlarge x 4 h); team vision has $10.00 left of $100 this month")
    assert refusal.startswith("would be refused: budget: team vision has $10.00 of $100 left")


def test_hours_set_the_attempt_timeout_that_bounds_the_estimate(world: World, trainctl: Any, table: Any) -> None:
    spend(table, "vision", 90, "vision-earlier")
    # 15 minutes: 2 x $10 x 0.25 h = $5, within vision's $10.
    result = trainctl("submit", "gpu", "--team", "vision", "--hours", "0.25")
    assert result.exit_code == 0, result.output
    assert "at most $5.00 (2 x g6.12xlarge x 15 min)" in result.stderr
    job = world.client("batch").describe_jobs(jobs=[result.stdout.strip()])["jobs"][0]
    # Batch stops the attempt at 15 minutes: the estimate is a bound, not a promise.
    assert job["timeout"] == {"attemptDurationSeconds": 900}
    # Whole seconds, rounded up: 0.02 h is 72 s; a minute (Batch's least timeout) is the least --hours.
    tiny = trainctl("submit", "gpu", "--team", "vision", "--hours", "0.02", "--dry-run")
    assert json.loads(tiny.stdout)["timeout"] == {"attemptDurationSeconds": 72}
    assert estimate.hours_timeout(1 / 60) == 60


def test_hours_out_of_range_are_refused_in_one_line(world: World, trainctl: Any) -> None:
    before = job_ids(world)
    for value in ("0.001", "-1", "1e9", "nan"):
        result = trainctl("submit", "gpu", "--hours", value)
        assert result.exit_code == ExitCode.USAGE, (value, result.output)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"trainctl: --hours {float(value):g}: an attempt may run 1/60 (a minute) to 596,523 ")
        assert len(line) <= 200
    assert job_ids(world) == before


def test_every_attempt_counts_in_the_estimate(trainctl: Any, table: Any) -> None:
    # 2 x $10 x 1 h x 3 attempts = $60: Batch bills every attempt.
    result = trainctl("submit", "gpu", "--team", "llama", "--timeout", "3600", "--attempts", "3", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "at most $60.00 (2 x g6.12xlarge x 1 h x 3 attempts)" in result.stderr


def test_a_refused_job_leaves_no_workdir_and_no_job_definition_behind(
    world: World, trainctl: Any, table: Any, tmp_path: Path
) -> None:
    spend(table, "vision", 90, "vision-earlier")
    (tmp_path / "train.py").write_text("print('hi')\n")
    batch, s3 = world.client("batch"), world.client("s3")
    definitions = len(batch.describe_job_definitions()["jobDefinitions"])
    result = trainctl(
        "submit", "gpu", "--team", "vision", "--timeout", "14400", "--workdir", str(tmp_path),
        "--command", "train.py", "--image", "public.ecr.aws/example/other:1",
    )  # fmt: skip
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "trainctl: budget: team vision has $10.00 of $100 left" in result.stderr
    assert s3.list_objects_v2(Bucket=DATASET_BUCKET, Prefix="workdirs/")["KeyCount"] == 0
    assert len(batch.describe_job_definitions()["jobDefinitions"]) == definitions


def test_on_fifo_fleets_a_job_of_no_budgeted_team_is_refused(
    world: World, trainctl: Any, table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployed = estimate.load_budgets

    def without_default_team(aws: Any) -> ledger.Budgets:
        budgets = deployed(aws)
        assert budgets is not None
        return dataclasses.replace(budgets, default_team=None)

    monkeypatch.setattr(estimate, "load_budgets", without_default_team)
    before = job_ids(world)
    result = trainctl("submit", "gpu", "--timeout", "3600")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.strip() == "trainctl: budget: no trainctl:team tag; the teams are llama, vision (--team)"
    assert job_ids(world) == before


def test_a_job_over_the_threshold_is_confirmed_on_a_terminal(
    world: World, trainctl: Any, table: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(estimate, "on_terminal", lambda: True)
    before = job_ids(world)
    # The question alone, without budgets: 2 x $4.6016 x 120 h = $1,104 > ASK_ABOVE_USD.
    monkeypatch.setattr(estimate, "load_budgets", lambda aws: None)
    declined = trainctl("submit", "gpu", "--timeout", str(120 * 3600), stdin="n\n")
    assert declined.exit_code == ExitCode.USAGE
    assert "This may cost up to $" in declined.output and job_ids(world) == before
    accepted = trainctl("submit", "gpu", "--timeout", str(120 * 3600), "--yes")
    assert accepted.exit_code == 0, accepted.output
    assert "Submit?" not in accepted.output


def test_budget_shows_each_team_with_camel_case_json(trainctl: Any, table: Any) -> None:
    spend(table, "vision", 90, "vision-earlier")
    rows = {row["team"]: row for row in json.loads(trainctl("--json", "budget").stdout)}
    assert set(rows) == {"llama", "vision"}
    vision = rows["vision"]
    assert set(vision) == {
        "team", "month", "budgetUsd", "spentUsd", "accruingUsd", "remainingUsd", "forecastUsd", "usdPerHourNow",
        "usedFraction",
    }  # fmt: skip
    assert (vision["budgetUsd"], vision["spentUsd"], vision["remainingUsd"], vision["usedFraction"]) == (
        100,
        90,
        10,
        0.9,
    )
    table_text = trainctl("budget").stdout
    assert "vision" in table_text and "90%" in table_text and "accruing now" in table_text


def test_why_names_the_budget_with_its_figures(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="over-budget", tags={ledger.TEAM_TAG: "vision"})
    reason = "trainctl budget: team vision reached $101 of its $100 budget for November 2026: stopped, checkpoints kept"
    world.set_job(job_id, "FAILED", reason=reason)
    text = trainctl("why", job_id).stdout
    assert f"Batch says: {reason}" in text
    assert "its team's monthly budget cancelled or stopped it" in text and "trainctl budget" in text
    # A job stopped before the budget's reasons took the shared prefix.
    older = world.submit("gpu", name="over-budget-before", tags={ledger.TEAM_TAG: "vision"})
    world.set_job(older, "FAILED", reason=reason.removeprefix("trainctl "))
    assert "its team's monthly budget cancelled or stopped it" in trainctl("why", older).stdout
