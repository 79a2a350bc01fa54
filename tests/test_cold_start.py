"""Each node's cold-start line (container/launcher/cold_start.py, started by distributed_run.sh on ECS) against
a fake ECS task metadata v4 endpoint and a fake IMDS on 127.0.0.1, and without them."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from config import metrics
from tests.harness import ROOT

CONTAINER = ROOT / "container"
sys.path.insert(0, str(CONTAINER / "launcher"))
import cold_start  # noqa: E402

INSTANCE = "i-0123456789abcdef0"
# Field names and time format as in the ECS developer guide's task metadata v4 examples.
PULL_STARTED = "2026-11-23T09:00:00.100000000Z"
PULL_STOPPED = "2026-11-23T09:04:12.600000000Z"  # 252.5 s later


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


class Metadata(BaseHTTPRequestHandler):
    container_started = ""

    def reply(self, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v4/abc/task":
            self.reply({
                "Cluster": "arn:aws:ecs:us-west-2:123456789012:cluster/AWSBatch-gpu",
                "TaskARN": "arn:aws:ecs:us-west-2:123456789012:task/AWSBatch-gpu/1f2e",
                "LaunchType": "EC2",
                "PullStartedAt": PULL_STARTED,
                "PullStoppedAt": PULL_STOPPED,
                "Containers": [{"Name": "default", "StartedAt": self.container_started}],
            })  # fmt: skip
        elif self.path == "/v4/abc":
            self.reply({"Name": "default", "DockerId": "1f2e", "StartedAt": self.container_started})
        elif self.path == "/latest/meta-data/instance-id" and self.headers.get("X-aws-ec2-metadata-token") == "tok":
            self.reply(INSTANCE)
        else:
            self.send_error(404)

    def do_PUT(self) -> None:
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self.reply("tok")
        else:
            self.send_error(403)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def emf(stdout: str) -> dict[str, Any]:
    (line,) = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    return line


def metric_names(line: dict[str, Any]) -> list[str]:
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    return [m["Name"] for m in directive["Metrics"]]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ECS_", "MASTER_", "NPROC_"))}
    env.update(extra)
    return env


FAKE_TORCHRUN = """#!/bin/sh
# Stands in for "$PYTHON -m torch.distributed.run": after a pause (the rendezvous), one worker with
# the variables torch elastic gives its workers.
sleep 0.4
env TORCHELASTIC_RUN_ID=job LOCAL_RANK=0 sleep 0.8 &
wait
echo "ARGS: $*"
"""


def test_launcher_on_ecs_prints_one_line_with_every_number(tmp_path, endpoint):
    fake = tmp_path / "python.sh"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    efa = tmp_path / "infiniband"
    efa.mkdir()
    (efa / "uverbs0").touch()
    # The preflight also asks libfabric for its EFA provider (container/launcher/preflight.py).
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "fi_info").write_text("#!/bin/sh\necho 'provider: efa'\n")
    (tools / "fi_info").chmod(0o755)
    Metadata.container_started = rfc3339(time.time() - 3)
    env = clean_env(
        PYTHON=str(fake), COLD_START_PYTHON=sys.executable, NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1",
        AWS_BATCH_JOB_NUM_NODES="2", AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_ID="job#1",
        EFA_DEVICES="1", EFA_DEVICE_DIR=str(efa), TRAINING_FLEET="gpu", PATH=f"{tools}:{os.environ['PATH']}",
        ECS_CONTAINER_METADATA_URI_V4=f"{endpoint}/v4/abc", AWS_EC2_METADATA_SERVICE_ENDPOINT=endpoint,
    )  # fmt: skip
    result = subprocess.run(
        [str(CONTAINER / "distributed_run.sh"), "train.py"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    line = emf(result.stdout)
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == metrics.NAMESPACE
    assert [metrics.FLEET_DIMENSION, metrics.INSTANCE_DIMENSION] in directive["Dimensions"]
    assert line[metrics.FLEET_DIMENSION] == "gpu" and line[metrics.INSTANCE_DIMENSION] == INSTANCE
    assert line["NodeIndex"] == "1" and line["JobId"] == "job#1"
    assert sorted(metric_names(line)) == sorted(
        [metrics.COLD_START_IMAGE_PULL, metrics.COLD_START_CONTAINER_TO_LAUNCHER, metrics.COLD_START_PREFLIGHT,
         metrics.COLD_START_RENDEZVOUS]
    )  # fmt: skip
    assert all(m["Unit"] == "Seconds" for m in directive["Metrics"])
    assert line[metrics.COLD_START_IMAGE_PULL] == 252.5
    assert 2.5 < line[metrics.COLD_START_CONTAINER_TO_LAUNCHER] < 15
    assert 0 <= line[metrics.COLD_START_PREFLIGHT] < 5
    # The fake rendezvous takes 0.4 s before its worker appears; the watch polls every 0.5 s.
    assert 0.3 < line[metrics.COLD_START_RENDEZVOUS] < 10
    assert "ARGS: -m torch.distributed.run" in result.stdout


def test_without_a_metadata_endpoint_the_launcher_prints_no_line(tmp_path):
    fake = tmp_path / "python.sh"
    fake.write_text('#!/bin/sh\necho "ARGS: $*"\n')
    fake.chmod(0o755)
    result = subprocess.run(
        [str(CONTAINER / "distributed_run.sh"), "train.py"],
        env=clean_env(PYTHON=str(fake), NPROC_PER_NODE="1"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and not [x for x in result.stdout.splitlines() if x.startswith("{")]


def run_module(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CONTAINER / "launcher" / "cold_start.py"), "--launcher-start", str(time.time()), *args],
        env=clean_env(**env), capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_outside_ecs_the_line_has_what_can_be_observed_and_no_error():
    result = run_module("--preflight-seconds", "0.25", AWS_EC2_METADATA_DISABLED="true")
    assert result.returncode == 0 and result.stderr == ""
    line = emf(result.stdout)
    assert metric_names(line) == [metrics.COLD_START_PREFLIGHT] and line[metrics.COLD_START_PREFLIGHT] == 0.25
    assert line[metrics.INSTANCE_DIMENSION] == socket.gethostname() and line[metrics.FLEET_DIMENSION] == "unknown"


def test_a_metadata_endpoint_that_does_not_answer_is_not_an_error():
    down = closed_port()
    result = run_module(ECS_CONTAINER_METADATA_URI_V4=f"{down}/v4/abc", AWS_EC2_METADATA_SERVICE_ENDPOINT=down)
    assert result.returncode == 0
    assert metric_names(emf(result.stdout)) == []
    assert result.stderr.count("\n") == 1 and "task metadata unavailable" in result.stderr


def test_a_watched_process_that_exits_before_any_worker_reports_no_rendezvous():
    sleeper = subprocess.Popen(["sleep", "0.3"])
    result = run_module("--watch-pid", str(sleeper.pid), AWS_EC2_METADATA_DISABLED="true")
    sleeper.wait()
    assert result.returncode == 0 and metric_names(emf(result.stdout)) == []


def test_ecs_times_parse_with_nanoseconds_and_offsets():
    assert cold_start.parse_time(PULL_STOPPED) - cold_start.parse_time(PULL_STARTED) == pytest.approx(252.5)
    assert cold_start.parse_time("2026-11-23T10:00:00+01:00") == cold_start.parse_time("2026-11-23T09:00:00Z")
    with pytest.raises(ValueError, match="RFC 3339"):
        cold_start.parse_time("yesterday")


def test_names_are_the_shared_metric_names():
    assert cold_start.NAMESPACE == metrics.NAMESPACE
    assert (cold_start.FLEET_DIMENSION, cold_start.INSTANCE_DIMENSION, cold_start.FLEET_ENV) == (
        metrics.FLEET_DIMENSION, metrics.INSTANCE_DIMENSION, metrics.FLEET_ENV)  # fmt: skip
    assert (cold_start.IMAGE_PULL, cold_start.CONTAINER_TO_LAUNCHER, cold_start.PREFLIGHT, cold_start.RENDEZVOUS) == (
        metrics.COLD_START_IMAGE_PULL, metrics.COLD_START_CONTAINER_TO_LAUNCHER, metrics.COLD_START_PREFLIGHT,
        metrics.COLD_START_RENDEZVOUS)  # fmt: skip


def test_module_is_python_3_10_and_stdlib_only():
    source = (CONTAINER / "launcher" / "cold_start.py").read_text()
    tree = ast.parse(source, feature_version=(3, 10))
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules
    assert "datetime.UTC" not in source and "from datetime import UTC" not in source  # 3.11+


def test_images_carry_the_module():
    # The images copy the launcher's folder whole (tests/test_registry.py); the module is in it.
    assert (CONTAINER / "launcher" / "cold_start.py").is_file()
    for dockerfile in CONTAINER.glob("*/Dockerfile"):
        assert "COPY launcher/ /opt/training/launcher/" in dockerfile.read_text().splitlines(), dockerfile
    assert "!launcher/" in (CONTAINER / ".dockerignore").read_text().splitlines()
