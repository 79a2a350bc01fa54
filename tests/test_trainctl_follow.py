"""`submit`/`run --follow` (issue 57, item 6): every node's log until the job ends, then `why`'s summary and
the job's outcome as the exit status; Ctrl-C stops the following, never the job. Against fakes of Batch and
CloudWatch Logs held in memory (no waiting: the fake sleep moves the job on); tests/test_trainctl.py runs
`submit -f` whole on moto."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.trainctl_world import moto_environment
from trainctl.cli import app
from trainctl.commands.inspecting import follow_launched
from trainctl.deployment import Fleet
from trainctl.errors import ExitCode
from trainctl.inspecting.following import LogFollower, follow_to_end
from trainctl.inspecting.logs import LogLine, NodeStream

GROUP = "/training/gpu"


# ----------------------------------------------------------------------------------------------- the loop, on fakes
class FakeAws:
    """Batch's DescribeJobs and CloudWatch Logs' GetLogEvents over one multi-node job held in memory."""

    def __init__(self, nodes: int) -> None:
        self.job: dict[str, Any] = {
            "jobId": "j",
            "jobName": "h1-rough",
            "status": "RUNNABLE",
            "nodeProperties": {"numNodes": nodes},
        }
        self.node_streams: dict[int, str] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        # Every CancelJob and TerminateJob asked for.
        self.stops: list[str] = []

    def describe_job_queues(self, jobQueues: list[str]) -> dict[str, Any]:
        return {"jobQueues": []}

    def cancel_job(self, jobId: str, reason: str) -> None:
        self.stops.append(f"cancel {jobId}")

    def terminate_job(self, jobId: str, reason: str) -> None:
        self.stops.append(f"terminate {jobId}")

    def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
        found = []
        for job_id in jobs:
            if job_id == "j":
                found.append(dict(self.job))
            else:
                node = int(job_id.split("#")[1])
                stream = self.node_streams.get(node)
                found.append({"jobId": job_id, "container": {"logStreamName": stream} if stream else {}})
        return {"jobs": found}

    def get_log_events(self, **request: Any) -> dict[str, Any]:
        assert request["logGroupName"] == GROUP
        events = self.events.get(request["logStreamName"], [])
        if not request["startFromHead"]:
            # `why`'s look at a stream's last lines (trainctl/inspecting/recovery.py).
            return {"events": events[-request["limit"] :]}
        start = int(request.get("nextToken", "f/0").split("/")[1])
        # One page at a time, as GetLogEvents pages: the end is the token handed back unchanged.
        return {"events": events[start : start + 2], "nextForwardToken": f"f/{min(start + 2, len(events))}"}

    def log(self, node: int, stream: str, *lines: tuple[int, str]) -> None:
        self.node_streams[node] = stream
        self.events.setdefault(stream, []).extend({"timestamp": t, "message": m + "\n"} for t, m in lines)


def run_loop(aws: FakeAws, steps: list[Callable[[], None]]) -> tuple[dict[str, Any], list[str], list[str], list[int]]:
    """Follow the fake job; each sleep runs the next step. Returns the ended job, the lines shown, the states
    seen and the nodes said to have a new attempt's stream."""
    shown: list[str] = []
    states: list[str] = []
    new_streams: list[int] = []
    pending = list(steps)

    def sleep(seconds: float) -> None:
        assert seconds == 0.25 and pending, "the loop slept past the job's end"
        pending.pop(0)()

    def show(lines: list[LogLine]) -> None:
        shown.extend(line.render() for line in lines)

    def on_new_stream(stream: NodeStream) -> None:
        new_streams.append(stream.node)

    follower = LogFollower(aws, aws, GROUP, on_new_stream=on_new_stream)
    job = follow_to_end(aws, follower, "j", show=show, poll_seconds=0.25, sleep=sleep,
                        on_state=lambda j: states.append(j["status"]))  # fmt: skip
    assert not pending, "the loop ended before the job did"
    return job, shown, states, new_streams


