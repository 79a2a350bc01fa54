"""trainctl's commands against AWS APIs served by moto on 127.0.0.1 (CloudFormation outputs, Batch,
CloudWatch Logs, S3), run in-process through typer's test runner; one smoke test runs the installed
console script."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.trainctl_world import CHECKPOINT_BUCKET, RUNNABLE_LIMIT_SECONDS, World, moto_environment, served_world
from trainctl.cli import app
from trainctl.errors import ExitCode


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with served_world() as world:
        yield world


@pytest.fixture
def trainctl(world: World) -> Any:
    """Run `trainctl ARGS` in-process against the world; returns click's Result."""
    runner = CliRunner()

    def run(*args: str, env: dict[str, str | None] | None = None) -> Any:
        return runner.invoke(app, list(args), env={**moto_environment(world.endpoint), **(env or {})})

    return run


def ok_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_error_line(result: Any, code: ExitCode) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trainctl: ")
    assert "Traceback" not in result.output
    return str(lines[0])


# ----------------------------------------------------------------------------------------------- status
def test_status_shows_each_fleet_from_the_outputs(world: World, trainctl: Any) -> None:
    runnable = world.submit("spare", name="waiting")
    world.set_job(runnable, "RUNNABLE")
    world.submit("spare", name="done")

    fleets = {row["fleet"]: row for row in ok_json(trainctl("--json", "status"))}

    assert set(fleets) == {"gpu", "trainium", "spare"}
    spare = fleets["spare"]
    assert spare["instanceType"] == "g6.12xlarge"
    assert spare["queueState"] == "ENABLED/VALID"
    assert spare["environmentState"] == "ENABLED/VALID"
    assert (spare["vcpus"], spare["maxvCpus"], spare["instances"]) == (0, 96, 0)
    assert {s: n for s, n in spare["jobs"].items() if n} == {"RUNNABLE": 1, "SUCCEEDED": 1}
    assert fleets["trainium"]["instanceType"] == "trn1.32xlarge"

    table = trainctl("status")
    assert table.exit_code == 0, table.output
    assert "RUNNABLE=1 SUCCEEDED=1" in table.stdout
    assert "0 of 96" in table.stdout


# ----------------------------------------------------------------------------------------------- submit
def test_submit_dry_run_prints_the_exact_request(world: World, trainctl: Any) -> None:
    result = trainctl(
        "submit", "gpu", "--nodes", "2", "--env", "TASK=Isaac-Velocity-Flat-H1-v0", "--env", "MAX_ITERATIONS=1000",
        "--timeout", "7200", "--name", "h1-flat-4", "--dry-run",
    )  # fmt: skip

    planned = ok_json(result)
    # The job runs on a revision carrying its nodes and environment (trainctl/submitting/revisions.py): a dry
    # run registers none, and names the deployed revision it would copy.
    assert planned.pop("jobDefinition").startswith(f"(a new revision of gpu-training-trainctl: {world.training['gpu']}")
    assert planned == {
        "jobName": "h1-flat-4",
        "jobQueue": world.queues["gpu"],
        "nodeOverrides": {
            "numNodes": 2,
            "nodePropertyOverrides": [
                {
                    "targetNodes": "0:",
                    "containerOverrides": {
                        "environment": [
                            {"name": "TASK", "value": "Isaac-Velocity-Flat-H1-v0"},
                            {"name": "MAX_ITERATIONS", "value": "1000"},
                        ]
                    },
                }
            ],
        },
        "timeout": {"attemptDurationSeconds": 7200},
    }
    # A dry run submits nothing.
    named = [{"name": "JOB_NAME", "values": ["h1-flat-4"]}]
    assert world.client("batch").list_jobs(jobQueue=world.queues["gpu"], filters=named)["jobSummaryList"] == []


