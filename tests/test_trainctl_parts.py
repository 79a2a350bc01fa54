"""trainctl's pieces that need no AWS: prices, cost arithmetic, requests, log merging, verdicts,
explanations, output names, and the package's own rules (typed, no CDK, exit codes documented)."""

from __future__ import annotations

import ast
import re
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.stub import Stubber

from config.catalog import CATALOG
from config.prices import NOT_FOUND, NOT_PUBLISHED, PRICES
from tests.harness import ROOT
from trainctl.aws import aws_errors
from trainctl.deployment import _FLEET_OUTPUTS, JOBS_STACK, Deployment, Fleet, fleets_from_outputs
from trainctl.errors import ExitCode, TrainctlError
from trainctl.fleet.cost import JobUsage, summarize, usage_of
from trainctl.fleet.verdict import last_verdict
from trainctl.inspecting.checkpoints import CheckpointFile, checkpoint_location, download
from trainctl.inspecting.logs import LogLine, NodeStream, StreamReader, interleave, parse_nodes
from trainctl.inspecting.why import explain
from trainctl.submitting.requests import grid_points, parse_grid, point_name, submit_request


# ----------------------------------------------------------------------------------------------- prices
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_catalog_type_has_a_price_with_source_and_date(name: str) -> None:
    price = PRICES[name]
    assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", price.as_of)
    assert price.source
    # Either a positive figure or an explicit "not published" / "not found", never a silent zero.
    assert (price.usd is None) == (price.source in (NOT_PUBLISHED, NOT_FOUND))
    assert price.usd is None or price.usd > 0


# AWS Price List API, us-east-1 EC2 offer of 2026-07-28 (OnDemand, Linux, Shared tenancy).
PRICE_LIST_FIGURES = {
    "p5.48xlarge": 55.04,
    "p4d.24xlarge": 21.957642,
    "trn1.32xlarge": 21.50,
    "p6-b200.48xlarge": 113.9328,
}


def test_prices_name_only_catalog_types() -> None:
    assert set(PRICES) == set(CATALOG)


def test_prices_match_the_price_list_and_capacity_block_only_types_have_none() -> None:
    for name, usd in PRICE_LIST_FIGURES.items():
        assert PRICES[name].usd == usd, name
    # Sold in us-east-1 only through Capacity Blocks: no on-demand SKU.
    assert PRICES["p5e.48xlarge"].usd is None
    assert PRICES["trn2.48xlarge"].usd is None
    # Sold on demand, but no figure two sources agree on: unpriced, and saying why.
    assert PRICES["g7.48xlarge"].usd is None and PRICES["g7.48xlarge"].source == NOT_FOUND


def test_prices_are_labelled_as_estimates() -> None:
    import config.prices

    assert "ESTIMATES" in (config.prices.__doc__ or "")


# ----------------------------------------------------------------------------------------------- cost
def usage(name: str, instance_type: str, nodes: int, hours: float, share: str = "(none)") -> JobUsage:
    return JobUsage(
        job_id=name,
        name=name,
        fleet="gpu",
        share=share,
        instance_type=instance_type,
        nodes=nodes,
        run_ms=int(hours * 3_600_000),
    )


def test_cost_keeps_unpriced_node_hours_apart_and_honours_overrides() -> None:
    usages = [usage("a", "g6.12xlarge", 2, 1.0, "llama"), usage("b", "p5e.48xlarge", 4, 0.5, "llama")]

    (row,) = summarize(usages, by="share", overrides={})
    assert row.node_hours == pytest.approx(4.0)
    assert row.usd == pytest.approx(2 * 4.6016)
    assert row.unpriced_node_hours == pytest.approx(2.0)

    (priced,) = summarize(usages, by="share", overrides={"p5e.48xlarge": 60.0, "g6.12xlarge": 1.0})
    assert priced.usd == pytest.approx(2 * 1.0 + 2 * 60.0)
    assert priced.unpriced_node_hours == 0


