"""Short job handles (an id prefix, a name) in every command that takes JOB, `cancel --all` / `--name`, and
the `jobs` table that fits 80 columns (a long name elided in its middle, no id cut), on moto's AWS APIs on 127.0.0.1
(tests/trainctl_world.py)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from config.job_events import TRAINCTL_CANCEL_REASON
from tests.harness import ROOT
from tests.test_trainctl import ok_json, one_error_line  # fixtures
from tests.test_trainctl import trainctl as trainctl
from tests.test_trainctl import world as world
from tests.trainctl_world import World, moto_environment
from trainctl.cli import app
from trainctl.errors import ExitCode
from trainctl.fleet.capacity import SUCCESSOR_TAG
from trainctl.inspecting import handles
from trainctl.submitting.requests import SWEEP_TAG

STUB = ROOT / "tests" / "fixtures" / "rehearsal_node.sh"
UNFINISHED = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")


def counted_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues ListJobs is asked about while resolving handles, in order."""
    asked: list[str] = []
    real = handles.list_job_ids

    def list_job_ids(batch: Any, queue: str, **kwargs: Any) -> Any:
        asked.append(queue)
        return real(batch, queue, **kwargs)

    monkeypatch.setattr(handles, "list_job_ids", list_job_ids)
    return asked