def test_submit_warns_of_variables_that_defeat_the_efa_plugin_on_nvidia_fleets(world: World, trainctl: Any) -> None:
    knobs = ("--env", "NCCL_PROTO=simple", "--env", "FI_EFA_FORK_SAFE=1", "--env", "TASK=x")
    gpu = trainctl("submit", "gpu", *knobs, "--dry-run")
    # Neuron's samples ask for the libfabric settings: no warning on Trainium.
    neuron = trainctl("submit", "trainium", "--share", "llama", *knobs, "--dry-run")
    plain = trainctl("submit", "gpu", "--env", "TASK=x", "--dry-run")

    assert gpu.exit_code == neuron.exit_code == plain.exit_code == 0, gpu.output + neuron.output + plain.output
    (warning,) = [line for line in gpu.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: FI_EFA_FORK_SAFE, NCCL_PROTO set for an NVIDIA fleet: ")
    assert warning.endswith("(https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md)")
    # Submitted anyway, with the user's value.
    (override,) = ok_json(gpu)["nodeOverrides"]["nodePropertyOverrides"]
    assert {"name": "NCCL_PROTO", "value": "simple"} in override["containerOverrides"]["environment"]
    assert "warning:" not in neuron.stderr and "warning:" not in plain.stderr
    # EFA-GDA on a type the plugin does not run it on: refused before anything is sent.
    gin = trainctl("submit", "gpu", "--env", "NCCL_GIN_TYPE=5", "--dry-run")
    assert gin.exit_code == ExitCode.USAGE and "EFA-GDA runs on p5en.48xlarge" in gin.stderr


def test_submit_benchmark_with_a_share_on_a_fair_share_queue(world: World, trainctl: Any) -> None:
    request = ok_json(trainctl("submit", "trainium", "--job", "benchmark", "--share", "llama", "--dry-run"))

    assert request["shareIdentifier"] == "llama"
    assert request["jobDefinition"] == world.benchmark["trainium"]
    assert request["jobQueue"] == world.queues["trainium"]
    assert "nodeOverrides" not in request
    assert request["jobName"].startswith("trainium-benchmark-")


def test_share_errors_say_what_to_pass(trainctl: Any) -> None:
    missing = one_error_line(trainctl("submit", "trainium", "--dry-run"), ExitCode.USAGE)
    assert "fair share: pass --share" in missing
    extra = one_error_line(trainctl("submit", "gpu", "--share", "llama", "--dry-run"), ExitCode.USAGE)
    assert "drop --share" in extra


def test_bad_flag_values_are_refused_before_any_aws_call(trainctl: Any) -> None:
    # Nothing listens on port 9: had trainctl asked AWS first, it would exit 3, not 2.
    offline = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    for args, says in (
        (("submit", "gpu", "--env", "AWS_BATCH_JOB_ID=x"), "reserved for Batch"),
        (("submit", "gpu", "--timeout", "30"), "60 to 2147483647 seconds"),
        # attemptDurationSeconds is an API Integer (32 bits): Batch refuses this.
        (("submit", "gpu", "--timeout", "99999999999"), "60 to 2147483647 seconds"),
        (("submit", "gpu", "--name", "bad name"), "a job name is"),
        (("sweep", "gpu", "--grid", "LR"), "NAME=v1,v2"),
    ):
        assert says in one_error_line(trainctl(*args, "--dry-run", env=offline), ExitCode.USAGE)


def test_submit_watch_exits_with_the_jobs_outcome(world: World, trainctl: Any) -> None:
    # moto's docker-less Batch ends every job at once: SUCCEEDED, or FAILED when told to fail.
    succeeded = trainctl("submit", "gpu", "--name", "watched", "--watch", "--poll-seconds", "0")
    assert succeeded.exit_code == 0, succeeded.output
    job_id = succeeded.stdout.strip()
    assert world.job(job_id).job_name == "watched"
    assert f"{job_id} SUCCEEDED" in succeeded.stderr

    failed = trainctl(
        "--json", "submit", "gpu", "--watch", "--poll-seconds", "0", env={"MOTO_SIMPLE_BATCH_FAIL_AFTER": "0"}
    )
    assert failed.exit_code == ExitCode.JOB_FAILED, failed.output
    assert json.loads(failed.stdout)["status"] == "FAILED"


# ----------------------------------------------------------------------------------------------- sweep
def test_sweep_submits_one_named_job_per_point_with_one_sweep_tag(world: World, trainctl: Any) -> None:
    grid = ("--grid", "MAX_ITERATIONS=250,500", "--grid", "LR=0.1,0.01")
    planned = ok_json(trainctl("sweep", "gpu", *grid, "--dry-run"))
    assert [r["jobName"] for r in planned] == [
        "gpu-MAX_ITERATIONS-250-LR-0_1",
        "gpu-MAX_ITERATIONS-250-LR-0_01",
        "gpu-MAX_ITERATIONS-500-LR-0_1",
        "gpu-MAX_ITERATIONS-500-LR-0_01",
    ]
    assert planned[3]["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["environment"] == [
        {"name": "MAX_ITERATIONS", "value": "500"},
        {"name": "LR", "value": "0.01"},
    ]
    assert all("arrayProperties" not in r for r in planned)

    submitted = ok_json(trainctl("--json", "sweep", "gpu", *grid))
    jobs = world.client("batch").describe_jobs(jobs=[j["jobId"] for j in submitted["jobs"]])["jobs"]
    assert sorted(j["jobName"] for j in jobs) == sorted(r["jobName"] for r in planned)
    assert {j["tags"]["trainctl:sweep"] for j in jobs} == {submitted["sweep"]}


# ----------------------------------------------------------------------------------------------- logs
def test_logs_interleave_three_node_streams_in_time(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", definition=world.wide_gpu_definition, name="three-nodes")
    world.add_node_streams(
        job_id,
        "gpu",
        {
            0: [(1_000, "rendezvous on 10.0.0.5"), (4_000, "iteration 1 loss 0.9"), (7_000, "saved model_1.pt")],
            1: [(2_000, "joined as rank 4"), (5_000, "iteration 1 done")],
            2: [(3_000, "joined as rank 8"), (6_000, "iteration 1 done")],
        },
    )

    result = trainctl("logs", job_id)

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "[n0] rendezvous on 10.0.0.5",
        "[n1] joined as rank 4",
        "[n2] joined as rank 8",
        "[n0] iteration 1 loss 0.9",
        "[n1] iteration 1 done",
        "[n2] iteration 1 done",
        "[n0] saved model_1.pt",
    ]
    chosen = trainctl("logs", job_id, "--node", "0,2", "--follow", "--poll-seconds", "0")
    assert chosen.exit_code == 0, chosen.output
    assert [line[:4] for line in chosen.stdout.splitlines()] == ["[n0]", "[n2]", "[n0]", "[n2]", "[n0]"]
    assert "0..2" in one_error_line(trainctl("logs", job_id, "--node", "3"), ExitCode.USAGE)


def test_logs_follow_prints_new_lines_and_nodes_that_start_late(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = world.submit("gpu", definition=world.wide_gpu_definition, name="followed")
    world.set_job(job_id, "RUNNING")
    world.add_node_streams(job_id, "gpu", {0: [(1_000, "n0 first")], 1: [(2_000, "n1 first")]})

    def time_passes(_seconds: float) -> None:
        # Between two polls: node 2 starts and logs, node 0 logs again, the job ends.
        world.add_node_streams(job_id, "gpu", {2: [(3_000, "n2 first")]})
        world.append_log(job_id, "gpu", 0, 4_000, "n0 second")
        world.set_job(job_id, "SUCCEEDED")

    monkeypatch.setattr("trainctl.commands.base.sleep", time_passes)
    result = trainctl("logs", job_id, "--follow")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[n0] n0 first", "[n1] n1 first", "[n2] n2 first", "[n0] n0 second"]


def test_submit_follow_prints_each_nodes_log_then_why_and_exits_with_the_outcome(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole of `submit -f` on moto; the follow loop's cases are in tests/test_trainctl_follow.py."""
    from moto.batch_simple.models import BatchSimpleBackend

    submitted: list[str] = []
    original = BatchSimpleBackend.submit_job

    def submit_job(backend: Any, *args: Any, **kwargs: Any) -> Any:
        # moto's docker-less Batch ends a job at once: this one waits RUNNABLE instead.
        name, job_id, arn = original(backend, *args, **kwargs)
        world.set_job(job_id, "RUNNABLE")
        submitted.append(job_id)
        return name, job_id, arn

    steps = [
        lambda job_id: (
            world.set_job(job_id, "RUNNING"),
            world.add_node_streams(job_id, "gpu", {0: [(1_000, "rendezvous")], 1: [(2_000, "joined as rank 4")]}),
        ),
        lambda job_id: (world.append_log(job_id, "gpu", 0, 3_000, "saved"), world.set_job(job_id, "SUCCEEDED")),
    ]
    monkeypatch.setattr(BatchSimpleBackend, "submit_job", submit_job)
    monkeypatch.setattr("trainctl.commands.base.sleep", lambda _s: steps.pop(0)(submitted[0]))
    result = trainctl("submit", "gpu", "--name", "followed", "-f", "--poll-seconds", "0")

    assert result.exit_code == 0, result.output
    (job_id,) = submitted
    assert result.stdout.splitlines()[:5] == [
        job_id,
        "[n0] rendezvous",
        "[n1] joined as rank 4",
        "[n0] saved",
        f"{job_id} (followed) on fleet gpu: SUCCEEDED",
    ]
    assert [line.split()[2] for line in result.stderr.splitlines() if job_id in line] == [
        "RUNNABLE",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert steps == [] and world.job(job_id).status == "SUCCEEDED"


# ----------------------------------------------------------------------------------------------- why
def test_why_a_request_larger_than_the_compute_environment(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", definition=world.wide_gpu_definition, name="too-wide")
    created = datetime.now(UTC) - timedelta(minutes=20)
    # Batch's own reason for this job (Batch user guide, "Jobs stuck in a RUNNABLE status").
    reason = "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE"
    world.set_job(job_id, "RUNNABLE", created=created.replace(tzinfo=None), reason=reason)

    answer = ok_json(trainctl("--json", "why", job_id))

    assert answer["status"] == "RUNNABLE"
    batch_says, misfit, limit = answer["reasons"]
    assert "more vCPUs than the compute environment's maximum" in batch_says
    assert "3 nodes x 48 vCPUs = 144 vCPUs" in misfit
    assert "at most 96 vCPUs (2 nodes)" in misfit
    assert "--nodes 2" in misfit
    # Created 20 minutes ago with a 60-minute limit: cancelled in 40 minutes at the earliest.
    assert limit == (
        f"the queue will cancel the job after {RUNNABLE_LIMIT_SECONDS // 60} min RUNNABLE with "
        "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE: in 40 min at the earliest"
    )


def test_why_a_job_that_fits_is_waiting_for_instances(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="fits")
    world.set_job(job_id, "RUNNABLE")

    result = trainctl("why", job_id)

    assert result.exit_code == 0, result.output
    assert "nothing in the request or the compute environment rules the job out" in result.stdout
    assert "all 2 nodes" in result.stdout
    assert "vCPUs =" not in result.stdout
    assert "Batch reports none of them for this job yet" in result.stdout


def test_why_a_failed_job_gives_batchs_reason_in_plain_words(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="cancelled")
    # What Batch writes when the queue's time limit cancelled the job (Batch user guide).
    reason = "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
    world.set_job(job_id, "FAILED", reason=reason)

    reasons = ok_json(trainctl("--json", "why", job_id))["reasons"]

    assert "EC2 has no free capacity for the instance type" in reasons[0]


# ----------------------------------------------------------------------------------------------- cancel
def test_cancel_terminates_a_queued_job(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="to-cancel")
    world.set_job(job_id, "RUNNABLE")

    result = trainctl("cancel", job_id)

    assert result.exit_code == 0, result.output
    assert world.job(job_id).stop is True
    assert world.job(job_id).job_stopped_reason == "trainctl cancel: cancelled on request"
    finished = world.submit("gpu", name="already-done")
    assert "nothing to cancel" in trainctl("cancel", finished).stdout


# ----------------------------------------------------------------------------------------------- checkpoints
def _checkpoint_sync() -> Any:
    """container/launcher/checkpoint_store.py, the copier's S3 side, which writes the layout trainctl reads (it
    imports its neighbour)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "container" / "launcher"))
    try:
        import checkpoint_store
    finally:
        sys.path.pop(0)
    return checkpoint_store


def test_checkpoints_list_and_download_what_each_nodes_manifest_names(
    world: World, trainctl: Any, tmp_path: Path
) -> None:
    sync = _checkpoint_sync()
    job_id = world.submit("gpu", name="with-checkpoints")
    s3 = world.client("s3")
    s3.put_bucket_versioning(Bucket=CHECKPOINT_BUCKET, VersioningConfiguration={"Status": "Enabled"})
    uri = f"s3://{CHECKPOINT_BUCKET}/gpu/{job_id}"
    local = tmp_path / "trainer"
    written = {0: {"model_100.pt": b"weights", "params/agent.yaml": b"lr: 0.001"}, 1: {"model_100.pt": b"node one"}}
    mtimes: dict[tuple[int, str], int] = {}
    for node, files in written.items():
        # The way checkpoint_sync.py's watcher uploads (checkpoint_store.py): each file, then the node's manifest.
        store = sync.NodeStore(s3, uri, node)
        manifest = {}
        for name, body in files.items():
            path = local / str(node) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
            when = 1_700_000_000_123_456_789 + node
            os.utime(path, ns=(when, when))
            mtimes[(node, name)] = when
            manifest[name] = store.upload(path, name)
        store.write_manifest(manifest)
    # After node 0's manifest: a newer version of a named file and a file it does not name (an upload
    # that a kill cut short), and another job's prefix.
    s3.put_object(Bucket=CHECKPOINT_BUCKET, Key=f"gpu/{job_id}/node-0/model_100.pt", Body=b"half-written")
    s3.put_object(Bucket=CHECKPOINT_BUCKET, Key=f"gpu/{job_id}/node-0/model_200.pt", Body=b"cut short")
    s3.put_object(Bucket=CHECKPOINT_BUCKET, Key=f"gpu/{job_id}-other/node-0.manifest.json", Body=b"{}")

    out = tmp_path / "out"
    listed = ok_json(trainctl("--json", "checkpoints", job_id, "--download", str(out)))

    assert listed["uri"] == f"s3://{CHECKPOINT_BUCKET}/gpu/{job_id}/"
    assert sorted((f["node"], f["file"], f["bytes"]) for f in listed["files"]) == [
        (0, "model_100.pt", 7),
        (0, "params/agent.yaml", 9),
        (1, "model_100.pt", 8),
    ]
    assert all(f["versionId"] for f in listed["files"])
    for node, files in written.items():
        for name, body in files.items():
            target = out / f"node-{node}" / name
            # The manifest's version, not the newer half-written one; the mtime restore would set.
            assert target.read_bytes() == body
            assert target.stat().st_mtime_ns == mtimes[(node, name)]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "node-0/model_100.pt",
        "node-0/params/agent.yaml",
        "node-1/model_100.pt",
    ]
    table = trainctl("checkpoints", job_id)
    assert table.exit_code == 0, table.output
    assert "params/agent.yaml" in table.stdout and "manifest.json" not in table.stdout

    # A manifest entry that climbs out of its node's directory is refused; nothing is written.
    evil = sync.NodeStore(s3, uri, 2)
    evil.write_manifest({"../../escaped.pt": sync.Entry(4, 0, None)})
    s3.put_object(Bucket=CHECKPOINT_BUCKET, Key=f"gpu/{job_id}/escaped.pt", Body=b"evil")
    refused = tmp_path / "refused"
    line = one_error_line(trainctl("checkpoints", job_id, "--download", str(refused / "in")), ExitCode.USAGE)
    assert "refusing to write manifest entry '../../escaped.pt' of node 2" in line
    assert not (refused / "escaped.pt").exists() and not (tmp_path / "escaped.pt").exists()


# ----------------------------------------------------------------------------------------------- check
def _allreduce_bench() -> Any:
    """container/benchmark/allreduce_verdicts.py: the functions with which allreduce_bench.py makes its
    verdicts, node checks, metric line and summary line, without torch (importing torch costs seconds)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "container" / "benchmark"))
    try:
        import allreduce_verdicts
    finally:
        sys.path.pop(0)
    return allreduce_verdicts


NODE_GBPS = 400.0
# The fabric verdict's published runs (config/fabric_references.py): two p5.48xlarge nodes reached 441.81 and
# 436.95 GB/s busbw at 1 GiB (median 439.38).
INSTANCE_TYPE = "p5.48xlarge"
P5_GBYTES = 441.81


def bench_output(
    fabric_gbytes: float,
    node_gbytes: dict[str, float],
    wrong: dict[str, int] | None = None,
    instance_type: str = INSTANCE_TYPE,
    bisect: dict[str, Any] | None = None,
) -> list[str]:
    """What rank 0 of allreduce_bench.py --per-node prints after its table, made with its own functions:
    the node checks (node label -> average busbw in GB/s within that node), the embedded-metric line,
    the full report and, last, its short summary line (allreduce_bench.summary), which keeps the
    result whole where a log driver splits the full one at 16 KB. `fabric_gbytes` is busbw across the nodes
    at 1 GiB, the benchmark's largest size."""
    bench = _allreduce_bench()
    checks = [
        bench.node_check(label, 4, gbytes, (wrong or {}).get(label, 0), NODE_GBPS)
        for label, gbytes in node_gbytes.items()
    ]
    fabric = bench.fabric_verdict({1024**3: fabric_gbytes}, instance_type, len(checks))
    pairs = [str(bisect["verdict"])] if bisect and bisect["verdict"] else []
    final = bench.worst([str(fabric["verdict"]), *pairs, *(check.verdict for check in checks)])
    fabric_gbps = fabric_gbytes * 8
    short = {
        "verdict": final,
        "busbw_gbps": round(fabric_gbps, 3),
        "fabric": fabric,
        "failing_nodes": [c.node for c in checks if c.verdict in ("broken", "wrong-result")],
        "degraded_nodes": [c.node for c in checks if c.verdict == "degraded"],
        "slow_nodes": list(bisect["slow_nodes"]) if bisect else [],
    }
    full = {
        **short,
        "bisect": bisect,
        "world_size": 4 * len(checks),
        "nodes": len(checks),
        "correct": not wrong,
        "node_checks": [dataclasses.asdict(check) for check in checks],
    }
    return [
        "# per node (all nodes at once, each its own world)",
        *(f"#   {c.node}: {c.ranks} ranks, avg busbw {c.busbw_gbps:.3f} Gbps, {c.verdict}" for c in checks),
        bench.metric_line("gpu", fabric_gbps, final, short["slow_nodes"]),
        json.dumps(full),
        json.dumps(bench.summary(full)),  # the benchmark's own last line
    ]


HEALTHY_NODES = {"node 0 (ip-10-0-0-5)": 30.0, "node 1 (ip-10-0-1-7)": 31.0}


@pytest.mark.parametrize(
    ("lines", "fail", "code", "says"),
    [
        (["NCCL INFO NET/OFI Selected provider is efa", *bench_output(P5_GBYTES, HEALTHY_NODES)], False, 0,
         "fleet gpu: healthy (bus bandwidth 3534.48 Gbps; fabric healthy: 441.81 GB/s at 1 GiB against the "
         "published 439.38 GB/s (>= 90%))"),
        (bench_output(200.0, HEALTHY_NODES), False, ExitCode.UNHEALTHY,
         "fleet gpu: degraded (bus bandwidth 1600.0 Gbps; fabric degraded: 200.00 GB/s at 1 GiB against the "
         "published 439.38 GB/s (< 90%))"),
        # Nothing published for the type: the figures are reported, never passed.
        (bench_output(5.0, HEALTHY_NODES, instance_type="g6.12xlarge"), False, ExitCode.UNHEALTHY,
         "fleet gpu: uncalibrated (bus bandwidth 40.0 Gbps; fabric uncalibrated: no published reference for "
         "2 x g6.12xlarge)"),
        (["NCCL WARN NET/Plugin: Could not find: libnccl-net.so"], False, ExitCode.UNHEALTHY,
         "printed no verdict line"),
        (["torch.distributed.DistNetworkError: connection refused"], True, ExitCode.JOB_FAILED,
         "--node all`"),
    ],
)  # fmt: skip
def test_check_runs_the_benchmark_and_exits_on_its_verdict(
    world: World, trainctl: Any, lines: list[str], fail: bool, code: int, says: str
) -> None:
    failing = {"MOTO_SIMPLE_BATCH_FAIL_AFTER": "0"} if fail else None
    with world.benchmark_prints("gpu", lines) as submitted:
        result = trainctl("check", "gpu", "--poll-seconds", "0", env=failing)

    assert result.exit_code == code, result.output
    assert says in result.stdout
    assert world.job(submitted[0]).job_definition.arn == world.benchmark["gpu"]


def test_check_names_the_failing_and_degraded_nodes(world: World, trainctl: Any) -> None:
    # Node 1 reaches 1% of its GPUs' interconnect (broken), node 2 a fifth (degraded).
    nodes = {"node 0 (ip-10-0-0-5)": 30.0, "node 1 (ip-10-0-1-7)": 0.5, "node 2 (ip-10-0-2-9)": 10.0}
    with world.benchmark_prints("gpu", bench_output(P5_GBYTES, nodes)):
        table = trainctl("check", "gpu", "--poll-seconds", "0")
        result = json.loads(trainctl("--json", "check", "gpu", "--poll-seconds", "0").stdout)

    assert table.exit_code == ExitCode.UNHEALTHY, table.output
    assert table.stdout.strip() == (
        "fleet gpu: broken (bus bandwidth 3534.48 Gbps; fabric uncalibrated: no published reference for "
        "3 x p5.48xlarge; failing: node 1 (ip-10-0-1-7); degraded: node 2 (ip-10-0-2-9))"
    )
    assert result["verdict"] == "broken"
    assert result["failingNodes"] == ["node 1 (ip-10-0-1-7)"]
    assert result["degradedNodes"] == ["node 2 (ip-10-0-2-9)"]


def _bisected(count: int, slow: list[int]) -> dict[str, Any]:
    """The benchmark's pairs phase (container/benchmark/node_bisect.py) on a synthetic p5 fleet: a pair
    reaches its slower node's speed, 440 GB/s healthy, 20 GB/s slow."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "container" / "benchmark"))
    try:
        import node_bisect
    finally:
        sys.path.pop(0)
    speeds = [20.0 if node in slow else 440.0 for node in range(count)]
    result = node_bisect.bisect(
        count,
        lambda pairs: [min(speeds[a], speeds[b]) for a, b in pairs],
        node_bisect.pair_bar(INSTANCE_TYPE, 1024**3),
    )
    labels = [f"node {i} (ip-10-0-{i}-5)" for i in range(count)]
    entry = node_bisect.as_report(result, labels, 1024**3, 3.5)
    return {**entry, "verdict": "degraded" if result.named else None}


def test_check_names_the_node_the_pairs_bisected_to(world: World, trainctl: Any) -> None:
    nodes = {f"node {i} (ip-10-0-{i}-5)": 30.0 for i in range(4)}
    with world.benchmark_prints("gpu", bench_output(P5_GBYTES, nodes, bisect=_bisected(4, [2]))):
        table = trainctl("check", "gpu", "--poll-seconds", "0")
        result = json.loads(trainctl("--json", "check", "gpu", "--poll-seconds", "0").stdout)

    assert table.exit_code == ExitCode.UNHEALTHY, table.output
    assert table.stdout.strip().endswith("; slow node: node 2 (ip-10-0-2-5) by pairs in 2 rounds)"), table.output
    assert table.stdout.startswith("fleet gpu: degraded (")
    assert result["slowNodes"] == ["node 2 (ip-10-0-2-5)"]
    assert [len(r) for r in result["result"]["bisect"]["rounds"]] == [2, 2]


def test_check_says_why_the_pairs_named_no_node(world: World, trainctl: Any) -> None:
    nodes = {f"node {i} (ip-10-0-{i}-5)": 30.0 for i in range(4)}
    bisect = {**_bisected(4, [0, 1, 2, 3]), "verdict": "degraded"}
    with world.benchmark_prints("gpu", bench_output(P5_GBYTES, nodes, bisect=bisect)):
        table = trainctl("check", "gpu", "--poll-seconds", "0")

    assert table.exit_code == ExitCode.UNHEALTHY, table.output
    assert table.stdout.strip().endswith(
        "; pairs: slow node not found: every pair is below the bar: the fabric or every node, not one node)"
    ), table.output


def test_check_finds_the_verdict_on_whichever_node_held_rank_zero(world: World, trainctl: Any) -> None:
    # torch ranks nodes by their sorted addresses, so the report may come from a child node.
    nodes = {"node 0 (ip-10-0-0-5)": 30.0, "node 1 (ip-10-0-1-5)": 29.0}
    with world.benchmark_prints("gpu", bench_output(P5_GBYTES, nodes), node=1):
        result = trainctl("check", "gpu", "--poll-seconds", "0")

    assert result.exit_code == ExitCode.OK, result.output
    assert result.stdout.startswith("fleet gpu: healthy ("), result.output


def test_check_reports_the_verdict_of_a_benchmark_that_failed(world: World, trainctl: Any) -> None:
    # allreduce_bench exits 1 after a wrong result, verdict printed: the job ends FAILED.
    nodes = {"node 0 (ip-10-0-0-5)": 30.0, "node 1 (ip-10-0-1-7)": 31.0}
    lines = bench_output(P5_GBYTES, nodes, wrong={"node 1 (ip-10-0-1-7)": 3})
    with world.benchmark_prints("gpu", lines):
        result = trainctl("check", "gpu", "--poll-seconds", "0", env={"MOTO_SIMPLE_BATCH_FAIL_AFTER": "0"})

    assert result.exit_code == ExitCode.UNHEALTHY, result.output
    assert "fleet gpu: wrong-result (" in result.stdout
    assert "failing: node 1 (ip-10-0-1-7)" in result.stdout
    assert " FAILED" in result.stdout


def test_check_reads_the_last_verdict_line_among_others(world: World, trainctl: Any) -> None:
    lines = [
        json.dumps({"verdict": "degraded", "busbw_gbps": 5.0}),
        "[default0]:" + json.dumps({"metric": "cold_start", "seconds": 40}),
        *("[default0]:" + line for line in bench_output(P5_GBYTES, HEALTHY_NODES)),
    ]
    with world.benchmark_prints("gpu", lines):
        result = ok_json(trainctl("--json", "check", "gpu", "--poll-seconds", "0"))
    assert (result["verdict"], result["busbwGbps"]) == ("healthy", 3534.48)
    assert result["failingNodes"] == result["degradedNodes"] == []


# ----------------------------------------------------------------------------------------------- cost
def test_cost_is_node_hours_times_the_price(world: World, trainctl: Any) -> None:
    start = datetime(2026, 3, 2, 8, 0)
    for name, share, hours in (
        ("llama-pretrain", "llama", 1.5),
        ("vision-ft", "vision", 0.25),
        ("llama-eval", "llama", 0.5),
    ):
        job_id = world.submit("trainium", name=name, shareIdentifier=share)
        world.set_job(job_id, "SUCCEEDED", created=start, started=start, stopped=start + timedelta(hours=hours))
    # Retried after a lost host: attempts of 1 h and 30 min, both billed; the job's own times span the last.
    retried = world.submit("trainium", name="vision-retried", shareIdentifier="vision")
    hour = timedelta(hours=1)
    world.set_job(
        retried,
        "SUCCEEDED",
        created=start,
        started=start + 2 * hour,
        stopped=start + 2.5 * hour,
        attempts=[(start, start + hour), (start + 2 * hour, start + 2.5 * hour)],
    )
    waiting = world.submit("trainium", name="still-waiting", shareIdentifier="llama")
    world.set_job(waiting, "RUNNABLE", created=start)
    old = world.submit("trainium", name="last-year", shareIdentifier="llama")
    world.set_job(
        old, "SUCCEEDED", created=datetime(2025, 12, 1), started=datetime(2025, 12, 1), stopped=datetime(2025, 12, 2)
    )

    by_queue = ok_json(trainctl("--json", "cost", "--since", "2026-03-01", "--by", "queue"))
    trainium = next(r for r in by_queue["rows"] if r["key"] == "trainium")
    # 2 nodes each: (1.5 + 0.25 + 0.5 + 1 + 0.5) h x 2 = 7.5 node-hours of trn1.32xlarge at $21.50.
    assert trainium["nodeHours"] == pytest.approx(7.5)
    assert trainium["usd"] == pytest.approx(7.5 * 21.50, abs=0.01)
    assert trainium["jobs"] == 4
    assert by_queue["estimate"] is True

    by_share = ok_json(
        trainctl("--json", "cost", "--since", "2026-03-01", "--by", "share", "--price", "trn1.32xlarge=10")
    )
    shares = {r["key"]: r for r in by_share["rows"]}
    assert shares["llama"]["nodeHours"] == pytest.approx(4.0)
    assert shares["llama"]["usd"] == pytest.approx(40.0)
    assert shares["vision"]["usd"] == pytest.approx(5.0 + 30.0)

    table = trainctl("cost", "--since", "2026-03-01", "--by", "name")
    assert table.exit_code == 0, table.output
    assert "llama-pretrain" in table.stdout and "still-waiting" not in table.stdout and "last-year" not in table.stdout
    assert "not your bill" in table.stdout


# ----------------------------------------------------------------------------------------------- errors
def test_no_stacks_in_the_region(trainctl: Any) -> None:
    line = one_error_line(trainctl("--region", "eu-west-1", "status"), ExitCode.AWS)
    assert (
        line == "trainctl: no TrainingJobs stack in eu-west-1: deploy with `make deploy`, or pass the --region it is in"
    )


def test_no_credentials(trainctl: Any) -> None:
    result = trainctl("status", env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None})
    assert "no AWS credentials: pass --profile" in one_error_line(result, ExitCode.AWS)


def test_unknown_profile(trainctl: Any) -> None:
    line = one_error_line(trainctl("--profile", "ml-team", "status"), ExitCode.AWS)
    assert line == "trainctl: profile 'ml-team' is not in the AWS config: pass an existing --profile"


def test_unknown_fleet_lists_the_deployed_ones(trainctl: Any) -> None:
    line = one_error_line(trainctl("submit", "h100", "--dry-run"), ExitCode.USAGE)
    assert line == "trainctl: no fleet 'h100' in us-east-1: the deployed fleets are gpu, spare, trainium"


def test_a_job_that_is_not_ours(world: World, trainctl: Any) -> None:
    theirs = world.client("batch").submit_job(
        jobName="theirs", jobQueue=world.foreign_queue, jobDefinition=world.training["gpu"]
    )["jobId"]
    # One command that reads and one that acts; every job command goes through the same check.
    for command in ("why", "cancel"):
        line = one_error_line(trainctl(command, theirs), ExitCode.USAGE)
        assert "in queue someone-elses-queue, not one of this deployment's (fleets gpu, spare, trainium)" in line
        # The queue by its name, not its ARN: the line stays short (it was 217 characters).
        assert "arn:" not in line and len(line) <= 200
    assert "no job 'no-such-job'" in one_error_line(trainctl("why", "no-such-job"), ExitCode.USAGE)


# ----------------------------------------------------------------------------------------------- help
COMMANDS = ("status", "submit", "sweep", "logs", "why", "cancel", "checkpoints", "check", "cost")


def test_every_command_has_help(trainctl: Any) -> None:
    top = trainctl("--help")
    assert top.exit_code == 0
    for command in COMMANDS:
        assert command in top.stdout
        result = trainctl(command, "--help")
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith(f"Usage: trainctl {command}")
        assert "--poll-seconds" not in result.stdout
    assert "[n0], [n1]" in trainctl("logs", "--help").stdout
    assert "Exit status: 0 done" in top.stdout


def test_installed_console_script_makes_no_aws_call_for_help(world: World) -> None:
    script = Path(sys.executable).with_name("trainctl")
    assert script.exists(), (
        "trainctl is not installed in this venv: `make test` installs it (requirements-cli.txt, -e .)"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # Nothing listens on port 9: a call to AWS would fail; help must not make one.
    environment |= {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    result = subprocess.run(
        [str(script), "cost", "--help"], capture_output=True, text=True, env=environment, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: trainctl cost")
