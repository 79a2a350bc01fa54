"""The cloud build's reporter Lambda against a stand-in for the wait condition handle URL on 127.0.0.1,
and the build script CodeBuild runs, with stand-in `aws` and `docker` commands."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT
from training_constructs.images.build_reporter import report_build

BUILD_ID = "arn:aws:codebuild:us-west-2:123456789012:build/ImageBuildProject-x:8745a7a9-c340-456a"
LOG_LINK = "https://console.aws.amazon.com/cloudwatch/home?region=us-west-2#logEvent:group=/b;stream=8745a7a9"


class Handle(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append({"path": self.path, "content_type": self.headers.get("Content-Type"), "body": body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


REGION = "us-west-2"
# A handle URL in the shape CloudFormation presigns (its wait-condition bucket in the stack's region,
# the stack ARN as the key); the tests' stand-in for S3 listens on 127.0.0.1.
HANDLE_PATH = (
    "/arn%3Aaws%3Acloudformation%3Aus-west-2%3A123456789012%3Astack/TrainingRegistry/"
    "8745a7a9-c340-11f0-a669-0a344b714dd5/GpuImageHandle"
)
OPENED: list[str] = []  # every URL the reporter asked to open, through the `handle` fixture
HANDLE_URL = (
    f"https://cloudformation-waitcondition-us-west-2.s3.us-west-2.amazonaws.com{HANDLE_PATH}?X-Amz-Signature=abc"
)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    http = HTTPServer(("127.0.0.1", 0), type("H", (Handle,), {"received": received}))
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield http.server_port, received
    http.shutdown()


@pytest.fixture
def handle(server, monkeypatch) -> tuple[str, list[dict[str, Any]]]:
    """The reporter's PUT goes to the stand-in instead of S3, unchanged otherwise; any URL the
    reporter opens is recorded, so a refused one shows up as a request that should not exist."""
    port, received = server
    OPENED.clear()

    def forward(request: urllib.request.Request, timeout: float) -> int:
        OPENED.append(request.full_url)
        parts = urllib.parse.urlsplit(request.full_url)
        local = urllib.request.Request(
            f"http://127.0.0.1:{port}{parts.path}?{parts.query}",
            data=request.data,
            method=request.get_method(),
            headers=dict(request.header_items()),
        )
        with urllib.request.urlopen(local, timeout=timeout) as response:  # noqa: S310 - the local stand-in
            return int(response.status)

    monkeypatch.setattr(report_build, "_open", forward)
    monkeypatch.setenv("AWS_REGION", REGION)
    received.clear()
    return HANDLE_URL, received


def event(status: str, url: str | None, **extra: Any) -> dict[str, Any]:
    """A "CodeBuild Build State Change" event in the documented shape (CodeBuild user guide,
    "Build notifications input format reference")."""
    variables = [{"name": "IMAGE_TAG", "type": "PLAINTEXT", "value": "gpu-" + "a" * 64}]
    if url:
        variables.append({"name": "WAIT_HANDLE_URL", "type": "PLAINTEXT", "value": url})
    return {
        "detail-type": "CodeBuild Build State Change",
        "source": "aws.codebuild",
        "detail": {
            "build-status": status,
            "project-name": "ImageBuildProject-x",
            "build-id": BUILD_ID,
            "current-phase": "COMPLETED",
            "additional-information": {
                "environment": {"compute-type": "BUILD_GENERAL1_2XLARGE", "environment-variables": variables},
                "logs": {"group-name": "/b", "stream-name": "8745a7a9", "deep-link": LOG_LINK},
                **extra,
            },
        },
    }


def test_success_signals_the_handle_with_the_tag(handle):
    url, received = handle
    received.clear()
    result = report_build.handler(event("SUCCEEDED", url))
    assert result["reported"] is True and result["http"] == 200
    (put,) = received
    assert put["path"] == HANDLE_PATH + "?X-Amz-Signature=abc"
    # The presigned URL is signed for an empty Content-Type.
    assert put["content_type"] == ""
    body = json.loads(put["body"])
    assert body["Status"] == "SUCCESS" and body["UniqueId"] == BUILD_ID and body["Data"] == "gpu-" + "a" * 64


def test_failure_signals_a_reason_that_names_the_build_and_links_its_log(handle):
    url, received = handle
    received.clear()
    phases = [
        {"phase-type": "PROVISIONING", "phase-status": "SUCCEEDED"},
        {
            "phase-type": "BUILD",
            "phase-status": "FAILED",
            "phase-context": ["COMMAND_EXECUTION_ERROR: Error while executing command: bash -c ... exit status 1"],
        },
    ]
    report_build.handler(event("FAILED", url, phases=phases))
    body = json.loads(received[0]["body"])
    assert body["Status"] == "FAILURE"
    assert BUILD_ID in body["Reason"] and LOG_LINK in body["Reason"]
    assert "phase BUILD" in body["Reason"] and "COMMAND_EXECUTION_ERROR" in body["Reason"]


@pytest.mark.parametrize("status", ["TIMED_OUT", "STOPPED", "FAULT"])
def test_every_other_final_status_is_a_failure(handle, status):
    url, received = handle
    received.clear()
    report_build.handler(event(status, url))
    assert (
        json.loads(received[0]["body"])["Status"] == "FAILURE" and status in json.loads(received[0]["body"])["Reason"]
    )


def test_a_long_reason_keeps_the_log_link_whole():
    phases = [{"phase-type": "BUILD", "phase-status": "FAILED", "phase-context": ["x" * 10_000]}]
    reason = report_build.signal(event("FAILED", None, phases=phases)["detail"], {})["Reason"]
    assert len(reason) <= report_build.MAX_REASON and reason.endswith(LOG_LINK)


class FakeCodeBuild:
    """BatchGetBuilds in the API reference's shape; `variables` is what the build ran with."""

    def __init__(self, variables: list[dict[str, str]]) -> None:
        self.variables, self.asked = variables, []

    def batch_get_builds(self, ids: list[str]) -> dict[str, Any]:
        self.asked.append(ids)
        return {"builds": [{"id": ids[0], "environment": {"environmentVariables": self.variables}}]}