def test_follow_shows_each_nodes_lines_in_order_as_nodes_start_until_the_job_succeeds() -> None:
    aws = FakeAws(nodes=2)

    def main_node_starts() -> None:
        aws.job["status"] = "RUNNING"
        aws.log(0, "a1-n0", (1_000, "rendezvous on 10.0.0.5"), (3_000, "step 1"), (3_500, "step 2"))

    def child_starts_later() -> None:
        aws.log(1, "a1-n1", (2_000, "joined as rank 4"), (4_000, "step 1 done"))
        aws.log(0, "a1-n0", (5_000, "step 3"))

    def job_ends() -> None:
        # Written just before the end: shown by the read after the last DescribeJobs.
        aws.log(0, "a1-n0", (6_000, "saved model_3.pt"))
        aws.job["status"] = "SUCCEEDED"

    job, shown, states, new_streams = run_loop(aws, [main_node_starts, child_starts_later, job_ends])

    assert job["status"] == "SUCCEEDED"
    assert states == ["RUNNABLE", "RUNNING", "SUCCEEDED"]
    assert shown == [
        "[n0] rendezvous on 10.0.0.5",
        "[n0] step 1",
        "[n0] step 2",
        "[n1] joined as rank 4",
        "[n1] step 1 done",
        "[n0] step 3",
        "[n0] saved model_3.pt",
    ]
    assert new_streams == []


def test_follow_reads_a_retried_jobs_next_attempt_after_the_end_of_the_last() -> None:
    aws = FakeAws(nodes=2)
    aws.job["status"] = "RUNNING"
    aws.log(0, "a1-n0", (1_000, "attempt 1 step 1"))
    aws.log(1, "a1-n1", (1_500, "attempt 1 joined"))

    def retried() -> None:
        # Batch sends the job back to RUNNABLE; each node keeps its last stream until the next attempt starts.
        aws.job["status"] = "RUNNABLE"

    def next_attempt() -> None:
        aws.job["status"] = "RUNNING"
        # The last attempt's final line lands as the next attempt's streams appear: read before the switch.
        aws.events["a1-n0"].append({"timestamp": 2_000, "message": "node 1 lost: exit 75"})
        aws.log(0, "a2-n0", (9_000, "attempt 2 restored step 1"))
        aws.log(1, "a2-n1", (9_500, "attempt 2 joined"))

    def ends() -> None:
        aws.job["status"] = "FAILED"

    job, shown, states, new_streams = run_loop(aws, [retried, next_attempt, ends])

    assert job["status"] == "FAILED"
    assert states == ["RUNNING", "RUNNABLE", "RUNNING", "FAILED"]
    assert shown == [
        "[n0] attempt 1 step 1",
        "[n1] attempt 1 joined",
        "[n0] node 1 lost: exit 75",
        "[n0] attempt 2 restored step 1",
        "[n1] attempt 2 joined",
    ]
    assert sorted(new_streams) == [0, 1]


# ----------------------------------------------------------------------------------------------- submit/run --follow
FLEET = Fleet(name="gpu", job_queue="gpu-queue", training_definition="t", benchmark_definition="b", log_group=GROUP)


def follow_fake(
    aws: FakeAws, steps: list[Callable[[], None]], monkeypatch: pytest.MonkeyPatch, *, as_json: bool = False
) -> tuple[int, list[str]]:
    """follow_launched on the fake job, each sleep running the next step: its exit status and the states
    it reported."""
    pending = list(steps)

    def sleep(_seconds: float) -> None:
        pending.pop(0)()

    monkeypatch.setattr("trainctl.commands.base.sleep", sleep)
    state = SimpleNamespace(batch=aws, aws=SimpleNamespace(client=lambda _service: aws), json=as_json)
    states: list[str] = []
    try:
        follow_launched(state, FLEET, "j", "h1-rough", poll_seconds=0, on_state=lambda j: states.append(j["status"]))
    except typer.Exit as ended:
        return ended.exit_code, states
    return 0, states


