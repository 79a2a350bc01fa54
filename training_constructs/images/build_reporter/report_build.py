"""Lambda handler: report a finished image build to the CloudFormation wait condition that waits for it.

Invoked by an EventBridge rule on "CodeBuild Build State Change" events of the image build project
with a final status. The build carries the wait condition handle's presigned URL in its environment
variable WAIT_HANDLE_URL (set by the starter at deploy). Stdlib, plus the boto3 that Lambda's Python
runtime ships for the fallback lookup.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

HANDLE_VARIABLE = "WAIT_HANDLE_URL"
TAG_VARIABLE = "IMAGE_TAG"
# CodeBuild build statuses that end a build (CodeBuild API, Build.buildStatus).
FINAL_STATUSES = ("SUCCEEDED", "FAILED", "FAULT", "STOPPED", "TIMED_OUT")
# A reason short enough to read in cdk deploy's event output; the log link is always kept whole.
MAX_REASON = 4000
# A wait condition handle is a presigned S3 URL on CloudFormation's wait-condition bucket of the
# stack's region, its key the stack's ARN, URL-encoded (CloudFormation user guide, "Create wait
# conditions in a CloudFormation template", the curl example; handles seen in the wild use the
# hosts cloudformation-waitcondition-<region>.s3.amazonaws.com, .s3-<region>.amazonaws.com and
# .s3.<region>.amazonaws.com, with .com.cn in China). Anything else is not ours to PUT to.
_HANDLE_HOST = r"cloudformation-waitcondition-{region}\.s3(?:[.-]{region})?\.amazonaws\.com(?:\.cn)?"
_HANDLE_PATH = r"/arn%3Aaws(?:-[a-z]+)*%3Acloudformation%3A{region}%3A\d{{12}}%3Astack(?:/|%2F).+"


def _variables(detail: Mapping[str, Any]) -> dict[str, str]:
    # The event lists the build's environment variables, overrides included (CodeBuild user guide,
    # "Build notifications input format reference": additional-information.environment).
    env = detail.get("additional-information", {}).get("environment", {})
    return {v["name"]: str(v.get("value", "")) for v in env.get("environment-variables", []) if "name" in v}


def codebuild_client() -> Any:
    import boto3  # only for the fallback; Lambda's Python runtime includes it

    return boto3.client("codebuild")


def build_variables(detail: Mapping[str, Any]) -> dict[str, str]:
    """The build's environment variables from the event, or, should the event lack the handle, from
    the build's own record (CodeBuild API, BatchGetBuilds: environment.environmentVariables)."""
    variables = _variables(detail)
    if HANDLE_VARIABLE in variables or "build-id" not in detail:
        return variables
    builds = codebuild_client().batch_get_builds(ids=[detail["build-id"]]).get("builds", [])
    for build in builds:
        for variable in build.get("environment", {}).get("environmentVariables", []):
            variables.setdefault(variable["name"], str(variable.get("value", "")))
    return variables


def signal(detail: Mapping[str, Any], variables: Mapping[str, str]) -> dict[str, str]:
    """The wait condition signal for one build-state event (CloudFormation user guide, "Using
    wait condition handles": Status SUCCESS or FAILURE, Reason, UniqueId, Data)."""
    info = detail.get("additional-information", {})
    build_id = str(detail.get("build-id", "unknown build"))
    status = str(detail.get("build-status", "UNKNOWN"))
    tag = variables.get(TAG_VARIABLE, "")
    if status == "SUCCEEDED":
        return {"Status": "SUCCESS", "Reason": f"image {tag} built by {build_id}", "UniqueId": build_id, "Data": tag}
    link = info.get("logs", {}).get("deep-link") or "no log link in the event"
    failed = [p for p in info.get("phases", []) if p.get("phase-status") not in (None, "SUCCEEDED")]
    phase = failed[-1].get("phase-type") if failed else detail.get("current-phase", "unknown")
    context = " ".join(str(c) for c in failed[-1].get("phase-context", []) if c) if failed else ""
    reason = f"image build {build_id} ({tag}) ended {status} in phase {phase}"
    reason += f" ({context})" if context else ""
    reason += f"; log: {link}"
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - len(link) - 5] + " ... " + link
    return {"Status": "FAILURE", "Reason": reason, "UniqueId": build_id, "Data": ""}


def handle_problem(url: str, region: str) -> str | None:
    """Why `url` is not a wait condition handle of `region`, or None when it is one."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL"
    where = re.escape(region)
    if parts.scheme != "https":
        return f"scheme {parts.scheme or 'none'!r}, not https"
    if port not in (None, 443) or parts.username or parts.password:
        return "a port or credentials in the URL"
    if not re.fullmatch(_HANDLE_HOST.format(region=where), parts.hostname or ""):
        return f"host {parts.hostname!r} is not CloudFormation's wait-condition bucket in {region}"
    if not re.fullmatch(_HANDLE_PATH.format(region=where), parts.path, re.IGNORECASE):
        return f"path is not a stack's handle in {region}"
    return None


def _open(request: urllib.request.Request, timeout: float) -> int:
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - https, host checked
        return int(response.status)


def put_signal(url: str, body: Mapping[str, str], region: str, timeout: float = 30.0) -> int:
    """PUT the signal to the presigned handle URL, only if it is a handle of `region`. The signature
    covers an empty Content-Type, so the header is sent empty (CloudFormation user guide, "Using
    wait condition handles")."""
    problem = handle_problem(url, region)
    if problem:
        raise ValueError(f"{HANDLE_VARIABLE} refused, nothing sent: {problem}")
    request = urllib.request.Request(  # noqa: S310 - checked above
        url, data=json.dumps(body).encode(), method="PUT", headers={"Content-Type": ""}
    )
    return _open(request, timeout)


def handler(event: Mapping[str, Any], _context: object = None) -> dict[str, Any]:
    detail = event.get("detail", {})
    if detail.get("build-status") not in FINAL_STATUSES:
        return {"reported": False, "why": f"build status {detail.get('build-status')!r} is not final"}
    variables = build_variables(detail)
    url = variables.get(HANDLE_VARIABLE)
    if not url:
        # A build started by hand, not by a deploy: nothing waits for it.
        return {"reported": False, "why": f"build has no {HANDLE_VARIABLE}"}
    body = signal(detail, variables)
    # Lambda sets AWS_REGION to the function's region, the stack's (Lambda developer guide,
    # "Defined runtime environment variables").
    region = os.environ.get("AWS_REGION", "")
    problem = handle_problem(url, region)
    if problem:
        # Whoever may start a build can set the variable: never PUT to what it names. The deploy's
        # wait then times out, and this line in the reporter's log says why.
        print(json.dumps({"build": detail.get("build-id"), "refused": f"{HANDLE_VARIABLE}: {problem}"}))
        return {"reported": False, "why": f"{HANDLE_VARIABLE} refused: {problem}"}
    status = put_signal(url, body, region)
    print(json.dumps({"build": detail.get("build-id"), "signal": body["Status"], "http": status}))
    return {"reported": True, "signal": body, "http": status}