def test_an_event_without_the_handle_falls_back_to_the_builds_record(handle, monkeypatch):
    url, received = handle
    received.clear()
    fake = FakeCodeBuild([{"name": "WAIT_HANDLE_URL", "value": url, "type": "PLAINTEXT"}])
    monkeypatch.setattr(report_build, "codebuild_client", lambda: fake)
    without = event("FAILED", None)
    assert report_build.handler(without)["reported"] is True
    assert fake.asked == [[BUILD_ID]]
    assert json.loads(received[0]["body"])["Status"] == "FAILURE"


def test_builds_nobody_waits_for_and_unfinished_builds_are_left_alone(handle, monkeypatch):
    url, received = handle
    received.clear()
    monkeypatch.setattr(report_build, "codebuild_client", lambda: FakeCodeBuild([]))
    assert report_build.handler(event("SUCCEEDED", None))["reported"] is False
    assert report_build.handler(event("IN_PROGRESS", url))["reported"] is False
    assert received == []


REFUSED_HANDLES = {
    "plain http": HANDLE_URL.replace("https://", "http://"),
    "foreign host": HANDLE_URL.replace(
        "cloudformation-waitcondition-us-west-2.s3.us-west-2.amazonaws.com", "evil.example"
    ),
    "lookalike host": HANDLE_URL.replace(".amazonaws.com/", ".amazonaws.com.evil.example/"),
    "another region's bucket": HANDLE_URL.replace("us-west-2.s3.us-west-2", "us-east-1.s3.us-east-1"),
    "wrong path": HANDLE_URL.replace(HANDLE_PATH, "/some/other/object"),
    "another region's stack": HANDLE_URL.replace("cloudformation%3Aus-west-2", "cloudformation%3Aeu-west-1"),
    "a port": HANDLE_URL.replace(".amazonaws.com/", ".amazonaws.com:8443/"),
    "credentials": HANDLE_URL.replace("https://", "https://user:pw@"),
    "a file": "file:///etc/passwd",
    "instance metadata": "http://169.254.169.254/latest/meta-data/",
}


@pytest.mark.parametrize("url", REFUSED_HANDLES.values(), ids=REFUSED_HANDLES.keys())
def test_a_url_that_is_not_this_regions_wait_condition_handle_is_refused_and_nothing_sent(handle, url):
    _, received = handle
    result = report_build.handler(event("SUCCEEDED", url))
    assert result["reported"] is False and result["why"].startswith("WAIT_HANDLE_URL refused: ")
    with pytest.raises(ValueError, match="WAIT_HANDLE_URL refused, nothing sent"):
        report_build.put_signal(url, {"Status": "SUCCESS"}, REGION)
    assert received == [] and OPENED == []


@pytest.mark.parametrize(
    "url",
    [
        # CloudFormation user guide, "Create wait conditions", the curl example (us-east-1, slashes encoded).
        "https://cloudformation-waitcondition-us-east-1.s3.amazonaws.com/arn%3Aaws%3Acloudformation%3Aus-east-1"
        "%3A034017226601%3Astack%2Fstack-x%2Fe498ce60-70a1-11e0-81a7-5081d0136786%2FmyWaitConditionHandle?Expires=1",
        # The regional host forms handles carry in newer and older regions.
        "https://cloudformation-waitcondition-us-east-1.s3.us-east-1.amazonaws.com/arn%3Aaws%3Acloudformation%3A"
        "us-east-1%3A123456789012%3Astack/S/guid/H?X-Amz-Signature=x",
        "https://cloudformation-waitcondition-us-east-1.s3-us-east-1.amazonaws.com/arn%3Aaws%3Acloudformation%3A"
        "us-east-1%3A123456789012%3Astack/S/guid/H?Signature=x",
    ],
)
def test_the_handle_shapes_cloudformation_uses_are_accepted(url):
    assert report_build.handle_problem(url, "us-east-1") is None
    assert report_build.handle_problem(url, "us-west-2") is not None


