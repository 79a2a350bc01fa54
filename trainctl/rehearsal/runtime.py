"""How a node's container becomes processes on this machine (the process runtime): the job's command with
the image's paths mapped to this checkout, and its environment: the job definition's and the task's
variables, what its host provides, the local S3, and the variables Batch sets.

What cannot run here is said, not faked: checks of software this machine lacks (a CUDA kernel, Vulkan, the
driver version, NCCL's EFA plugin) are left out and listed in the report, and each node runs NPROC_PER_NODE
ranks of the reference size (1 by default) instead of one per GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from trainctl.errors import TrainctlError
from trainctl.rehearsal import batch_rules
from trainctl.rehearsal.definition import JobSpec, RetryRule
from trainctl.rehearsal.hosts import Devices
from trainctl.rehearsal.local_s3 import CREDENTIALS, LocalS3
from trainctl.rehearsal.nodes import NodeRun
from trainctl.submitting.taskfile import LAUNCHER
from trainctl.submitting.workdir import URI_ENV

# Checks of software a CPU machine has no stand-in for; each is named in the report.
NOT_REHEARSED = ("EXPECT_TORCH_CUDA", "EXPECT_VULKAN", "MIN_NVIDIA_DRIVER", "NCCL_NET")
# Every node's collectives and rendezvous share this machine's loopback interface (the nodes' own
# 127.0.0.x addresses are what `hostname -I` answers and the rendezvous uses; a socket bound to every
# address still answers on 127.0.0.1): the launcher's own choice of interface is not rehearsed.
SOCKET_INTERFACE = "lo"
IMAGE_DIR = str(Path(LAUNCHER).parent) + "/"
# The capacity fallback's Lambda code (stdlib), loaded by path: it is not part of the trainctl package.
RESUBMIT = Path("training_constructs/jobs/capacity_fallback/resubmit.py")


def image_file(checkout: Path, name: str) -> Path:
    """Where a file of the images' /opt/training/ lies in the checkout: the Dockerfiles copy the shim and
    launcher/ as they are, and benchmark/'s files into /opt/training/ itself."""
    container = checkout / "container"
    beside, benchmark = container / name, container / "benchmark" / name
    return benchmark if benchmark.exists() and not beside.exists() else beside