def test_a_job_that_never_started_costs_nothing() -> None:
    assert (
        usage_of({"jobId": "x", "status": "FAILED", "stoppedAt": 5}, fleet="gpu", instance_type="g6.12xlarge") is None
    )
    counted = usage_of(
        {"jobId": "y", "startedAt": 0, "stoppedAt": 1_800_000, "nodeProperties": {"numNodes": 3}},
        fleet="gpu",
        instance_type="g6.12xlarge",
    )
    assert counted is not None and counted.node_hours == pytest.approx(1.5)


def test_a_retried_job_costs_every_attempt() -> None:
    # Two attempts of 1 h and 30 min (a host lost mid-run, then the retry); the job's own startedAt and
    # stoppedAt span only the last one. An attempt that never ran has no start time.
    job = {
        "jobId": "z",
        "startedAt": 7_200_000,
        "stoppedAt": 9_000_000,
        "nodeProperties": {"numNodes": 2},
        "attempts": [
            {"startedAt": 0, "stoppedAt": 3_600_000},
            {"stoppedAt": 3_700_000},
            {"startedAt": 7_200_000, "stoppedAt": 9_000_000},
        ],
    }
    usage = usage_of(job, fleet="gpu", instance_type="g6.12xlarge")
    assert usage is not None and usage.node_hours == pytest.approx(2 * 1.5)


# ----------------------------------------------------------------------------------------------- requests
def test_request_without_overrides_has_no_node_overrides() -> None:
    assert submit_request(name="a", queue="q", definition="d") == {
        "jobName": "a",
        "jobQueue": "q",
        "jobDefinition": "d",
    }


def test_grid_points_vary_the_last_grid_fastest() -> None:
    grid = parse_grid(["A=1,2", "B=x,y,z"])
    assert [tuple(p.values()) for p in grid_points(grid)] == [
        ("1", "x"), ("1", "y"), ("1", "z"), ("2", "x"), ("2", "y"), ("2", "z"),
    ]  # fmt: skip


def test_grid_errors() -> None:
    with pytest.raises(TrainctlError, match="given twice"):
        parse_grid(["A=1", "A=2"])
    with pytest.raises(TrainctlError, match="NAME=v1,v2"):
        parse_grid(["A="])


def test_point_names_stay_valid_job_names() -> None:
    name = point_name("gpu", {"TASK": "Isaac-Velocity-Rough-H1-v0", "LR": "1e-3", "NOTE": "x" * 200})
    assert len(name) == 128
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name)


# ----------------------------------------------------------------------------------------------- logs
def test_interleave_orders_by_time_then_node() -> None:
    lines = interleave(
        [
            [LogLine(10, 0, "a"), LogLine(30, 0, "c")],
            [LogLine(10, 1, "b"), LogLine(20, 1, "x")],
        ]
    )
    assert [line.render() for line in lines] == ["[n0] a", "[n1] b", "[n1] x", "[n0] c"]


def test_stream_reader_reads_past_an_empty_page_until_the_token_repeats() -> None:
    # GetLogEvents may return an empty page with more events behind it; only a forward token equal to
    # the one passed in ends the stream (CloudWatch Logs API Reference, GetLogEvents). moto never
    # returns such a page, so botocore's Stubber plays the service.
    logs = boto3.client("logs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")  # noqa: S106
    stream = {"logGroupName": "/training/gpu", "logStreamName": "training/default/j1-node0", "startFromHead": True}

    def event(ms: int, message: str) -> dict[str, Any]:
        return {"timestamp": ms, "message": message, "ingestionTime": ms}

    with Stubber(logs) as stub:
        stub.add_response("get_log_events", {"events": [event(1, "first")], "nextForwardToken": "f/1"}, stream)
        stub.add_response("get_log_events", {"events": [], "nextForwardToken": "f/2"}, {**stream, "nextToken": "f/1"})
        stub.add_response(
            "get_log_events",
            {"events": [event(3, "after the gap")], "nextForwardToken": "f/3"},
            {**stream, "nextToken": "f/2"},
        )
        stub.add_response("get_log_events", {"events": [], "nextForwardToken": "f/3"}, {**stream, "nextToken": "f/3"})
        reader = StreamReader(logs, NodeStream(0, stream["logGroupName"], stream["logStreamName"]))
        assert [line.message for line in reader.read()] == ["first", "after the gap"]
        stub.assert_no_pending_responses()
        # The next read goes on from the last token: nothing new, one call.
        stub.add_response("get_log_events", {"events": [], "nextForwardToken": "f/3"}, {**stream, "nextToken": "f/3"})
        assert reader.read() == []
        stub.assert_no_pending_responses()