# The build script, as CodeBuild runs it, with stand-ins that log their arguments and stdin.
BUILD_SCRIPT = ROOT / "training_constructs" / "images" / "build_image.sh"
STUB = """#!/usr/bin/env bash
printf '%s %s\\n' "$(basename "$0")" "$*" >> "$CALLS"
if [[ "$*" == *login*--password-stdin* ]]; then printf 'stdin=%s\\n' "$(cat)" >> "$CALLS"; fi
case "$(basename "$0") $*" in
  "aws ecr describe-images"*) exit "${EXISTS:-1}" ;;
  "aws ecr get-login-password"*) echo ecr-token ;;
  "docker build"*) echo "$BUILD_OUTPUT"; exit "${BUILD_STATUS:-0}" ;;
  "docker push"*) echo "$PUSH_OUTPUT"; exit "${PUSH_STATUS:-0}" ;;
esac
"""


def run_build(tmp_path: Path, docker_stub: str = STUB, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, stub in (("aws", STUB), ("docker", docker_stub)):
        (bin_dir / name).write_text(stub)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    base = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "REPOSITORY_URI": "123456789012.dkr.ecr.us-west-2.amazonaws.com/team",
        "REPOSITORY_NAME": "team",
        "IMAGE_TAG": "gpu-" + "b" * 64,
        "DOCKERFILE": "gpu/Dockerfile",
        "AWS_REGION": "us-west-2",
        "BUILD_OUTPUT": "built",
        "PUSH_OUTPUT": "pushed",
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=30, check=False
    )
    return result, calls.read_text()


def test_codebuilds_own_docker_builds_and_pushes_under_the_content_tag(tmp_path):
    result, calls = run_build(tmp_path)
    assert result.returncode == 0, result.stderr
    docker = [line for line in calls.splitlines() if line.startswith("docker ")]
    image = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/team:gpu-{'b' * 64}"
    assert docker == [
        "docker login --username AWS --password-stdin 123456789012.dkr.ecr.us-west-2.amazonaws.com",
        f"docker build --platform linux/amd64 --file gpu/Dockerfile --tag {image} .",
        f"docker push {image}",
    ]
    assert "nvcr.io" not in calls  # no key: an anonymous pull


def test_a_failed_push_fails_the_build(tmp_path):
    result, calls = run_build(tmp_path, PUSH_STATUS="1", PUSH_OUTPUT="denied: not authorized to push")
    assert result.returncode == 1 and "docker push" in calls
    assert "nvcr.io" not in result.stdout


def test_an_existing_tag_builds_nothing(tmp_path):
    result, calls = run_build(tmp_path, EXISTS="0")
    assert result.returncode == 0 and "exists; nothing to build" in result.stdout
    assert "docker" not in calls


def test_a_refused_anonymous_pull_says_which_secret_to_create(tmp_path):
    output = "ERROR: failed to resolve source metadata for nvcr.io/nvidia/isaac-lab:2.3.0: 401 Unauthorized"
    result, _ = run_build(tmp_path, BUILD_STATUS="1", BUILD_OUTPUT=output)
    assert result.returncode == 1
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("nvcr.io refused an anonymous pull") and "-c ngcSecret=" in last
    assert "aws secretsmanager create-secret" in last


def test_the_ngc_key_logs_in_to_nvcr_and_a_refusal_names_the_secret(tmp_path):
    output = "denied: nvcr.io/nvidia/isaac-lab: access forbidden"
    env = {"NGC_API_KEY": "nvapi-123", "NGC_SECRET": "ngc-api-key", "BUILD_STATUS": "1", "BUILD_OUTPUT": output}
    result, calls = run_build(tmp_path, **env)
    assert "docker login nvcr.io --username $oauthtoken --password-stdin\nstdin=nvapi-123" in calls
    assert result.returncode == 1 and "secret ngc-api-key" in result.stdout.strip().splitlines()[-1]


def test_other_build_failures_fail_without_the_ngc_line(tmp_path):
    result, _ = run_build(tmp_path, BUILD_STATUS="1", BUILD_OUTPUT="ERROR: process apt-get did not complete")
    assert result.returncode == 1 and "nvcr.io" not in result.stdout


def test_reporter_needs_only_what_lambdas_python_runtime_ships():
    source = Path(report_build.__file__).read_text()
    imports = {
        line.split()[1].split(".")[0] for line in source.splitlines() if line.strip().startswith(("import ", "from "))
    }
    assert imports <= {"__future__", "json", "os", "re", "urllib", "collections", "typing", "boto3"}, imports
