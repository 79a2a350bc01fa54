"""The app's own Lambda code, run by the rehearsal where the story needs it: the capacity fallback's
resubmitter (training_constructs/jobs/capacity_fallback/resubmit.py), fed the cancelled job as DescribeJobs
would show it, and the budget enforcement's TerminateJob reason (training_constructs/budgets/). Both are
loaded by path: they are Lambda assets, not part of the trainctl package."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.rehearsal.definition import JobSpec, NodeSettings, RetryRule

RESUBMIT = Path("training_constructs/jobs/capacity_fallback/resubmit.py")
BUDGET_FUNCTIONS = Path("training_constructs/budgets/budget_functions.py")


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def budget_stop_reason(checkout: Path) -> str:
    """The reason the budget enforcement gives TerminateJob when a team's month is spent (its own
    stop_reason, on a rehearsal team that used exactly its budget)."""
    from budget_ledger import ledger

    functions = load(checkout / BUDGET_FUNCTIONS)
    month = datetime.now(UTC).strftime("%Y-%m")
    spend = ledger.TeamSpend(team="rehearsal", budget=100.0, month=month, spent=100.0, accruing=0.0, rate=0.0,
                             hours_left=0.0)  # fmt: skip
    return str(functions.stop_reason(spend))


def described_nodes(spec: JobSpec, *, merged: bool) -> NodeSettings:
    """The node count, command and environment DescribeJobs shows for the job. API DescribeJobs' JobDetail
    has nodeProperties and no nodeOverrides; whether nodeProperties carries the submission's overrides
    merged in is not documented (unverified): by default the rehearsal shows the job definition's own, and
    with `merged` the definition's with the overrides applied."""
    return spec.overrides.over(spec.registered) if merged else spec.registered


def resubmission(checkout: Path, job: Any, *, merged: bool) -> dict[str, Any]:
    """What the capacity fallback's function submits for a job its queue cancelled (its own code decides),
    fed the job as DescribeJobs shows it."""
    spec: JobSpec = job.spec
    shown = described_nodes(spec, merged=merged)
    retry = {
        "attempts": spec.attempts,
        "evaluateOnExit": [
            {k: v for k, v in (("action", r.action), ("onStatusReason", r.on_status_reason),
                               ("onReason", r.on_reason), ("onExitCode", r.on_exit_code)) if v is not None}
            for r in spec.retry_rules
        ],
    }  # fmt: skip
    described = {
        "jobId": job.job_id,
        "jobArn": f"arn:aws:batch:us-east-1:000000000000:job/{job.job_id}",
        "jobName": spec.name,
        "jobDefinition": spec.definition,
        "nodeProperties": {
            "numNodes": shown.nodes or spec.nodes,
            "mainNode": spec.main_node,
            "nodeRangeProperties": [
                {
                    "targetNodes": "0:",
                    "container": {
                        "command": list(shown.command),
                        "environment": [{"name": k, "value": v} for k, v in shown.environment.items()],
                    },
                }
            ],
        },
        "retryStrategy": retry,
        "tags": dict(spec.tags),
    }
    if spec.timeout_seconds:
        described["timeout"] = {"attemptDurationSeconds": spec.timeout_seconds}
    target = {
        "queue": f"rehearsal-{spec.fleet}-queue-{job.placement + 1}",
        "placement": job.placement + 1,
        "label": f"placement {job.placement + 1}",
        "instanceType": "rehearsal",
    }
    # The fallback's function as EventBridge invokes it, on the cancelled job's event; its Batch calls go
    # to a stand-in that keeps the SubmitJob request.
    resubmit = load(checkout / RESUBMIT)
    queue = f"rehearsal-{spec.fleet}-queue-{job.placement}"
    detail = {**described, "jobQueue": queue, "status": "FAILED", "statusReason": resubmit.CAPACITY_CANCEL}
    routes = {queue: {"fleet": spec.fleet, "placement": job.placement, "label": "rehearsal", "next": [target]}}
    batch = _SubmitRecorder(detail)
    with contextlib.redirect_stdout(io.StringIO()):  # its decision log line: the report says it instead
        decision = resubmit.handle(detail, routes, batch, datetime.now(UTC))
    if decision.get("action") != "resubmitted" or batch.request is None:
        raise TrainctlError(f"the capacity fallback did not resubmit the job: {json.dumps(decision)[:150]}")
    return batch.request


def spec_from_request(spec: JobSpec, request: dict[str, Any]) -> JobSpec:
    """The job a SubmitJob request describes: the job definition it names as registered (the same one the
    cancelled job ran), with the request's own overrides, retry strategy, timeout and tags."""
    overrides = request.get("nodeOverrides", {})
    container = (overrides.get("nodePropertyOverrides") or [{}])[0].get("containerOverrides", {})
    given = NodeSettings(
        nodes=int(overrides["numNodes"]) if overrides.get("numNodes") else None,
        command=tuple(str(c) for c in container.get("command") or ()),
        environment={str(e["name"]): str(e.get("value", "")) for e in container.get("environment", [])},
    )
    runs = given.over(spec.registered)
    retry = request.get("retryStrategy") or {}
    rules = tuple(
        RetryRule(str(r.get("action", "")).upper(), r.get("onStatusReason"), r.get("onReason"), r.get("onExitCode"))
        for r in retry.get("evaluateOnExit", [])
    )
    timeout = (request.get("timeout") or {}).get("attemptDurationSeconds")
    return dataclasses.replace(
        spec,
        name=str(request.get("jobName", spec.name)),
        nodes=runs.nodes or 1,
        command=runs.command,
        # The same revision, so the same secrets, read again at the nodes' start.
        environment={**runs.environment, **spec.secret_values},
        attempts=int(retry.get("attempts") or spec.attempts),
        retry_rules=rules or spec.retry_rules,
        timeout_seconds=int(timeout) if timeout else spec.timeout_seconds,
        tags={str(k): str(v) for k, v in (request.get("tags") or {}).items()},
        overrides=given,
    )


class _SubmitRecorder:
    """Batch as the fallback's function sees it: the cancelled job, and a SubmitJob that is kept."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.request: dict[str, Any] | None = None

    def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
        return {"jobs": [self.job] if self.job["jobId"] in jobs else []}

    def submit_job(self, **request: Any) -> dict[str, str]:
        self.request = request
        return {"jobId": "successor"}

    def tag_resource(self, **_: Any) -> None:
        pass