def running_then(aws: FakeAws, status: str, reason: str | None = None) -> list[Callable[[], None]]:
    def starts() -> None:
        aws.job["status"] = "RUNNING"
        aws.log(0, "a1-n0", (1_000, "rendezvous"), (3_000, "step 1"))
        aws.log(1, "a1-n1", (2_000, "joined as rank 4"))

    def ends() -> None:
        aws.log(0, "a1-n0", (4_000, "exiting"))
        aws.job["status"] = status
        if reason:
            aws.job["statusReason"] = reason

    return [starts, ends]


@pytest.mark.parametrize(
    ("status", "reason", "exit_status"),
    [("SUCCEEDED", None, 0), ("FAILED", "Essential container in task exited", ExitCode.JOB_FAILED)],
)
def test_follow_launched_prints_logs_then_why_and_exits_with_the_outcome(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    status: str,
    reason: str | None,
    exit_status: int,
) -> None:
    aws = FakeAws(nodes=2)
    code, states = follow_fake(aws, running_then(aws, status, reason), monkeypatch)

    assert code == exit_status
    assert states == ["RUNNABLE", "RUNNING", status]
    lines = capsys.readouterr().out.splitlines()
    assert lines[:5] == ["j", "[n0] rendezvous", "[n1] joined as rank 4", "[n0] step 1", "[n0] exiting"]
    # why's summary comes after the last log line.
    assert lines[5] == f"j (h1-rough) on fleet gpu: {status}"
    if reason:
        assert f"- Batch says: {reason}" in lines[6:]
    assert aws.stops == []


def test_follow_launched_with_json_prints_json_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = FakeAws(nodes=2)
    code, _ = follow_fake(aws, running_then(aws, "FAILED", "Essential container in task exited"), monkeypatch,
                          as_json=True)  # fmt: skip

    assert code == ExitCode.JOB_FAILED
    first, *logged, why = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first == {"jobId": "j", "jobName": "h1-rough", "fleet": "gpu"}
    assert [(line["node"], line["timestamp"], line["message"]) for line in logged] == [
        (0, 1_000, "rendezvous"), (1, 2_000, "joined as rank 4"), (0, 3_000, "step 1"), (0, 4_000, "exiting"),
    ]  # fmt: skip
    assert why["jobId"] == "j" and why["status"] == "FAILED"
    assert "Batch says: Essential container in task exited" in why["reasons"]


def test_ctrl_c_stops_following_not_the_job_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    aws = FakeAws(nodes=2)
    aws.job["status"] = "RUNNING"
    aws.log(0, "a1-n0", (1_000, "step 1"))

    def interrupted() -> None:
        raise KeyboardInterrupt

    code, _ = follow_fake(aws, [interrupted], monkeypatch)

    assert code == 130 == ExitCode.INTERRUPTED
    out, err = capsys.readouterr()
    # The lines so far, and no why summary: the job has not ended.
    assert out.splitlines() == ["j", "[n0] step 1"]
    last = err.splitlines()[-1]
    assert "the job goes on" in last and "`trainctl logs -f j`" in last and "`trainctl cancel j`" in last
    assert aws.stops == [] and aws.job["status"] == "RUNNING"


def test_follow_with_dry_run_is_refused_before_any_aws_call(tmp_path: Path) -> None:
    # Nothing listens on port 9: a command that asked AWS first would exit 3, not 2.
    offline = moto_environment("http://127.0.0.1:9")
    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\n")
    for args in (["submit", "gpu", "-f", "--dry-run"], ["run", str(task), "--dry-run", "--follow"]):
        result = CliRunner().invoke(app, args, env=offline)
        assert result.exit_code == ExitCode.USAGE, result.output
        assert result.stderr.strip() == (
            "trainctl: --follow with --dry-run: a dry run submits no job to follow; drop one of the two"
        )
