"""The AWS endpoint a rehearsal's nodes see: moto's S3 on 127.0.0.1 for the checkpoint bucket, in this
process, started and stopped with the rehearsal, and Batch's DescribeJobs for the job's own node jobs
(`<job id>#<n>`), answered from what the rehearsal knows (moto's Batch has no multi-node jobs). A fault can
make S3 answer 503 SlowDown for a while (S3's throttling answer, which the SDKs retry), or call back when a
node starts writing a checkpoint file (to kill the node mid-upload)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from trainctl.errors import ExitCode, TrainctlError

REGION = "us-east-1"
# What every node and this process use: no real credential can reach the local server, and none of the
# user's reaches a node.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal", "AWS_DEFAULT_REGION": REGION}
# The key of the rehearsal's own requests (checkpoint polls, the report): moto takes any key.
OBSERVER_KEY = "rehearsal-observer"
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)

# (method, bucket, key) -> True to fail this request (the callback may kill its sender first).
UploadHook = Callable[[str, str, str], bool]
# Job ids -> the DescribeJobs entries of those the rehearsal knows (Batch API, DescribeJobs: unknown ids
# are left out of the answer).
Describe = Callable[[list[str]], list[dict[str, Any]]]
# The Batch API is REST-JSON: DescribeJobs is POST /v1/describejobs (botocore's batch service model).
DESCRIBE_JOBS_PATH = "/v1/describejobs"


class LocalS3:
    def __init__(self) -> None:
        try:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server
        except ImportError:
            raise TrainctlError(
                "trainctl rehearse needs moto's server for its local S3: `make bootstrap` installs it "
                "(or pip install -r requirements-rehearsal.txt)",
                ExitCode.USAGE,
            ) from None
        self._slow_until = 0.0
        self.throttled = 0
        self.hooks: list[UploadHook] = []
        self.describe: Describe = lambda ids: []
        self._client: Any = None

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # a line per request would bury the report

        backend = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._app(backend), threaded=True, request_handler=QuietHandler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="rehearsal-s3", daemon=True)

    def _app(self, backend: Any) -> Callable[..., Iterable[bytes]]:
        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            method = str(environ.get("REQUEST_METHOD", ""))
            if method == "POST" and environ.get("PATH_INFO") == DESCRIBE_JOBS_PATH:
                return self._describe_jobs(environ, start_response)
            bucket, _, key = str(environ.get("PATH_INFO", "")).lstrip("/").partition("/")
            # The rehearsal's own look at the bucket is not the nodes' traffic: faults leave it alone.
            observer = f"Credential={OBSERVER_KEY}/" in str(environ.get("HTTP_AUTHORIZATION", ""))
            if time.monotonic() < self._slow_until and not observer:
                self.throttled += 1
                start_response("503 Slow Down", [("Content-Type", "application/xml")])
                return [_SLOW_DOWN]
            if method == "PUT" and key and not observer and any(hook(method, bucket, key) for hook in list(self.hooks)):
                start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
                return [b"<Error><Code>InternalError</Code><Message>rehearsal: upload cut</Message></Error>"]
            result: Iterable[bytes] = backend(environ, start_response)
            return result

        return app

    def _describe_jobs(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            ids = [str(i) for i in json.loads(environ["wsgi.input"].read(length) or b"{}").get("jobs", [])]
        except (ValueError, AttributeError):
            start_response("400 Bad Request", [("Content-Type", "application/json")])
            return [b'{"__type": "ClientException", "message": "rehearsal: not a DescribeJobs request"}']
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"jobs": self.describe(ids)}).encode()]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that never started otherwise
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def slow_down(self, seconds: float) -> None:
        self._slow_until = time.monotonic() + seconds

    def client(self) -> Any:
        """The rehearsal's own client (one, made once): its requests are never throttled or cut."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                region_name=REGION,
                aws_access_key_id=OBSERVER_KEY,
                aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                config=Config(retries={"max_attempts": 2, "mode": "standard"}),
            )
        return self._client

    def create_bucket(self, name: str) -> None:
        """A versioned bucket, as the deployed checkpoint bucket is (checkpoint_sync keeps version ids)."""
        client = self.client()
        client.create_bucket(Bucket=name)
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})

    def keys(self, bucket: str, prefix: str) -> list[str]:
        try:
            pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            return sorted(str(item["Key"]) for page in pages for item in page.get("Contents", []))
        except Exception:  # a 503 a fault asked for: the report says none were found
            return []

    def manifest_files(self, bucket: str, prefix: str) -> list[str]:
        """The checkpoints the manifests under `prefix` list (container/launcher/checkpoint_sync.py's layout:
        `node-<i>.manifest.json` beside `node-<i>/`): each file directly in the checkpoint folder by name, and
        each folder there once, as `NAME/`, however many files of it any node listed; empty when there are
        none."""
        return sorted(self.manifest_saves(bucket, prefix))

    def manifest_saves(self, bucket: str, prefix: str) -> dict[str, int | None]:
        """manifest_files, each with the save it lists: a file's mtime (a file saved again in place lists a
        new one), None for a folder."""
        client = self.client()
        saves: dict[str, int | None] = {}
        try:
            listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/").get("Contents", [])
            for item in listed:
                if str(item["Key"]).endswith(".manifest.json"):
                    body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                    files = json.loads(body).get("files", {})
                    for name, entry in (files if isinstance(files, dict) else {}).items():
                        if "/" in name:
                            saves[name.partition("/")[0] + "/"] = None
                        else:  # several nodes may list one name: the newest save counts
                            mtime = int(entry.get("mtime_ns", 0)) if isinstance(entry, dict) else 0
                            saves[name] = max(saves.get(name) or 0, mtime)
        except Exception:  # a 503 a fault asked for, a manifest being replaced: ask again next time
            return {}
        return saves
