"""container/node_watch.py against a stand-in Batch API on 127.0.0.1 that answers DescribeJobs (POST
/v1/describejobs, REST-JSON: botocore's batch model) as Batch does for node jobs `<id>#<n>`. The watcher
runs as the launcher runs it: its own process, boto3 finding the endpoint in AWS_ENDPOINT_URL; a `sleep`
stands in for the launcher, which SIGUSR1 ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT
from tests.test_launcher import LAUNCHER, base_env, free_port, launch

WATCHER = ROOT / "container" / "node_watch.py"
sys.path.insert(0, str(ROOT / "container"))
import node_watch  # noqa: E402

JOB = "5a1c-77"
ESSENTIAL = "Essential container in task exited"
PULL = "CannotPullContainerError: pull image manifest has been retried 1 time(s): failed to resolve ref"
HOST_LOST = "Host EC2 (instance i-0abc123) terminated."

Answer = Callable[[list[str]], tuple[int, dict[str, Any]]]


def running(ids: list[str]) -> tuple[int, dict[str, Any]]:
    return 200, {"jobs": [{"jobId": i, "status": "RUNNING", "startedAt": STARTED[0]} for i in ids]}


def now_ms() -> int:
    return int(time.time() * 1000)


# When this test's nodes started, in Batch's clock: the main node's startedAt, which children follow.
STARTED = [now_ms()]


class Batch:
    """The stand-in: `answer` decides each DescribeJobs reply; `calls` records the ids and signing regions."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        STARTED[0] = now_ms()
        self.answer: Answer = running
        self.calls: list[tuple[list[str], str]] = []
        self.task_arn = ""
        self.failed_shown: float | None = None  # when an answer first held a FAILED node job (monotonic)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        batch = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                ids = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["jobs"]
                # SigV4's credential scope: <key>/<date>/<region>/batch/aws4_request.
                scope = self.headers.get("Authorization", "").split("Credential=")[-1].split("/")
                batch.calls.append((ids, scope[2] if len(scope) > 2 else ""))
                assert self.path == "/v1/describejobs"
                status, body = batch.answer(ids)
                if batch.failed_shown is None and any(j.get("status") == "FAILED" for j in body.get("jobs", [])):
                    batch.failed_shown = time.monotonic()
                self.reply(status, body)

            def do_GET(self) -> None:  # ECS task metadata v4
                self.reply(200, {"TaskARN": batch.task_arn})

        return Handler


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Batch, str]]:
    stub = Batch()
    http = ThreadingHTTPServer(("127.0.0.1", 0), stub.handler())
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield stub, f"http://127.0.0.1:{http.server_port}"
    http.shutdown()


@pytest.fixture
def batch(server: tuple[Batch, str]) -> tuple[Batch, str]:
    stub, endpoint = server
    stub.reset()
    return stub, endpoint