# ----------------------------------------------------------------------------------------------- handles
def test_an_id_prefix_and_a_name_stand_for_the_job_in_every_job_command(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = world.submit("gpu", name="handle-solo")
    world.set_job(job_id, "RUNNABLE")
    prefix = job_id[:8]

    for handle in (prefix, "handle-solo", job_id[:13]):
        assert ok_json(trainctl("--json", "show", handle))["jobId"] == job_id
        assert ok_json(trainctl("--json", "why", handle))["jobId"] == job_id
    logs = trainctl("logs", prefix)
    assert logs.exit_code == 0 and f"no node of job {job_id} has a log stream yet" in logs.stderr, logs.output
    checkpoints = trainctl("--json", "checkpoints", "handle-solo")
    assert checkpoints.exit_code == 0, checkpoints.output
    monkeypatch.setattr("trainctl.commands.control.shutil.which", lambda _name: "/opt/bin/session-manager-plugin")
    monkeypatch.setattr("trainctl.inspecting.ecs_exec.plugin_version", lambda _plugin: (1, 2, 707, 0))
    # exec found the job (whole id in its refusal) and refused it only for not running.
    refusal = one_error_line(trainctl("exec", prefix), ExitCode.USAGE)
    assert job_id in refusal and "RUNNING" in refusal

    cancelled = ok_json(trainctl("--json", "cancel", "handle-solo"))
    assert cancelled["jobId"] == job_id and cancelled["terminated"]
    assert world.job(job_id).job_stopped_reason == TRAINCTL_CANCEL_REASON


def test_a_full_id_is_described_without_listing_and_a_prefix_lists_each_queue_once(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = world.submit("gpu", name="listed-a"), world.submit("trainium", name="listed-b")
    for job_id in (first, second):
        world.set_job(job_id, "RUNNING")
    asked = counted_listings(monkeypatch)

    assert ok_json(trainctl("--json", "why", first))["jobId"] == first
    assert asked == []

    # Two prefixes in one command: the recent jobs of each of the three queues are listed once.
    result = ok_json(trainctl("--json", "cancel", first[:10], second[:10]))
    assert [r["jobId"] for r in result] == [first, second]
    assert sorted(asked) == sorted(world.queues.values())


def test_an_ambiguous_name_is_one_line_naming_the_candidates(world: World, trainctl: Any) -> None:
    older, newer = world.submit("gpu", name="twin"), world.submit("trainium", name="twin")
    world.set_job(newer, "RUNNING")

    line = one_error_line(trainctl("show", "twin"), ExitCode.USAGE)

    assert "'twin' is ambiguous: 2 jobs match" in line and "longer id prefix" in line
    # Newest first, each by a short id that a later command takes.
    assert line.index(newer[:8]) < line.index(older[:8]) and "RUNNING" in line
    assert len(line) <= 200
    assert ok_json(trainctl("--json", "show", newer[:8]))["jobId"] == newer


def test_a_name_shared_along_a_capacity_fallback_lineage_stands_for_its_latest_job(world: World, trainctl: Any) -> None:
    successor = world.submit("gpu", name="moved-on")
    original = world.submit("gpu", name="moved-on", tags={SUCCESSOR_TAG: successor})
    world.set_job(original, "FAILED")
    world.set_job(successor, "RUNNING")

    assert ok_json(trainctl("--json", "why", "moved-on"))["jobId"] == successor


@pytest.mark.parametrize("handle", ["no-such-job", "0123abcd", "abc", "bad name!"])
def test_an_unknown_handle_is_one_line(trainctl: Any, handle: str) -> None:
    line = one_error_line(trainctl("why", handle), ExitCode.USAGE)
    assert line.startswith(f"trainctl: no job {handle!r} in us-east-1") and "8+ characters" in line
    assert len(line) <= 200


def test_refusals_echo_a_long_input_shortened_and_still_name_it(world: World, trainctl: Any) -> None:
    name = "w-echo-" + "n" * 121  # Batch's longest name: 128 characters
    world.submit("gpu", name=name), world.submit("trainium", name=name)
    lines = {
        "unknown": one_error_line(trainctl("why", "w-unknown-" + "u" * 118), ExitCode.USAGE),
        "ambiguous": one_error_line(trainctl("show", name), ExitCode.USAGE),
        "columns": one_error_line(trainctl("jobs", "-o", "id," + "c" * 150), ExitCode.USAGE),
        "port": one_error_line(trainctl("exec", "0123abcd", "--port", "6" * 150), ExitCode.USAGE),
    }
    assert all(len(line) <= 200 for line in lines.values()), lines
    assert lines["unknown"].startswith("trainctl: no job 'w-unknown-uuuuu") and "…' in us-east-1" in lines["unknown"]
    assert (
        lines["ambiguous"].startswith("trainctl: 'w-echo-nnnn")
        and "…' is ambiguous: 2 jobs match" in lines["ambiguous"]
    )
    assert lines["columns"].startswith("trainctl: -o 'id,cccc") and "…': the columns are id, " in lines["columns"]
    assert lines["port"].startswith("trainctl: --port '6666") and "…': give PORT or LOCAL:CONTAINER" in lines["port"]


def test_a_job_of_another_queue_is_found_by_its_full_id_only(world: World, trainctl: Any) -> None:
    theirs = world.client("batch").submit_job(
        jobName="foreign-handle", jobQueue=world.foreign_queue, jobDefinition=world.training["gpu"]
    )["jobId"]
    assert "no job 'foreign-handle'" in one_error_line(trainctl("why", "foreign-handle"), ExitCode.USAGE)
    assert f"no job {theirs[:8]!r}" in one_error_line(trainctl("why", theirs[:8]), ExitCode.USAGE)
    assert "queue someone-elses-queue" in one_error_line(trainctl("why", theirs), ExitCode.USAGE)


def test_short_ids_grow_past_eight_characters_only_where_two_ids_share_them() -> None:
    shared = "0123abcd-1111-4000-8000-000000000000"
    near = "0123abcd-1122-4000-8000-000000000000"
    alone = "fedcba98-0000-4000-8000-000000000000"
    assert handles.short_ids([shared, near, alone]) == {
        shared: "0123abcd-111",
        near: "0123abcd-112",
        alone: "fedcba98",
    }


def test_the_id_column_shows_the_full_id_of_a_job_too_old_for_a_prefix_to_find() -> None:
    from trainctl.inspecting.listing import table_lines

    now_ms = 100 * 86_400_000
    day_ms = 86_400_000
    recent = {"jobId": "0123abcd-1111-4000-8000-000000000000", "createdAt": now_ms - 29 * day_ms}
    old = {"jobId": "fedcba98-0000-4000-8000-000000000000", "createdAt": now_ms - 31 * day_ms}
    window_days = handles.RECENT.days
    assert 29 < window_days < 31  # the rows lie either side of the handles' window
    lines = [line.split()[0] for line in table_lines([recent, old], ("id",), now_ms=now_ms)]
    assert lines == ["ID", "0123abcd", old["jobId"]]


# ----------------------------------------------------------------------------------------------- cancel --all, --name
def answering(world: World, answer: str, *args: str) -> Any:
    """`trainctl ARGS` with `answer` typed at its prompt."""
    return CliRunner().invoke(app, list(args), input=answer, env=moto_environment(world.endpoint))


def our_unfinished(world: World) -> set[str]:
    batch = world.client("batch")
    return {
        str(s["jobId"])
        for queue in world.queues.values()
        for status in UNFINISHED
        for s in batch.list_jobs(jobQueue=queue, jobStatus=status)["jobSummaryList"]
    }


def test_cancel_all_stops_only_this_deployments_queued_and_running_jobs(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued, running = world.submit("gpu", name="all-queued"), world.submit("trainium", name="all-running")
    world.set_job(queued, "RUNNABLE")
    world.set_job(running, "RUNNING")
    finished = world.submit("gpu", name="all-finished")
    world.set_job(finished, "SUCCEEDED")
    theirs = str(
        world.client("batch").submit_job(
            jobName="all-theirs", jobQueue=world.foreign_queue, jobDefinition=world.training["gpu"]
        )["jobId"]
    )
    world.set_job(theirs, "RUNNING")

    # Without a terminal to ask on, --all needs --yes.
    line = one_error_line(trainctl("cancel", "--all"), ExitCode.USAGE)
    assert "pass --yes" in line
    assert {queued, running} <= our_unfinished(world)
    # On a terminal it lists the jobs and asks; "no" stops nothing.
    monkeypatch.setattr("trainctl.commands.control._terminal", lambda: True)
    declined = answering(world, "n\n", "cancel", "--all")
    assert declined.exit_code == ExitCode.USAGE and queued[:8] in declined.stderr and "all-running" in declined.stderr
    assert {queued, running} <= our_unfinished(world)

    expected = our_unfinished(world)
    confirmed = answering(world, "y\n", "--json", "cancel", "--all")
    # click's test runner echoes the typed answer on stdout's first line, where a terminal shows it.
    echoed, _, printed = confirmed.stdout.partition("\n")
    assert confirmed.exit_code == 0 and echoed.strip() == "y", confirmed.output
    result = json.loads(printed)

    assert {r["jobId"] for r in result} == expected
    assert all(world.job(job_id).job_stopped_reason == TRAINCTL_CANCEL_REASON for job_id in expected)
    assert world.job(theirs).job_stopped_reason is None and world.job(finished).job_stopped_reason is None
    # moto leaves a terminated job's state where it was: end them as Batch would.
    for job_id in expected:
        world.set_job(job_id, "FAILED", reason=TRAINCTL_CANCEL_REASON)
    assert "no queued or running job" in trainctl("cancel", "--all", "--yes").stderr


def test_cancel_all_refuses_other_selections(trainctl: Any) -> None:
    assert "--all takes no JOB" in one_error_line(trainctl("cancel", "--all", "--name", "x"), ExitCode.USAGE)


def test_cancel_by_name_stops_every_unfinished_job_with_exactly_that_name(world: World, trainctl: Any) -> None:
    first, second = world.submit("gpu", name="by-name"), world.submit("trainium", name="by-name")
    world.set_job(first, "RUNNABLE")
    world.set_job(second, "RUNNING")
    ended = world.submit("gpu", name="by-name")
    world.set_job(ended, "FAILED")
    other = world.submit("gpu", name="by-name-2")
    world.set_job(other, "RUNNING")

    result = ok_json(trainctl("--json", "cancel", "--name", "by-name"))

    assert sorted(r["jobId"] for r in result) == sorted([first, second])
    assert world.job(other).job_stopped_reason is None and world.job(ended).job_stopped_reason is None
    assert "no queued or running job" in trainctl("cancel", "--name", "by-nobody").stderr


# ----------------------------------------------------------------------------------------------- jobs table
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def terminal_of(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    """`jobs` prints to a colour terminal `width` columns wide."""
    monkeypatch.setattr(
        "trainctl.commands.inspecting.console",
        lambda: Console(width=width, force_terminal=True, color_system="standard", soft_wrap=True, highlight=False),
    )


def test_jobs_at_80_columns_keeps_every_default_column_whole(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Names as long as the docs' own examples, on the fleet with the longest name, in the widest state.
    done = world.submit("trainium", name="w80-h1-flat-lr-0.001-seed-3", tags={SWEEP_TAG: "sweep-20261126-0900"})
    world.set_job(done, "SUCCEEDED")
    queued = world.submit("gpu", name="w80-llama-8b-pretrain")
    world.set_job(queued, "RUNNABLE")
    terminal_of(monkeypatch, 80)

    result = trainctl("jobs", "--name", "w80-")

    assert result.exit_code == 0, result.output
    assert "\x1b[" in result.stdout  # coloured: it was printed as to a terminal
    lines = ANSI.sub("", result.stdout).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split() == ["ID", "NAME", "FLEET", "STATE", "NODES", "AGE"]
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]
    assert [row[:5] for row in rows] == [
        [queued[:8], "w80-llama-8b-pretrain", "gpu", "RUNNABLE", "2"],
        [done[:8], "w80-h1-flat-lr-0.001-seed-3", "trainium", "SUCCEEDED", "2"],
    ]
    assert all(re.fullmatch(r"\d+[smhd]", row[5]) for row in rows), rows


def test_no_cell_to_copy_is_ever_cut_on_a_narrow_terminal_or_piped(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "w-long-" + "x" * 113  # Batch's longest name: 128 characters
    sweep = "sweep-" + "y" * 60
    job_id = world.submit("gpu", name=name, tags={SWEEP_TAG: sweep})

    piped = trainctl("jobs", "--name", "w-long-", "--wide")
    assert piped.exit_code == 0, piped.output
    assert job_id in piped.stdout and name in piped.stdout and sweep in piped.stdout
    assert "…" not in piped.stdout

    terminal_of(monkeypatch, 80)
    narrow = ANSI.sub("", trainctl("jobs", "--name", "w-long-", "-o", "id,name,sweep").stdout)
    assert f"{job_id[:8]}  {name}  {sweep}" in narrow


def test_a_64_character_name_fits_80_columns_and_stays_whole_where_it_is_copied(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "w64-pretrain-llama-3-8b-fineweb-edu-lr3e-4-warmup2k-bs1024-seed7"
    assert len(name) == 64
    job_id = world.submit("trainium", name=name)
    world.set_job(job_id, "SUCCEEDED")

    # Piped, the default columns fit 80 as well.
    piped = trainctl("jobs", "--name", "w64-").stdout.splitlines()
    terminal_of(monkeypatch, 80)
    lines = ANSI.sub("", trainctl("jobs", "--name", "w64-").stdout).splitlines()

    for table in (piped, lines):
        assert all(len(line) <= 80 for line in table), table
        start, end = table[1].split()[1].split("…")
        assert name.startswith(start) and name.endswith(end) and len(end) >= 8, table
        assert table[1].split()[0] == job_id[:8]
    assert name in ANSI.sub("", trainctl("jobs", "--name", "w64-", "--wide").stdout)
    assert [r["name"] for r in ok_json(trainctl("--json", "jobs", "--name", "w64-"))] == [name]
    # The whole name is still the job's handle.
    assert ok_json(trainctl("--json", "why", name))["jobId"] == job_id


def test_jobs_columns_are_chosen_by_name(world: World, trainctl: Any) -> None:
    job_id = world.submit("gpu", name="w-chosen")
    lines = trainctl("jobs", "--name", "w-chosen", "-o", "job-id,tries").stdout.splitlines()
    assert lines[0].split() == ["JOB", "ID", "TRIES"] and lines[1].split() == [job_id, "1"]
    line = one_error_line(trainctl("jobs", "-o", "id,colour"), ExitCode.USAGE)
    assert "-o 'id,colour': the columns are id, job-id, name, fleet, state, nodes, age" in line
    assert "pass one of them" in one_error_line(trainctl("jobs", "--wide", "-o", "id"), ExitCode.USAGE)


# ----------------------------------------------------------------------------------------------- --json style
CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")
# Maps whose keys are data, not trainctl's names: tags, jobs by Batch state, environment names left out,
# the benchmark's verdict line as it printed it (check's `result`).
DATA_MAPS = {"tags", "jobs", "notRehearsed", "result"}


def snake_keys(value: Any, where: str = "") -> list[str]:
    """Every key of `value`, at any depth, that is not camelCase (with where it is)."""
    if isinstance(value, list):
        return [bad for i, item in enumerate(value) for bad in snake_keys(item, f"{where}[{i}]")]
    if not isinstance(value, dict):
        return []
    bad = [f"{where}.{k}" for k in value if not CAMEL.match(k)]
    return bad + [b for k, v in value.items() if not (k in DATA_MAPS and isinstance(v, dict))
                  for b in snake_keys(v, f"{where}.{k}")]  # fmt: skip


def test_every_commands_json_names_its_keys_in_camel_case(world: World, trainctl: Any, tmp_path: Path) -> None:
    done = world.submit("gpu", name="json-style", tags={SWEEP_TAG: "sweep-json"})
    world.set_job(done, "SUCCEEDED", started=datetime(2026, 3, 2, 8), stopped=datetime(2026, 3, 2, 9))
    world.add_node_streams(done, "gpu", {0: [(1_000, "hello")], 1: []})
    running = world.submit("gpu", name="json-running")
    world.set_job(running, "RUNNING")
    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\nnodes: 2\nname: json-task\n")
    outputs = {
        " ".join(args): ok_json(trainctl("--json", *args))
        for args in (
            ("status",), ("jobs", "--since", "3000d"), ("show", done), ("why", done), ("checkpoints", done),
            ("cost", "--since", "2026-03-01"), ("submit", "gpu", "--dry-run"), ("run", str(task), "--dry-run"),
            ("sweep", "gpu", "--grid", "LR=1,2", "--dry-run"), ("cancel", running),
        )
    }  # fmt: skip
    outputs["logs"] = [json.loads(line) for line in trainctl("--json", "logs", done).stdout.splitlines()]
    verdict = {"verdict": "healthy", "busbw_gbps": 30.0, "failing_nodes": [], "degraded_nodes": []}
    with world.benchmark_prints("gpu", [json.dumps(verdict)]):
        outputs["check"] = ok_json(trainctl("--json", "check", "gpu", "--poll-seconds", "0"))

    # The outputs hold what these keys name (an empty list would check nothing).
    listed = {row["jobId"]: row for row in outputs["jobs --since 3000d"]}
    assert outputs["status"][0]["instanceType"] and listed[done]["durationMs"] == 3_600_000
    assert outputs["show " + done]["usdEstimate"] is not None and outputs["cost --since 2026-03-01"]["rows"]
    assert outputs["check"]["busbwGbps"] == 30.0 and outputs["check"]["result"] == verdict and outputs["logs"]
    assert {k: snake_keys(v) for k, v in outputs.items() if snake_keys(v)} == {}


def test_a_rehearsals_json_names_its_keys_in_camel_case(trainctl: Any, tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    task = tmp_path / "task.yaml"
    task.write_text(json.dumps({"fleet": "gpu", "nodes": 2, "command": ["sh", str(STUB)], "launcher": False,
                                "env": {"STUB_DIR": str(records)}}))  # fmt: skip
    app_dir = tmp_path / "cdk.out"
    app_dir.mkdir()
    container = {"Command": ["false"], "Environment": [{"Name": "NCCL_DEBUG", "Value": "INFO"}]}
    template = {"Resources": {"Job": {"Type": "AWS::Batch::JobDefinition", "Properties": {"NodeProperties": {
        "NumNodes": 2, "MainNode": 0, "NodeRangeProperties": [{"TargetNodes": "0:", "Container": container}]}}}},
        "Outputs": {key: {"Value": {"Ref": "Job"}} for key in (
            "GpuTrainingJobDefinition", "GpuBenchmarkJobDefinition", "GpuJobQueue", "GpuLogGroup")}}  # fmt: skip
    (app_dir / "TrainingJobs.template.json").write_text(json.dumps(template))

    report = ok_json(trainctl("--json", "rehearse", str(task), "--app", str(app_dir), "--deadline", "60"))

    assert report["asExpected"] is True and report["jobs"][0]["attempts"][0]["exitCode"] == 0
    assert "detectSeconds" in report and report["notRehearsed"]
    assert snake_keys(report) == []