def test_parse_nodes() -> None:
    assert parse_nodes("all", 3) == [0, 1, 2]
    assert parse_nodes("2,0,2", 3) == [0, 2]
    for bad in ("one", "\u00b2", "3"):  # a word, a superscript digit (isdigit, not int), out of range
        with pytest.raises(TrainctlError):
            parse_nodes(bad, 3)


# ----------------------------------------------------------------------------------------------- verdict
def test_last_verdict_skips_broken_and_unrelated_json() -> None:
    messages = ['{"verdict": "degraded"}', "{not json", '{"busbw_gbps": 1}', "[1, 2]", "NCCL INFO {oops"]
    assert last_verdict(messages) == {"verdict": "degraded"}
    assert last_verdict(["no json here"]) is None


# ----------------------------------------------------------------------------------------------- why
RUNNABLE_JOB = {
    "jobId": "j",
    "status": "RUNNABLE",
    "createdAt": 0,
    "nodeProperties": {
        "numNodes": 2,
        "nodeRangeProperties": [
            {"container": {"resourceRequirements": [{"type": "VCPU", "value": "48"}, {"type": "GPU", "value": "8"}]}}
        ],
    },
}


def test_why_a_node_larger_than_the_instance_and_a_disabled_environment() -> None:
    environment = {
        "computeEnvironmentName": "gpu-ce",
        "state": "DISABLED",
        "status": "VALID",
        "computeResources": {"maxvCpus": 96, "desiredvCpus": 0},
    }
    explanation = explain(
        RUNNABLE_JOB, queue={}, environment=environment, instance=CATALOG["g6.12xlarge"], now=datetime.now(UTC)
    )
    assert any("8 GPUs, but a g6.12xlarge has 4" in r for r in explanation.reasons)
    assert any("gpu-ce is DISABLED" in r for r in explanation.reasons)
    assert (
        explanation.reasons[-1] == "the queue has no RUNNABLE time limit: the job waits until it starts or is cancelled"
    )


# ----------------------------------------------------------------------------------------------- outputs
def test_output_names_match_the_jobs_stack() -> None:
    """trainctl reads what stacks/jobs_stack.py and app.py name; a rename there must fail here."""
    jobs_stack = (ROOT / "stacks" / "jobs_stack.py").read_text()
    for suffix in _FLEET_OUTPUTS:
        assert f'("{suffix}", created.' in jobs_stack, suffix
    assert 'CfnOutput(self, "AlertTopic"' in jobs_stack
    prefix = re.search(r'^STACK_PREFIX = "(\w+)"', (ROOT / "app.py").read_text(), re.M)
    assert prefix is not None and f"{prefix.group(1)}Jobs" == JOBS_STACK


def test_fleets_from_outputs_reads_names_that_end_like_a_suffix() -> None:
    outputs = {}
    for prefix in ("Gpu", "Training", "Bench2"):
        outputs |= {f"{prefix}{s}": f"{prefix}-{s}" for s in _FLEET_OUTPUTS}
    outputs["HalfJobQueue"] = "incomplete fleet"
    fleets = fleets_from_outputs(outputs)
    assert sorted(fleets) == ["bench2", "gpu", "training"]
    assert fleets["training"].training_definition == "Training-TrainingJobDefinition"


# ----------------------------------------------------------------------------------------------- checkpoints
FLEET = Fleet(name="gpu", job_queue="q", training_definition="t", benchmark_definition="b", log_group="g")


