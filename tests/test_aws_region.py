"""The region the container's AWS clients name (container/launcher/aws_region.py): AWS_REGION, else
AWS_DEFAULT_REGION, else the ECS task metadata's TaskARN; and every S3 client of the container names it, so
that an ECS agent that sets neither variable (before aws/amazon-ecs-agent#4946) does not leave aws-cn's
buckets asked on us-east-1. The metadata endpoint is a local HTTP server on 127.0.0.1."""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import aws_region  # noqa: E402
import checkpoint_sync  # noqa: E402
import hang_evidence  # noqa: E402
import node_watch  # noqa: E402
import workdir_fetch  # noqa: E402

ARN = "arn:aws-cn:ecs:cn-northwest-1:123456789012:task/AWSBatch-gpu/0f1e2d"


@pytest.fixture
def metadata() -> Iterator[tuple[str, dict[str, str]]]:
    """A task metadata endpoint v4: GET <uri>/task answers {"TaskARN": task["arn"]}."""
    task = {"arn": ARN}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"TaskARN": task["arn"]}).encode() if self.path == "/v4/abc/task" else b"{}"
            self.send_response(200 if self.path == "/v4/abc/task" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v4/abc", task
    finally:
        server.shutdown()
        server.server_close()


def test_the_variables_come_first_then_the_task_arn(metadata):
    uri, task = metadata
    assert aws_region.region({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-east-1"}) == "us-west-2"
    assert aws_region.region({"AWS_DEFAULT_REGION": "eu-west-1", "ECS_CONTAINER_METADATA_URI_V4": uri}) == "eu-west-1"
    assert aws_region.region({"ECS_CONTAINER_METADATA_URI_V4": uri}) == "cn-northwest-1"
    assert aws_region.region({"ECS_CONTAINER_METADATA_URI_V4": uri + "/"}) == "cn-northwest-1"
    task["arn"] = "not-an-arn"
    assert aws_region.region({"ECS_CONTAINER_METADATA_URI_V4": uri}) is None
    assert aws_region.region({"ECS_CONTAINER_METADATA_URI_V4": uri + "/elsewhere"}) is None
    assert aws_region.region({}) is None
    # Nothing listens on port 9 of 127.0.0.1: no region, no traceback.
    assert aws_region.region({"ECS_CONTAINER_METADATA_URI_V4": "http://127.0.0.1:9/v4"}) is None
    assert node_watch.region is aws_region.region  # one rule for every client


class Asked(Exception):
    pass


def test_every_s3_client_of_the_container_names_the_region(metadata, monkeypatch, tmp_path):
    uri, _ = metadata
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ECS_CONTAINER_METADATA_URI_V4", uri)
    asked: list[tuple[str, str | None]] = []

    def client(service: str, region_name: str | None = None, **_: Any) -> Any:
        asked.append((service, region_name))
        raise Asked

    monkeypatch.setattr(boto3, "client", client)
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "stacks-rank-0.txt").write_text("stacks\n")
    assert hang_evidence.upload("s3://bucket/runs/evidence/", tmp_path / "evidence") == "Asked: "
    with pytest.raises(Asked):
        checkpoint_sync.main(["restore", "--uri", "s3://b/p/", "--node", "0", "--main", "0", "--state-dir",
                              str(tmp_path / "state"), str(tmp_path / "checkpoints")])  # fmt: skip
    with pytest.raises(Asked):
        workdir_fetch._get("bucket", "workdirs/x.tar.gz", "s3://bucket/workdirs/x.tar.gz", io.BytesIO())
    assert asked == [("s3", "cn-northwest-1")] * 3
