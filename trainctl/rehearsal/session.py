"""One rehearsal from start to end: the job, the local S3, the engine and the report; nothing it started is
left running after it ends, an error or Ctrl-C included. `trainctl rehearse` and the fault catalog share it."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import trainctl
from trainctl.errors import TrainctlError
from trainctl.rehearsal import report
from trainctl.rehearsal.definition import (
    JobSpec,
    NodeSettings,
    as_trainctl_registers,
    from_cloud_assembly,
    job_spec,
    secret_values,
)
from trainctl.rehearsal.engine import Engine
from trainctl.rehearsal.faults import Fault, fault_node, parse_fault
from trainctl.rehearsal.fleet_facts import FleetFacts, deployed_facts, read_facts
from trainctl.rehearsal.hosts import Devices
from trainctl.rehearsal.local_s3 import LocalS3
from trainctl.rehearsal.progress import Listener, Narrator
from trainctl.rehearsal.runtime import Runtime, devices_of
from trainctl.submitting.taskfile import Task, make_task
from trainctl.submitting.workdir import check_definition_script
from trainctl.submitting.workdir import environment as workdir_environment
from trainctl.submitting.workdir import prepare as prepare_workdir
from trainctl.submitting.workdir import upload as upload_workdir

# Every node runs on this machine, each with its own loopback address and its own processes.
MAX_NODES = 16
# Where a workdir goes when the job definition names no dataset bucket (DATASET_BUCKET) to mirror.
WORKDIR_BUCKET = "rehearsal-datasets"
EXPECTATIONS = ("succeeded", "failed")


@dataclass(frozen=True)
class Options:
    faults: tuple[str, ...] = ()
    nodes: int | None = None
    expect: str = "succeeded"
    procs: int = 1
    deadline_seconds: float = 1800.0
    seed: int = 0
    keep: Path | None = None
    # Without `keep`: True keeps the node logs (only) in a temporary folder the report names (`logs_dir`);
    # False removes it (the fault catalog's default).
    keep_logs: bool = False
    # The job definition in DescribeJobDefinitions' shape (a deployed revision); None: read cdk.out.
    definition: dict[str, Any] | None = None
    definition_source: str = ""
    # DescribeJobs shows the job's nodeProperties with the submission's overrides merged in (unverified);
    # False: as the job definition registered them (app_code.described_nodes).
    describe_merged: bool = False


def checkout() -> Path:
    """This checkout: the rehearsal runs its container/ launcher and the capacity fallback's code."""
    root = Path(trainctl.__file__).resolve().parent.parent
    if not (root / "container" / "distributed_run.sh").is_file():
        raise TrainctlError(f"trainctl rehearse runs from a checkout of the project: no container/ launcher in {root}")
    return root


def check_options(task: Task, options: Options) -> tuple[Task, list[Fault]]:
    """Everything refused before anything starts, each in one line naming the input."""
    if options.expect not in EXPECTATIONS:
        raise TrainctlError(f"--expect {options.expect!r}: give {' or '.join(EXPECTATIONS)}")
    if options.nodes is not None:
        if not 1 <= options.nodes <= MAX_NODES:
            raise TrainctlError(f"--nodes {options.nodes}: a rehearsal runs 1 to {MAX_NODES} nodes on this machine")
        task = make_task({**task.model_dump(exclude_none=True), "nodes": options.nodes}, where="--")
    elif task.nodes is not None and task.nodes > MAX_NODES:
        raise TrainctlError(f"nodes: {task.nodes}: a rehearsal runs at most {MAX_NODES} nodes; pass --nodes 2")
    if not 1 <= options.procs <= 8:
        raise TrainctlError(f"--procs {options.procs}: give 1 to 8 processes per node")
    if options.deadline_seconds < 10:
        raise TrainctlError(f"--deadline {options.deadline_seconds:g}: give at least 10 seconds")
    if task.image:
        raise TrainctlError("image: the process runtime runs this checkout's launcher, not an image; drop `image:`")
    if options.keep is not None:
        check_keep(options.keep)
    return task, [parse_fault(spec) for spec in options.faults]