def test_checkpoints_follow_the_jobs_uri_or_the_data_stacks_bucket() -> None:
    deployment = Deployment(region="us-east-1", fleets={"gpu": FLEET}, checkpoint_bucket="ckpt")
    with_uri = {
        "jobId": "j1",
        "nodeProperties": {
            "nodeRangeProperties": [
                {"container": {"environment": [{"name": "CHECKPOINT_URI", "value": "s3://team/runs/gpu/"}]}}
            ]
        },
    }
    assert checkpoint_location(with_uri, FLEET, deployment) == ("team", "runs/gpu/j1/")
    assert checkpoint_location({"jobId": "j2"}, FLEET, deployment) == ("ckpt", "gpu/j2/")


def test_download_into_a_place_that_cannot_be_written_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(TrainctlError, match="cannot write under"):
        download(None, "ckpt", "gpu/j1/", [CheckpointFile(0, "model.pt", 4, 0, None)], tmp_path / "file" / "out")


@pytest.mark.parametrize("name", ["../../../outside.pt", "../node-1/model.pt", "/etc/cron.d/x", "."])
def test_download_never_writes_outside_the_nodes_directory(tmp_path: Path, name: str) -> None:
    # A manifest entry that climbs out of node-0/ (even into another node's directory) is refused
    # before anything is fetched (no S3 client here).
    with pytest.raises(TrainctlError, match="outside"):
        download(None, "ckpt", "gpu/j1/", [CheckpointFile(0, name, 4, 0, None)], tmp_path / "out")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


# ----------------------------------------------------------------------------------------------- AWS errors
@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("ExpiredTokenException", "AWS refused the credentials (ExpiredTokenException): refresh them"),
        ("AccessDeniedException", "AWS DescribeJobs failed: not allowed"),
    ],
)
def test_aws_errors_become_one_line(code: str, says: str) -> None:
    error = botocore.exceptions.ClientError({"Error": {"Code": code, "Message": "not allowed\nmore"}}, "DescribeJobs")
    with pytest.raises(TrainctlError) as raised, aws_errors():
        raise error
    assert raised.value.code is ExitCode.AWS
    assert raised.value.message.startswith(says)
    assert "\n" not in raised.value.message


# ----------------------------------------------------------------------------------------------- package rules
def test_exit_codes_are_documented_in_the_jobs_page() -> None:
    jobs = (ROOT / "docs" / "jobs.md").read_text()
    section = jobs[jobs.index("## trainctl exit status") :]
    documented = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.M))
    assert documented == {str(code.value): code.name for code in ExitCode}