def _free_port_pair() -> int:
    """A port P with P + 1 free too (the rendezvous and the launcher's node-report port)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _count(environment: dict[str, str], name: str) -> int:
    value = environment.get(name, "")
    return int(value) if value.isdigit() else 0


class Runtime:
    def __init__(self, *, checkout: Path, s3: LocalS3, python: str, procs: int) -> None:
        self.checkout = checkout
        self.s3 = s3
        self.python = python
        self.procs = procs
        self.port = _free_port_pair()
        self.left_out: dict[str, str] = {}

    def prepare(self, spec: JobSpec) -> JobSpec:
        """The spec as this machine runs it; the buckets it names exist in the local S3."""
        environment = dict(spec.environment)
        for name in NOT_REHEARSED:
            if name in environment:
                self.left_out[name] = environment.pop(name)
        if environment.get("NPROC_PER_NODE", str(self.procs)) != str(self.procs):
            self.left_out["NPROC_PER_NODE"] = environment["NPROC_PER_NODE"]
        self.left_out["socket interface"] = f"{SOCKET_INTERFACE} for every node (the launcher picks eth0 on Batch)"
        buckets = {v for k, v in environment.items() if k.endswith("_BUCKET") and v}
        buckets |= {urlparse(v).netloc for v in environment.values() if v.startswith("s3://")}
        for bucket in sorted(b for b in buckets if b):
            self.s3.create_bucket(bucket)
        return dataclasses.replace(spec, environment=environment)

    def devices(self, spec: JobSpec) -> Devices:
        env = spec.environment
        return Devices(
            efa=_count(env, "EFA_DEVICES"),
            gpus=_count(env, "EXPECTED_GPUS"),
            neuron=_count(env, "EXPECTED_NEURON_DEVICES"),
        )

    def _map(self, argument: str, *, relative: bool) -> str:
        if argument.startswith(IMAGE_DIR):
            return str(image_file(self.checkout, argument[len(IMAGE_DIR) :]))
        # relative: paths relative to this checkout (without a workdir, whose files the launcher unpacks).
        if relative and argument and not argument.startswith(("-", "/")) and (self.checkout / argument).is_file():
            return str(self.checkout / argument)
        return argument

    def node_command(self, job: Any, attempt: int, run: NodeRun, main_address: str) -> tuple[list[str], dict[str, str]]:
        spec: JobSpec = job.spec
        bin_dir = str(Path(self.python).parent)
        env = {
            "PATH": os.pathsep.join([str(run.host.bin_dir), bin_dir, os.environ.get("PATH", os.defpath)]),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "TMPDIR": str(run.folder / "tmp"),
        }
        # The GPUs this machine lends the rehearsal, if the user narrowed them (every node sees the same:
        # two nodes cannot share one GPU under NCCL, so hide them for a multi-node rehearsal on one GPU).
        # The nodes run this interpreter, with the import path it was given.
        for name in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH"):
            if name in os.environ:
                env[name] = os.environ[name]
        (run.folder / "tmp").mkdir(parents=True, exist_ok=True)
        env.update(spec.environment)
        # A container's file system is new on every attempt: so is this folder.
        env["CHECKPOINT_DIR"] = str(run.folder / "checkpoints")
        env["WORKDIR_DIR"] = str(run.folder / "workdir")
        env.update(CREDENTIALS)
        env["AWS_ENDPOINT_URL"] = self.s3.endpoint
        env.update(run.host.env())
        env.update(
            PYTHON=self.python,
            NPROC_PER_NODE=str(self.procs),
            MASTER_PORT=str(self.port),
            GLOO_SOCKET_IFNAME=SOCKET_INTERFACE,
            NCCL_SOCKET_IFNAME=SOCKET_INTERFACE,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(
            batch_rules.node_environment(
                job_id=job.job_id,
                attempt=attempt,
                index=run.index,
                nodes=spec.nodes,
                main=spec.main_node,
                main_address=main_address,
                queue=f"rehearsal-{spec.fleet}-queue-{job.placement}",
                environment_name=f"rehearsal-{spec.fleet}-{job.placement}",
            )
        )
        return [self._map(a, relative=URI_ENV not in spec.environment) for a in spec.command], env

    def lineage(self, job: Any) -> str:
        """The S3 prefix the launcher keeps this job's checkpoints under (container/launcher/restore_phase.py):
        the job's lineage (CHECKPOINT_LINEAGE, which the capacity fallback carries to a resubmitted job),
        else its id."""
        uri = str(job.spec.environment.get("CHECKPOINT_URI", ""))
        lineage = job.spec.environment.get("CHECKPOINT_LINEAGE") or job.job_id
        return f"{uri.rstrip('/')}/{lineage}/" if uri else ""

    def checkpoints(self, job: Any) -> list[str]:
        """The checkpoint files every node's newest manifest lists in the local S3 (rank 0, which saves in
        most scripts, may run on any node), by name."""
        prefix = self.lineage(job)
        if not prefix:
            return []
        parsed = urlparse(prefix)
        return self.s3.manifest_files(parsed.netloc, parsed.path.lstrip("/"))

    def evidence(self, job: Any) -> list[str]:
        """What the launcher uploaded under the lineage's evidence/ prefix (stacks of a hang)."""
        prefix = self.lineage(job)
        if not prefix:
            return []
        parsed = urlparse(prefix)
        return self.s3.keys(parsed.netloc, parsed.path.lstrip("/") + "evidence/")

    def resubmission(self, job: Any) -> dict[str, Any]:
        """What the capacity fallback's function would submit for this job (its own code decides)."""
        spec: JobSpec = job.spec
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
                "numNodes": spec.nodes,
                "mainNode": spec.main_node,
                "nodeRangeProperties": [
                    {
                        "targetNodes": "0:",
                        "container": {
                            "command": list(spec.command),
                            "environment": [{"name": k, "value": v} for k, v in spec.environment.items()],
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
        resubmit = _load(self.checkout / RESUBMIT)
        queue = f"rehearsal-{spec.fleet}-queue-{job.placement}"
        detail = {**described, "jobQueue": queue, "status": "FAILED", "statusReason": resubmit.CAPACITY_CANCEL}
        routes = {queue: {"fleet": spec.fleet, "placement": job.placement, "label": "rehearsal", "next": [target]}}
        batch = _SubmitRecorder(detail)
        with contextlib.redirect_stdout(io.StringIO()):  # its decision log line: the report says it instead
            decision = resubmit.handle(detail, routes, batch, datetime.now(UTC))
        if decision.get("action") != "resubmitted" or batch.request is None:
            raise TrainctlError(f"the capacity fallback did not resubmit the job: {json.dumps(decision)[:150]}")
        return batch.request

    def spec_from_request(self, spec: JobSpec, request: dict[str, Any]) -> JobSpec:
        """The job a SubmitJob request describes, on top of the job definition it names."""
        overrides = request.get("nodeOverrides", {})
        container = (overrides.get("nodePropertyOverrides") or [{}])[0].get("containerOverrides", {})
        environment = dict(spec.environment)
        environment.update({str(e["name"]): str(e.get("value", "")) for e in container.get("environment", [])})
        retry = request.get("retryStrategy") or {}
        rules = tuple(
            RetryRule(str(r.get("action", "")).upper(), r.get("onStatusReason"), r.get("onReason"), r.get("onExitCode"))
            for r in retry.get("evaluateOnExit", [])
        )
        timeout = (request.get("timeout") or {}).get("attemptDurationSeconds")
        return dataclasses.replace(
            spec,
            name=str(request.get("jobName", spec.name)),
            nodes=int(overrides.get("numNodes") or spec.nodes),
            command=tuple(container.get("command") or spec.command),
            environment=environment,
            attempts=int(retry.get("attempts") or spec.attempts),
            retry_rules=rules or spec.retry_rules,
            timeout_seconds=int(timeout) if timeout else spec.timeout_seconds,
            tags={str(k): str(v) for k, v in (request.get("tags") or {}).items()},
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