# The kernel's own trees: nothing a rehearsal keeps belongs there.
SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))


def check_keep(keep: Path) -> None:
    """--keep names a folder the rehearsal can create, or an empty one it can write in."""
    where = keep.expanduser().resolve()
    for tree in SYSTEM_TREES:
        if where == tree or tree in where.parents:
            raise TrainctlError(f"--keep {keep}: {tree} holds the kernel's files; give a new folder of yours")
    if where.exists() and not where.is_dir():
        raise TrainctlError(f"--keep {keep}: a file, not a folder; give a new or empty folder")
    if where.is_dir():
        try:
            empty = not any(where.iterdir())
        except OSError as error:
            raise TrainctlError(f"--keep {keep}: cannot read it ({error.strerror}); give a new folder") from None
        if not empty:
            raise TrainctlError(f"--keep {keep}: not empty; give a new folder (hosts' state must start clean)")
        if not os.access(where, os.W_OK | os.X_OK):
            raise TrainctlError(f"--keep {keep}: cannot write in it; give a folder of yours")
        return
    parent = next(p for p in where.parents if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        what = "a file" if not parent.is_dir() else "not writable"
        raise TrainctlError(f"--keep {keep}: cannot create it ({parent} is {what}); give a folder you can create")


def check_fleet(spec: JobSpec, faults: list[Fault], facts: FleetFacts, *, named: str) -> None:
    """What could not happen on AWS: more nodes than the fleet holds, a fault for another kind of fleet."""
    if facts.max_nodes is not None and spec.nodes > facts.max_nodes:
        raise TrainctlError(
            f"{named} {spec.nodes}: fleet {spec.fleet} holds at most {facts.max_nodes} nodes ({facts.max_nodes_from}), "
            f"so Batch would leave the job RUNNABLE; give {facts.max_nodes} or fewer"
        )
    devices = devices_of(spec)
    for fault in faults:
        fault_node(fault, nodes=spec.nodes, main=spec.main_node)
        lacking = ""
        if fault.kind == "xid" and not devices.gpus:
            lacking = "expects no GPUs (EXPECTED_GPUS), so no Xid can happen; xid is for GPU fleets"
        elif fault.kind == "neuron-tool-fail" and not devices.neuron:
            lacking = "expects no Neuron devices (EXPECTED_NEURON_DEVICES); neuron-tool-fail is for Trainium fleets"
        elif fault.kind in ("preflight-fail", "slow-preflight") and devices == Devices():
            lacking = "expects no devices (EFA_DEVICES, EXPECTED_GPUS, EXPECTED_NEURON_DEVICES) for a preflight to lose"
        elif fault.kind == "capacity-cancel" and facts.capacity_wait_seconds is None:
            lacking = f"is served by a queue that never cancels for capacity ({facts.capacity_wait_from})"
        if lacking:
            raise TrainctlError(f"--fault {fault.spec!r}: fleet {spec.fleet}'s job definition {lacking}")


class Terminated(KeyboardInterrupt):
    """SIGTERM: stopped like Ctrl-C, and said as such (exit 143)."""


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI runner's stop, `timeout`) unwinds like Ctrl-C, so every node is stopped."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def keep_only_logs(folder: Path) -> None:
    """Remove everything under `folder` but the node logs (`*.log`): the hosts' state and the nodes'
    files (a checkpoint folder may be large) go."""
    for entry in folder.iterdir():
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                keep_only_logs(entry)
                if not any(entry.iterdir()):
                    entry.rmdir()
            elif entry.suffix != ".log" or entry.is_symlink():
                entry.unlink()


def rehearse(task: Task, *, assembly: Path, options: Options, listener: Listener | None = None) -> dict[str, Any]:
    """Run the task as Batch would and return the report (report.build's dictionary). `listener` hears
    each event as it happens (progress.py); without one, nothing is said."""
    root_dir = checkout()
    task, faults = check_options(task, options)
    if options.definition is not None:
        source, definition = options.definition_source, options.definition
        facts = deployed_facts()
    else:
        logical_id, definition = from_cloud_assembly(assembly, task.fleet, task.job)
        source = f"{assembly.name}/{logical_id}"
        facts = read_facts(assembly, task.fleet, definition)
    name = task.name or f"{task.fleet}-{task.job}-rehearsal"
    spec = job_spec(definition, fleet=task.fleet, source=source, task=task, name=name)
    # Secrets reach the nodes' environment only, from trainctl's own (definition.secret_values).
    values = secret_values(task, definition, os.environ, source=source)
    named = "--nodes" if options.nodes is not None else "nodes:" if task.nodes else "the job definition's numNodes"
    check_fleet(spec, faults, facts, named=named)
    # The workdir as `run` sends it: packed, its script checked, in the local S3 for every node's launcher.
    packed = prepare_workdir(task)
    if packed:
        check_definition_script(packed, task.command or [], definition)
    bucket = spec.environment.get("DATASET_BUCKET") or WORKDIR_BUCKET
    # Sent at submit as environment overrides, beside the task's own (trainctl/commands/submitting.py).
    sent = workdir_environment(bucket, packed, task.setup)
    overrides = NodeSettings(spec.overrides.nodes, spec.overrides.command, {**spec.overrides.environment, **sent})
    # trainctl submits the job on a revision that carries them (trainctl/submitting/revisions.py).
    registered = as_trainctl_registers(definition, overrides)
    spec = dataclasses.replace(
        spec,
        environment={**spec.environment, **sent, **values},
        overrides=overrides,
        registered=registered,
        secret_values=values,
    )
    if importlib.util.find_spec("torch") is None and task.launcher:
        raise TrainctlError(f"the launcher runs torchrun with {sys.executable}, which has no torch: `make bootstrap`")
    command = spec.command[0] if spec.command else ""
    if not (command.startswith("/opt/training/") or shutil.which(command) or (root_dir / command).is_file()):
        raise TrainctlError(f"command {command!r}: not found on this machine (PATH, or this checkout)")
    s3 = LocalS3()
    scratch = Path(tempfile.mkdtemp(prefix="rehearsal-")) if options.keep is None else options.keep
    kept = options.keep is not None or options.keep_logs
    narrator = Narrator(listener)
    narrator.begin(spec.definition, spec.fleet, spec.nodes, spec.attempts, str(scratch) if kept else "")
    try:
        try:
            scratch.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrainctlError(f"--keep {scratch}: cannot create it ({error.strerror})") from None
        s3.start()
        with _terminate_as_interrupt():
            runtime = Runtime(checkout=root_dir, s3=s3, python=sys.executable, procs=options.procs)
            spec = runtime.prepare(spec)
            if packed:
                upload_workdir(s3.client(), bucket, packed)
            engine = Engine(
                runtime=runtime,
                s3=s3,
                faults=faults,
                root=scratch,
                deadline_seconds=options.deadline_seconds,
                seed=options.seed,
                facts=facts,
                describe_merged=options.describe_merged,
                narrator=narrator,
            )
            outcome = engine.rehearse(spec)
            built = report.build(outcome, left_out=runtime.left_out, expect=options.expect)
            return {**built, "logs_dir": str(scratch) if kept else None}
    except RuntimeError as error:  # no free ports or loopback addresses left
        raise TrainctlError(f"cannot rehearse on this machine: {error}") from None
    finally:
        s3.stop()
        if options.keep is None and not options.keep_logs:
            shutil.rmtree(scratch, ignore_errors=True)
        elif options.keep is None:
            keep_only_logs(scratch)
            with contextlib.suppress(OSError):
                scratch.rmdir()  # only if empty: refused before any node started