def test_trainctl_never_imports_cdk() -> None:
    for path in (ROOT / "trainctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("aws_cdk", "constructs", "cdk_nag") for n in names), path


def test_trainctl_keeps_few_modules_at_the_top() -> None:
    # What a user does has a subpackage (commands/ over submitting/, inspecting/, fleet/, rehearsal/); only
    # what every part shares stays at the top.
    top = [p for p in (ROOT / "trainctl").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()]
    assert len(top) <= 16, sorted(p.name for p in top)


def test_the_strict_type_check_covers_trainctl_and_the_launcher() -> None:
    # `make test` runs mypy --strict as its own step before the suite (Makefile `typecheck`); this pins
    # what it covers, so that a module cannot leave it unnoticed.
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert settings["strict"] is True
    assert {"trainctl", "container/launcher"} <= set(settings["files"])
    makefile = (ROOT / "Makefile").read_text()
    assert "test: bootstrap $(VENV)/.dev typecheck\n" in makefile and "\t$(BIN)/python -m mypy\n" in makefile


# ----------------------------------------------------------------------------------------------- daily-driver parts
def test_since_takes_a_span_back_from_now_or_a_date() -> None:
    from datetime import UTC, datetime, timedelta

    from trainctl.display import parse_since

    now = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    assert parse_since("7d", default=timedelta(0), now=now) == datetime(2026, 11, 17, 12, 0, tzinfo=UTC)
    assert parse_since("90m", default=timedelta(0), now=now) == datetime(2026, 11, 24, 10, 30, tzinfo=UTC)
    assert parse_since("2w", default=timedelta(0), now=now) == datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
    assert parse_since("2026-11-01", default=timedelta(0), now=now) == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_since(None, default=timedelta(hours=1), now=now) == datetime(2026, 11, 24, 11, 0, tzinfo=UTC)
    with pytest.raises(TrainctlError, match="30m, 12h, 7d, 2w"):
        parse_since("7 days", default=timedelta(0), now=now)
    # Spans reaching before year 1 overflow datetime: the same one line, not a traceback.
    for huge in ("99999999d", "99999999999999999w"):
        with pytest.raises(TrainctlError, match="30m, 12h, 7d, 2w"):
            parse_since(huge, default=timedelta(0), now=now)


def test_human_sizes_and_durations() -> None:
    from trainctl.display import human_duration, human_size

    assert [human_size(n) for n in (0, 1023, 1536, 5 * 1024**3)] == ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]
    assert [human_duration(ms) for ms in (40_000, 432_000, 7_500_000, 3 * 86_400_000 + 4 * 3_600_000)] == [
        "40s", "7m 12s", "2h 05m", "3d 4h",
    ]  # fmt: skip


def test_attempts_keep_the_definitions_retry_rules() -> None:
    from trainctl.submitting.preflight import retry_with_attempts

    # SubmitJob's retryStrategy replaces the definition's: without the rules, an application error retries.
    rules = [{"action": "RETRY", "onStatusReason": "Host EC2*"}, {"action": "EXIT", "onReason": "*"}]
    definition = {"retryStrategy": {"attempts": 3, "evaluateOnExit": rules}}
    assert retry_with_attempts(definition, 5) == {"attempts": 5, "evaluateOnExit": rules}
    assert definition["retryStrategy"]["attempts"] == 3


def test_a_share_identifier_with_a_star_covers_its_prefix() -> None:
    from trainctl.submitting.preflight import known_share

    identifiers = ["llama", "sweep*"]
    assert known_share("llama", identifiers) and known_share("sweepH1", identifiers)
    assert not known_share("lama", identifiers) and not known_share("llama2", identifiers)


def test_fleet_capacity_counts_a_whole_instance_per_node() -> None:
    from config.catalog import CATALOG
    from trainctl.deployment import Fleet
    from trainctl.fleet.compute import FleetCompute
    from trainctl.submitting.preflight import capacity, check_nodes

    environment = {"computeResources": {"maxvCpus": 384, "instanceTypes": ["p5.48xlarge"]}}
    # A node that asks for fewer vCPUs than the instance has still takes the whole instance.
    small = {"nodeProperties": {"nodeRangeProperties": [{"container": {"resourceRequirements": [
        {"type": "VCPU", "value": "8"}]}}]}}  # fmt: skip
    room = capacity(FleetCompute(None, environment), small)
    assert room is not None and room.vcpus_per_node == CATALOG["p5.48xlarge"].vcpus
    assert room.nodes == 384 // CATALOG["p5.48xlarge"].vcpus
    fleet = Fleet(name="gpu", job_queue="q", training_definition="t", benchmark_definition="b", log_group="g")
    check_nodes(fleet, room.nodes, room)
    with pytest.raises(TrainctlError, match=f"holds at most {room.nodes} nodes"):
        check_nodes(fleet, room.nodes + 1, room)
    # sweep has no --nodes option: its refusal names the job definition's count, not a flag it lacks.
    from trainctl.submitting.preflight import SWEEP

    with pytest.raises(TrainctlError) as refused:
        check_nodes(fleet, room.nodes + 1, room, inputs=SWEEP)
    assert str(refused.value).startswith(f"the job definition's nodes {room.nodes + 1}: fleet gpu holds at most")
    assert "pass --nodes" not in str(refused.value)
