"""How a node's container becomes processes on this machine (the process runtime): the job's command with
the image's paths mapped to this checkout, and its environment: the job definition's and the task's
variables, what its host provides, the local S3, and the variables Batch sets.

What cannot run here is said, not faked: checks of software this machine lacks (a CUDA kernel, Vulkan, the
driver version, NCCL's EFA plugin) are left out and listed in the report, and each node runs NPROC_PER_NODE
ranks of the reference size (1 by default) instead of one per GPU.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainctl.rehearsal import batch_rules, container_paths
from trainctl.rehearsal.container_paths import CONTAINER_CHECKPOINT_DIR
from trainctl.rehearsal.definition import JobSpec
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
# The reference script's rehearsal-only hook (examples/rehearsal/train.py): a rank whose node's file exists
# sleeps in its own code (the stall-rank fault creates it).
STALL_VARIABLE = "REHEARSAL_STALL_FILE"


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


def _count(environment: dict[str, str], name: str) -> int:
    value = environment.get(name, "")
    return int(value) if value.isdigit() else 0


def devices_of(spec: JobSpec) -> Devices:
    """What the fleet's instances have, as its job definition expects them (the preflight's counts)."""
    env = spec.environment
    return Devices(
        efa=_count(env, "EFA_DEVICES"),
        gpus=_count(env, "EXPECTED_GPUS"),
        neuron=_count(env, "EXPECTED_NEURON_DEVICES"),
    )


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
        why_not = container_paths.unavailable()
        if why_not:
            self.left_out["checkpoint path"] = f"each node's own folder, not {CONTAINER_CHECKPOINT_DIR} ({why_not})"
        if environment.get("CHECKPOINT_DIR", CONTAINER_CHECKPOINT_DIR) != CONTAINER_CHECKPOINT_DIR:
            self.left_out["CHECKPOINT_DIR"] = f"{environment['CHECKPOINT_DIR']} (each node's own folder instead)"
        buckets = {v for k, v in environment.items() if k.endswith("_BUCKET") and v}
        buckets |= {urlparse(v).netloc for v in environment.values() if v.startswith("s3://")}
        for bucket in sorted(b for b in buckets if b):
            self.s3.create_bucket(bucket)
        return dataclasses.replace(spec, environment=environment)

    def devices(self, spec: JobSpec) -> Devices:
        return devices_of(spec)

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
        # A container's file system is new on every attempt: so is this folder, which the node sees at the
        # container's path where this machine can (container_paths.py).
        own_folder = run.folder / "checkpoints"
        bound = container_paths.unavailable() is None
        env["CHECKPOINT_DIR"] = CONTAINER_CHECKPOINT_DIR if bound else str(own_folder)
        env["WORKDIR_DIR"] = str(run.folder / "workdir")
        # The hang watch's heartbeat and output marks: each container's own /tmp on Batch, and here each
        # node's own folder (the nodes of a rehearsal, and rehearsals side by side, share this machine's /tmp).
        env["PROGRESS_DIR"] = str(run.folder / "progress")
        if "TORCH_FR_DUMP_TEMP_FILE" in env:
            env["TORCH_FR_DUMP_TEMP_FILE"] = str(run.folder / "progress" / "flight-recorder" / "rank-")
        env[STALL_VARIABLE] = str(run.stall_file)
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
        command = [self._map(a, relative=URI_ENV not in spec.environment) for a in spec.command]
        return (container_paths.in_own_folder(command, own_folder) if bound else command), env

    def lineage(self, job: Any) -> str:
        """The S3 prefix the launcher keeps this job's checkpoints under (container/launcher/restore_phase.py):
        the job's lineage (CHECKPOINT_LINEAGE, which the capacity fallback carries to a resubmitted job),
        else its id."""
        uri = str(job.spec.environment.get("CHECKPOINT_URI", ""))
        lineage = job.spec.environment.get("CHECKPOINT_LINEAGE") or job.job_id
        return f"{uri.rstrip('/')}/{lineage}/" if uri else ""

    def checkpoints(self, job: Any) -> list[str]:
        """The checkpoints every node's newest manifest lists in the local S3 (rank 0, which saves in most
        scripts, may run on any node): a folder once (`NAME/`), a file once per save of it seen (`NAME`, then
        `NAME (save 2)` and on, for a file saved again in place), so that `checkpoint:K` counts saves."""
        prefix = self.lineage(job)
        if not prefix:
            return []
        parsed = urlparse(prefix)
        names: list[str] = []
        for name, save in self.s3.manifest_saves(parsed.netloc, parsed.path.lstrip("/")).items():
            if save is None:
                names.append(name)
                continue
            seen = job.checkpoint_saves.setdefault(name, [])
            if save not in seen:
                seen.append(save)
            names += [name if k == 1 else f"{name} (save {k})" for k in range(1, len(seen) + 1)]
        return sorted(names)

    def evidence(self, job: Any) -> list[str]:
        """What the launcher uploaded under the lineage's evidence/ prefix (stacks of a hang)."""
        prefix = self.lineage(job)
        if not prefix:
            return []
        parsed = urlparse(prefix)
        return self.s3.keys(parsed.netloc, parsed.path.lstrip("/") + "evidence/")
