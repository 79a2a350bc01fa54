"""container/launcher/node_watch.py against a stand-in Batch API on 127.0.0.1 that answers DescribeJobs (POST
/v1/describejobs, REST-JSON: botocore's batch model) as Batch does for node jobs `<id>#<n>`. The watcher
runs as the launcher runs it: its own process, boto3 finding the endpoint in AWS_ENDPOINT_URL; a `sleep`
stands in for the launcher, which SIGUSR1 ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.batch_stub import (
    ESSENTIAL,
    HOST_LOST,
    JOB,
    PULL,
    Batch,
    aws_env,
    batch_server,
    fail_after,
    failed,
    main_node,
    now_ms,
)
from tests.harness import ROOT

WATCHER = ROOT / "container" / "launcher" / "node_watch.py"
# A FAILED child that told the main node nothing: a node fault (retried), said as such.
SILENT = "it died without telling the main node (killed, never started or its host lost)"
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import node_watch  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Batch, str]]:
    with batch_server() as running_server:
        yield running_server


@pytest.fixture
def batch(server: tuple[Batch, str]) -> tuple[Batch, str]:
    server[0].reset()
    return server


class Run:
    def __init__(self, tmp_path: Path, env: dict[str, str], nodes: int = 3, period: str = "0.3") -> None:
        self.launcher = subprocess.Popen(["sleep", "120"])
        self.out = tmp_path / "report"
        self.hurry = tmp_path / "trainer-failed"
        self.started = time.time()
        args = ["--job", JOB, "--nodes", str(nodes), "--main", "0", "--pid", str(self.launcher.pid)]
        args += ["--out", str(self.out), "--hurry", str(self.hurry), "--since", f"{self.started:.6f}"]
        self.watcher = subprocess.Popen(
            [sys.executable, str(WATCHER), *args, "--period", period],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_report(self, within: float) -> str:
        deadline = time.monotonic() + within
        while not self.out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.out.exists(), self.stop()
        return self.out.read_text()

    def wait_calls(self, stub: Batch, count: int) -> None:
        """Until the watcher has asked `count` times (its start, boto3's import, may be slow on a loaded host)."""
        deadline = time.monotonic() + 30
        while len(stub.calls) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(stub.calls) >= count, self.stop()

    def stop(self) -> str:
        self.launcher.kill()
        self.launcher.wait()
        _, err = self.watcher.communicate(timeout=30)
        return err


def test_a_child_killed_with_exit_137_ends_the_main_node_with_75_naming_it(batch, tmp_path):
    stub, endpoint = batch
    stub.answer = fail_after(2, failed(2))
    run = Run(tmp_path, aws_env(endpoint))
    try:
        report = run.wait_report(within=20)
        # The launcher got SIGUSR1 (its trap stops training and exits for the report).
        assert run.launcher.wait(timeout=5) == -signal.SIGUSR1
        seconds = time.time() - run.started
    finally:
        err = run.stop()
    assert report == f"75 node 2: Batch says FAILED: {ESSENTIAL}, exit code 137; {SILENT}\n", err
    assert run.watcher.returncode == 0
    # The main node's own node job (for its start time) and the children; every call signed for the region.
    assert {tuple(ids) for ids, _ in stub.calls} == {(f"{JOB}#0", f"{JOB}#1", f"{JOB}#2")}
    assert {region for _, region in stub.calls} == {"us-east-1"}
    # Two RUNNING rounds and the FAILED one, 0.3 s apart: the report follows the first FAILED answer.
    assert len(stub.calls) == 3
    print(f"\nwatcher: FAILED child reported {seconds:.1f} s after start (3 polls at 0.3 s)")


def test_a_child_whose_image_never_pulled_ends_the_main_node_with_75(batch, tmp_path):
    stub, endpoint = batch
    never_ran = failed(1, reason="Task failed to start", code=None, container={"reason": PULL})
    del never_ran["startedAt"]
    stub.answer = fail_after(0, never_ran)
    run = Run(tmp_path, aws_env(endpoint))
    try:
        report = run.wait_report(within=20)
    finally:
        run.stop()
    assert report == f"75 node 1: Batch says FAILED: Task failed to start; {PULL}; {SILENT}\n"


def test_a_lost_host_is_named_before_the_peers_that_crashed_with_exit_1_after_it(batch, tmp_path):
    stub, endpoint = batch
    # The peer's NCCL error stops it first; Batch notices the host later but this answer has both.
    echo = failed(1, code=1, stoppedAt=now_ms() - 5000)
    stub.answer = fail_after(0, echo, failed(2, reason=HOST_LOST, code=None))
    run = Run(tmp_path, aws_env(endpoint))
    try:
        report = run.wait_report(within=20)
    finally:
        run.stop()
    assert report == f"75 node 2: Batch says FAILED: {HOST_LOST}; {SILENT}\n"


def test_running_children_change_nothing(batch, tmp_path):
    stub, endpoint = batch
    run = Run(tmp_path, aws_env(endpoint), period="0.2")
    try:
        run.wait_calls(stub, 4)
        assert run.launcher.poll() is None
        assert not run.out.exists()
    finally:
        err = run.stop()
    assert err == ""


def test_access_denied_says_so_once_and_the_job_goes_on(batch, tmp_path):
    stub, endpoint = batch
    denied = {"__type": "AccessDeniedException", "message": "not authorized to perform: batch:DescribeJobs"}
    stub.answer = lambda ids: (403, denied)
    run = Run(tmp_path, aws_env(endpoint))
    try:
        assert run.watcher.wait(timeout=20) == 0
        assert run.launcher.poll() is None  # the launcher was not signalled
    finally:
        err = run.stop()
    assert not run.out.exists()
    assert len(stub.calls) == 1  # no retry can mend a refusal
    (line,) = err.splitlines()
    assert "(AccessDeniedException)" in line and "needs batch:DescribeJobs" in line and "training goes on" in line
    assert len(line) <= 200


def test_no_credentials_says_so_once_and_the_job_goes_on(batch, tmp_path):
    stub, endpoint = batch
    env = aws_env(endpoint)
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    run = Run(tmp_path, env)
    try:
        assert run.watcher.wait(timeout=30) == 0
        assert run.launcher.poll() is None
    finally:
        err = run.stop()
    assert stub.calls == []
    (line,) = err.splitlines()
    assert "cannot watch the child nodes in Batch (no AWS credentials)" in line


def test_throttling_and_server_errors_are_outlasted(batch, tmp_path):
    stub, endpoint = batch
    later = fail_after(0, failed(1, code=143))
    count = [0]

    def answer(ids: list[str]) -> tuple[int, dict[str, Any]]:
        count[0] += 1
        if count[0] <= 4:  # more than one call's standard retries (3 attempts)
            if count[0] % 2:
                return 400, {"__type": "ThrottlingException", "message": "Rate exceeded"}
            return 500, {"__type": "ServerException", "message": "internal error"}
        return later(ids)

    stub.answer = answer
    run = Run(tmp_path, aws_env(endpoint))
    try:
        report = run.wait_report(within=20)
    finally:
        err = run.stop()
    assert report.startswith("75 node 1: Batch says FAILED:")
    assert count[0] == 5
    # One line for the failing streak, one when Batch answers again: never a line per failure.
    lines = [x.split(" (")[0] for x in err.splitlines()]
    assert lines == ["node_watch.py: DescribeJobs failed", "node_watch.py: DescribeJobs answers again"]


def test_a_previous_attempts_failed_node_and_a_child_that_succeeded_end_nothing(batch, tmp_path):
    stub, endpoint = batch
    old = now_ms() - 600_000
    stale = failed(1, startedAt=old, stoppedAt=old + 1000)  # before this attempt's main node started
    finished = {"jobId": f"{JOB}#2", "status": "SUCCEEDED", "startedAt": now_ms(), "container": {"exitCode": 0}}
    stub.answer = fail_after(0, main_node(now_ms() - 20_000), stale, finished)
    run = Run(tmp_path, aws_env(endpoint), period="0.2")
    try:
        run.wait_calls(stub, 4)
        assert run.launcher.poll() is None
        assert not run.out.exists()
    finally:
        err = run.stop()
    assert err.splitlines() == ["node_watch.py: node 2: Batch says SUCCEEDED before the main node ended; not acted on"]


def test_a_child_that_started_before_the_launcher_but_after_the_main_node_is_this_attempts(batch, tmp_path):
    """The image's entrypoint may run for a while before the launcher does: what counts is the main node's
    startedAt in Batch, not the launcher's start."""
    stub, endpoint = batch
    started = now_ms() - 10_000
    stub.answer = fail_after(0, main_node(started), failed(1, startedAt=started + 5000, stoppedAt=now_ms()))
    run = Run(tmp_path, aws_env(endpoint))
    try:
        report = run.wait_report(within=20)
    finally:
        run.stop()
    assert report.startswith("75 node 1: Batch says FAILED:")


def test_a_childs_shared_fault_or_bad_input_keeps_its_own_code(batch, tmp_path):
    assert node_watch.verdict([node_watch.NodeJob(1, "FAILED", ESSENTIAL, 78)], 0) == (
        78, f"node 1: Batch says FAILED: {ESSENTIAL}, exit code 78")  # fmt: skip
    assert node_watch.verdict([node_watch.NodeJob(1, "FAILED", ESSENTIAL, 2)], 0)[0] == 2  # type: ignore[index]
    assert node_watch.verdict([node_watch.NodeJob(1, "FAILED", ESSENTIAL, 1)], 0)[0] == 75  # type: ignore[index]
    assert node_watch.verdict([node_watch.NodeJob(1, "RUNNING"), node_watch.NodeJob(2, "STARTING")], 0) is None


def test_the_trainers_failure_makes_the_watcher_ask_at_once(batch, tmp_path):
    stub, endpoint = batch
    run = Run(tmp_path, aws_env(endpoint), period="600")
    try:
        run.wait_calls(stub, 1)
        assert len(stub.calls) == 1  # the first round, at its start
        stub.answer = fail_after(0, failed(1))
        run.hurry.touch()
        hurried = time.monotonic()
        report = run.wait_report(within=10)
        assert time.monotonic() - hurried < 3
    finally:
        run.stop()
    assert report.startswith("75 node 1: Batch says FAILED:")


def test_the_region_comes_from_the_task_arn_when_no_variable_names_it(batch, tmp_path):
    stub, endpoint = batch
    stub.task_arn = "arn:aws:ecs:eu-west-1:123456789012:task/AWSBatch-gpu/0f1e2d"
    env = aws_env(endpoint, ECS_CONTAINER_METADATA_URI_V4=f"{endpoint}/v4/abc")
    del env["AWS_DEFAULT_REGION"]
    stub.answer = fail_after(0, failed(1))
    run = Run(tmp_path, env)
    try:
        run.wait_report(within=20)
    finally:
        run.stop()
    assert {region for _, region in stub.calls} == {"eu-west-1"}
    assert node_watch.region({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-east-1"}) == "us-west-2"
    assert node_watch.region({}) is None


def test_more_than_100_children_are_asked_in_calls_of_100(batch, tmp_path):
    stub, endpoint = batch
    run = Run(tmp_path, aws_env(endpoint), nodes=250)
    try:
        run.wait_calls(stub, 3)
    finally:
        run.stop()
    sizes = [len(ids) for ids, _ in stub.calls[:3]]
    assert sizes == [100, 100, 50]  # DescribeJobs takes at most 100 ids; 250 nodes
    assert {i for ids, _ in stub.calls[:3] for i in ids} == {f"{JOB}#{n}" for n in range(250)}


def test_a_bad_period_says_so_and_zero_turns_the_watch_off(tmp_path):
    for period, expected in (("0", ""), ("soon", "NODE_WATCH_SECONDS='soon' is not a number of seconds")):
        run = Run(tmp_path, aws_env("http://127.0.0.1:9"), period=period)
        assert run.watcher.wait(timeout=20) == 0
        err = run.stop()
        assert expected in err and (expected or err == "")
