"""A stand-in for Batch's DescribeJobs on 127.0.0.1 (POST /v1/describejobs, REST-JSON: botocore's batch model),
answering for node jobs `<id>#<n>` as Batch does, and ECS task metadata's /task; for tests/test_node_watch*.py."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@contextmanager
def batch_server() -> Iterator[tuple[Batch, str]]:
    """The stand-in on a free port of 127.0.0.1; yields it and its endpoint URL."""
    stub = Batch()
    http = ThreadingHTTPServer(("127.0.0.1", 0), stub.handler())
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield stub, f"http://127.0.0.1:{http.server_port}"
    finally:
        http.shutdown()


def aws_env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    env |= {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    return env | extra


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


def main_node(started: int) -> dict[str, Any]:
    return {"jobId": f"{JOB}#0", "status": "RUNNING", "startedAt": started}