def aws_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    env |= {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    return env | extra


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

    def stop(self) -> str:
        self.launcher.kill()
        self.launcher.wait()
        _, err = self.watcher.communicate(timeout=30)
        return err


def fail_after(calls: int, *entries: dict[str, Any]) -> Answer:
    """RUNNING children for the first `calls` calls, then these entries (the rest still RUNNING)."""
    seen = [0]

    def answer(ids: list[str]) -> tuple[int, dict[str, Any]]:
        seen[0] += 1
        if seen[0] <= calls:
            return running(ids)
        given = {e["jobId"]: e for e in entries}
        return 200, {"jobs": [given.get(i, running([i])[1]["jobs"][0]) for i in ids]}

    return answer


def failed(index: int, reason: str = ESSENTIAL, code: int | None = 137, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"jobId": f"{JOB}#{index}", "status": "FAILED", "statusReason": reason}
    entry |= {"startedAt": now_ms(), "stoppedAt": now_ms(), "container": {} if code is None else {"exitCode": code}}
    return entry | extra


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
    assert report == f"75 node 2: Batch says FAILED: {ESSENTIAL}, exit code 137\n", err
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
    assert report == f"75 node 1: Batch says FAILED: Task failed to start; {PULL}\n"


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
    assert report == f"75 node 2: Batch says FAILED: {HOST_LOST}\n"


def test_running_children_change_nothing(batch, tmp_path):
    stub, endpoint = batch
    run = Run(tmp_path, aws_env(endpoint), period="0.2")
    time.sleep(1.5)
    try:
        assert run.launcher.poll() is None
        assert not run.out.exists()
    finally:
        err = run.stop()
    assert len(stub.calls) >= 3
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


def main_node(started: int) -> dict[str, Any]:
    return {"jobId": f"{JOB}#0", "status": "RUNNING", "startedAt": started}


def test_a_previous_attempts_failed_node_and_a_child_that_succeeded_end_nothing(batch, tmp_path):
    stub, endpoint = batch
    old = now_ms() - 600_000
    stale = failed(1, startedAt=old, stoppedAt=old + 1000)  # before this attempt's main node started
    finished = {"jobId": f"{JOB}#2", "status": "SUCCEEDED", "startedAt": now_ms(), "container": {"exitCode": 0}}
    stub.answer = fail_after(0, main_node(now_ms() - 20_000), stale, finished)
    run = Run(tmp_path, aws_env(endpoint), period="0.2")
    time.sleep(1.5)
    try:
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
        deadline = time.monotonic() + 20
        while not stub.calls and time.monotonic() < deadline:
            time.sleep(0.05)
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
        deadline = time.monotonic() + 20
        while len(stub.calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
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


def two_nodes(tmp_path: Path, endpoint: str, main_trainer: str, **main_extra: str) -> tuple[dict[str, str], ...]:
    """Environments of a main node and a child on this host, each with a stand-in trainer (PYTHON): the child's
    writes `child-training` and sleeps; the main node's runs `main_trainer`."""
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "1"}
    nodes |= {"MASTER_PORT": str(free_port()), "NODE_REPORT_PORT": str(free_port()), "AWS_BATCH_JQ_NAME": "gpu"}
    for name, body in (("main", main_trainer), ("child", f"touch {tmp_path / 'child-training'}\nexec sleep 120")):
        (tmp_path / name).mkdir()
        trainer = tmp_path / f"{name}.sh"
        trainer.write_text(f"#!/bin/sh\n{body}\n")
        trainer.chmod(0o755)
    aws = {k: v for k, v in aws_env(endpoint).items() if k.startswith("AWS_")}
    main = base_env(**nodes, **aws, AWS_BATCH_JOB_ID=f"{JOB}#0", AWS_BATCH_JOB_NODE_INDEX="0")
    main |= {"PYTHON": str(tmp_path / "main.sh"), "NODE_STATE_DIR": str(tmp_path / "main")}
    main |= {"NODE_WATCH_PYTHON": sys.executable, **main_extra}
    child = base_env(**nodes, AWS_BATCH_JOB_ID=f"{JOB}#1", AWS_BATCH_JOB_NODE_INDEX="1")
    child |= {"PYTHON": str(tmp_path / "child.sh"), "NODE_STATE_DIR": str(tmp_path / "child")}
    return main, child


def kill_child_mid_training(tmp_path: Path, child_env: dict[str, str]) -> None:
    """The child's container is SIGKILLed (OOM, a lost host): every process at once, no EXIT trap, no report."""
    child = subprocess.Popen([str(LAUNCHER), "t.py"], env=child_env, start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (tmp_path / "child-training").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "child-training").exists(), "the child never started training"
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_launcher_a_child_killed_without_a_report_ends_the_main_node_with_75_naming_it(batch, tmp_path):
    stub, endpoint = batch
    main_env, child_env = two_nodes(tmp_path, endpoint, "exec sleep 120", NODE_WATCH_SECONDS="1")
    main = launch(main_env, "t.py")
    try:
        kill_child_mid_training(tmp_path, child_env)
        killed = time.monotonic()
        stub.answer = fail_after(0, failed(1))  # what Batch shows once ECS reports the container's exit
        _, err = main.communicate(timeout=60)
        ended = time.monotonic()
    finally:
        main.kill()
    assert main.returncode == 75, err
    line = f"distributed_run.sh: node 1: Batch says FAILED: {ESSENTIAL}, exit code 137; ending this job with exit 75"
    assert line in err
    assert stub.failed_shown is not None
    assert ended - killed < 5  # at most one 1 s poll, then the launcher stops its trainer
    assert not (tmp_path / "main" / "take-out").exists()  # the main node is healthy
    print(
        f"\nchild SIGKILLed mid-training -> main node exit 75 after {ended - killed:.2f} s with a 1 s poll; "
        f"{ended - stub.failed_shown:.2f} s of it from the FAILED answer to the exit"
    )


def test_launcher_a_main_trainer_that_crashes_first_still_ends_with_75_not_1(batch, tmp_path):
    """The lost peer breaks the main node's collectives before Batch shows the child FAILED: the main node's
    trainer exits 1, and the watcher, told so, asks every second through the launcher's report grace."""
    stub, endpoint = batch
    crashed = tmp_path / "peer-gone"
    trainer = f"while [ ! -e {crashed} ]; do sleep 0.1; done\necho 'NCCL error: remote process exited' >&2\nexit 1"
    main_env, child_env = two_nodes(tmp_path, endpoint, trainer, NODE_WATCH_SECONDS="600")
    main = launch(main_env, "t.py")
    try:
        kill_child_mid_training(tmp_path, child_env)
        crashed.touch()
        time.sleep(1)  # Batch is slower than the collectives
        stub.answer = fail_after(0, failed(1))
        shown = time.monotonic()
        _, err = main.communicate(timeout=60)
        seconds = time.monotonic() - shown
    finally:
        main.kill()
    assert main.returncode == 75, err
    assert "node 1: Batch says FAILED:" in err
    assert seconds < 3
    print(
        f"\nmain trainer crashed first; Batch showed the child FAILED 1 s later -> exit 75 after {seconds:.2f} s more"
    )
