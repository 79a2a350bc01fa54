"""The fault catalog: every way a node or a service can fail a multi-node job, with the ending users need
and what must hold, each rehearsed on the reference script (examples/rehearsal/train.py) or, for the ways
frameworks write checkpoints, on another script there (Entry.command). `make faults` runs every
entry and prints one line per entry; docs/reference/fault-catalog.md is generated from this table.

An entry states the ending users need, whether or not today's code reaches it: an entry that fails says
which part of recovery is missing. Nothing here is marked as an expected failure.

    python -m trainctl.rehearsal.catalog [NAME ...]      # every entry, or the ones named
    python -m trainctl.rehearsal.catalog --entry NAME    # one entry's report as JSON (what the runner calls)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.rehearsal.catalog_checks import (
    CHECKPOINT_EVERY,
    CHILD_FAILURE_SECONDS,
    Check,
    Report,
    _attempts,
    attempt_ended,
    attempts,
    checkpoints_in_s3,
    ended_within,
    evidence_uploaded,
    fault_ended_within,
    first_exit,
    hang_caught,
    hang_names,
    host_taken_out,
    last_save_uploaded,
    main_line_names,
    no_host_taken_out,
    no_straggler_named,
    resubmitted,
    resumed_dcp_step,
    resumed_from_newest,
    resumed_from_snapshot_epoch,
    s3_throttled,
    straggler_found_within,
    straggler_named,
    why_says,
)
from trainctl.rehearsal.session import Options, checkout, rehearse
from trainctl.submitting.taskfile import load_task

TASK = Path("examples/rehearsal/task.yaml")
# A catalog entry that has not ended by then has hung.
DEADLINE_SECONDS = 240.0


@dataclass(frozen=True)
class Entry:
    name: str
    story: str
    faults: tuple[str, ...]
    expect: str
    holds: tuple[Check, ...]
    env: dict[str, str] = field(default_factory=dict)
    fleet: str = "gpu"
    args: tuple[str, ...] = ()  # more of the reference script's options
    steps: int = 60
    timeout: int | None = None  # the attempt's timeout (attemptDurationSeconds); None: the task's
    # The script's DistributedDataParallel and torch.optim (True), or the same step by hand (the script's
    # --gradients allreduce): DDP's first construction costs each rank about 3 s of CPU, on every attempt.
    ddp: bool = False
    command: tuple[str, ...] = ()  # another script's whole command, in place of the reference script's


STEPS = 60
SLOW_NODE = "slow-node:1=0.5@checkpoint:1"
STRAGGLER_ENV = {"STRAGGLER_WINDOW_SECONDS": "3", "STRAGGLER_LOG_WINDOWS": "1"}
STRAGGLER_ARGS = ("--compute-seconds", "0.04")
STRAGGLER_STEPS = 200
# Three windows of 3 s, the window the slowdown began in, and a child's pace a window late.
STRAGGLER_FOUND_SECONDS = 20.0
CATALOG: tuple[Entry, ...] = (
    Entry("no-fault", "two nodes train with DistributedDataParallel, checkpoint and finish", (), "succeeded",
          (attempts(1), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY), why_says("SUCCEEDED")), ddp=True),
    Entry("kill-child", "a child's container is SIGKILLed after checkpoint 1 (with no OutOfMemoryError "
          "reason: an OOM kill is the application's)",
          ("kill-child@checkpoint:1",), "succeeded",
          (ended_within(CHILD_FAILURE_SECONDS), main_line_names(1), attempts(2), resumed_from_newest(1)), ddp=True),
    Entry("kill-main", "the main node's container is SIGKILLed: exit 137 is the application's (an OOM kill), "
          "and the job definitions do not retry it", ("kill-main@checkpoint:1",), "failed",
          (attempts(1), why_says("exit 137"))),
    Entry("lose-main-host", "the main node's instance is terminated after checkpoint 1",
          ("lose-host:0@checkpoint:1",), "succeeded",
          (attempts(2), resumed_from_newest(1), why_says("its instance was lost"))),
    Entry("lose-child-host", "a child's instance is terminated after checkpoint 1",
          ("lose-host:1@checkpoint:1",), "succeeded",
          (ended_within(CHILD_FAILURE_SECONDS), main_line_names(1), attempts(2), resumed_from_newest(1))),
    Entry("child-never-starts", "a child's image cannot be pulled: its container never runs",
          ("never-start:1@start",), "succeeded",
          (ended_within(CHILD_FAILURE_SECONDS), main_line_names(1), attempts(2))),
    Entry("child-preflight-on-warm-host", "the retry lands on warm hosts; the child's host lost a device and "
          "fails its preflight in seconds while the main node is still in a 20 s preflight",
          ("lose-host:0@checkpoint:1", "slow-preflight:0=20@attempt:2", "preflight-fail:1@attempt:2"), "succeeded",
          (attempts(3), attempt_ended(2, within=CHILD_FAILURE_SECONDS, names=1), host_taken_out(1),
           resumed_from_newest(1))),
    Entry("xid-on-child", "a child's GPU logs a reset-class Xid; the main node's host is lost before the child "
          "judges itself", ("xid:1@checkpoint:1", "lose-host:0@checkpoint:2"), "succeeded",
          (host_taken_out(1), resumed_from_newest(2))),
    Entry("neuron-tool-fails", "on a Trainium fleet, a child's neuron-ls fails while every /dev/neuron* device is "
          "there: the image's or driver's fault, which every node shares", ("neuron-tool-fail:1@start",), "failed",
          (attempts(1), first_exit(78), no_host_taken_out(), why_says("shares")), fleet="trainium"),
    Entry("hang", "a child's ranks stop (SIGSTOP) after checkpoint 1: a hang, with HANG_SECONDS=30",
          ("stop-rank:1@checkpoint:1",), "succeeded",
          (hang_caught(), hang_names(1), evidence_uploaded(), attempts(2), resumed_from_newest(1)),
          {"HANG_SECONDS": "30"}),
    Entry("host-lost-mid-upload", "the node uploading checkpoint 2 loses its instance mid-upload",
          ("kill-upload@checkpoint:1",), "succeeded", (attempts(2), resumed_from_newest(1))),
    Entry("s3-slowdown", "S3 answers 503 SlowDown for 20 s after checkpoint 1", ("s3-slowdown=20@checkpoint:1",),
          "succeeded", (s3_throttled(), attempts(1), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY))),
    Entry("capacity-cancel", "the main node's host is lost after checkpoint 2 and its retry finds no capacity: "
          "the queue cancels it and the capacity fallback resubmits it (a new job id)",
          ("lose-host:0@checkpoint:2", "capacity-cancel@checkpoint:2"), "succeeded",
          (resubmitted(), resumed_from_newest(2), why_says("Host EC2"))),
    # What must be left alone, or ended as the application's, not retried on a guess.
    Entry("app-error-every-rank", "every rank raises ValueError at step 25 (a plain bug in the script)", (),
          "failed", (attempts(1), first_exit(1), why_says("ValueError: step 25"), why_says("not retried"),
                     no_host_taken_out()), args=("--fail-at-step", "25")),
    Entry("silent-save", "rank 0's first save takes 45 s and prints nothing, with HANG_SECONDS=20", (),
          "succeeded", (attempts(1), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY)),
          {"HANG_SECONDS": "20"}, args=("--silent-save-seconds", "45")),
    Entry("silent-compile", "every rank waits 45 s for a silent compiler child burning a quarter of a core, with "
          "HANG_SECONDS=20", (), "succeeded", (attempts(1), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY)),
          {"HANG_SECONDS": "20"}, args=("--compile-seconds", "45", "--compile-share", "0.25")),
    Entry("stall", "a child's rank sleeps in its own code after checkpoint 1 while its peer waits in the "
          "all-reduce: a real stall, with HANG_SECONDS=30", ("stall-rank:1@checkpoint:1",), "succeeded",
          (hang_caught(), hang_names(1), evidence_uploaded(), attempts(2), resumed_from_newest(1)),
          {"HANG_SECONDS": "30"}, ddp=True),
    Entry("lost-child-batch-late", "a child's instance is terminated after checkpoint 1 and Batch shows its node "
          "job FAILED 45 s late", ("batch-lag=45@start", "lose-host:1@checkpoint:1"), "succeeded",
          (fault_ended_within("lose-host:1@checkpoint:1", CHILD_FAILURE_SECONDS), main_line_names(1), attempts(2),
           resumed_from_newest(1))),
    # Checkpoints as frameworks write them (docs/checkpoints.md).
    Entry("in-place-file", "the main node saves snapshot.pt in place every epoch (torch.save on one path, as "
          "PyTorch's DDP tutorial does; the default 30 s settle time, which such a file never reaches) and a "
          "child's container is SIGKILLed once a copy is in S3", ("kill-child@checkpoint:1",), "succeeded",
          (main_line_names(1), attempts(2), resumed_from_snapshot_epoch(1)),
          {"CHECKPOINT_SETTLE_SECONDS": "30"},
          command=("examples/rehearsal/snapshot_in_place.py", "--snapshot_path", "${CHECKPOINT_DIR}/snapshot.pt",
                   "--total_epochs", "24", "--seconds_per_batch", "0.1")),
    Entry("trainer-folders", "global rank 0 saves checkpoint-N/ file by file as Hugging Face's Trainer does (a "
          "16 MiB optimizer file written over 0.8 s, trainer_state.json last, the newest 2 kept) and resumes from "
          "the newest folder by its number alone; the main node's host is lost during the saves (rank 0 saves on "
          "whichever node the rendezvous gave it)",
          ("lose-host:0@checkpoint:2",), "succeeded",
          (attempts(2), resumed_from_newest(1), why_says("its instance was lost")), {"CHECKPOINT_SETTLE_SECONDS": "5"},
          command=("examples/rehearsal/trainer_folders.py", "--output_dir", "${CHECKPOINT_DIR}", "--max_steps", "70",
                   "--save_steps", "10", "--seconds_per_step", "0.2", "--megabytes_per_save", "16")),
    Entry("dcp-steps", "every rank saves its part of a PyTorch Distributed Checkpoint into step-N/ (the "
          "coordinator's .metadata last, as TorchTitan does) and a child's container is SIGKILLed while saves go "
          "on; on load ranks read each other's files, wherever the rendezvous put them", ("kill-child@checkpoint:3",),
          "succeeded", (main_line_names(1), attempts(2), resumed_dcp_step(10)), {"CHECKPOINT_SETTLE_SECONDS": "5"},
          command=("examples/rehearsal/dcp_steps.py", "--checkpoint_folder", "${CHECKPOINT_DIR}", "--steps", "70",
                   "--save_every", "10", "--seconds_per_step", "0.25")),
    Entry("attempt-timeout", "the attempt runs past its 60 s timeout", (), "failed",
          (attempts(1), last_save_uploaded(), why_says("never retries a timed-out job")),
          steps=100_000, timeout=60),
    Entry("cancel", "the user cancels the job after checkpoint 2 (trainctl cancel)", ("cancel@checkpoint:2",),
          "failed", (attempts(1), last_save_uploaded(), why_says("trainctl cancel")), steps=100_000),
    Entry("budget-stop", "the team's budget runs out after checkpoint 2: the enforcement terminates the job",
          ("budget-stop@checkpoint:2",), "failed", (attempts(1), last_save_uploaded(), why_says("budget")),
          steps=100_000),
    Entry("main-never-starts", "the main node's image cannot be pulled in attempt 1: no node runs",
          ("never-start:0@start",), "succeeded", (attempts(2), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY))),
    Entry("main-preflight-fails", "the main node's host lost a device: its preflight fails",
          ("preflight-fail:0@start",), "succeeded", (attempts(2), first_exit(75), host_taken_out(0))),
    # Slow nodes (docs/health.md, "Slow nodes"): 40 ms of CPU per step, windows of 3 s so that three fit the run.
    Entry("slow-node", "a child's ranks run at half speed from checkpoint 1 (stopped 50 ms of every 100 ms): the "
          "straggler watch names it and the job trains on (STRAGGLER_ACTION=report)", (SLOW_NODE,), "succeeded",
          (attempts(1), straggler_named(1), straggler_found_within(SLOW_NODE, STRAGGLER_FOUND_SECONDS),
           no_host_taken_out(), why_says("node 1 was named a straggler")),
          STRAGGLER_ENV, ddp=True, steps=STRAGGLER_STEPS, args=STRAGGLER_ARGS),
    Entry("slow-node-replaced", "the same half-speed child with STRAGGLER_ACTION=replace: after the next "
          "checkpoint it ends the attempt as a node fault, its host is taken out and the retry resumes from that "
          "checkpoint on a fresh host", (SLOW_NODE,), "succeeded",
          (attempts(2), straggler_named(1), main_line_names(1), host_taken_out(1), resumed_from_newest(2),
           why_says("straggler")),
          {**STRAGGLER_ENV, "STRAGGLER_ACTION": "replace"}, ddp=True, steps=STRAGGLER_STEPS, args=STRAGGLER_ARGS),
    Entry("no-straggler", "two healthy nodes train with the straggler watch's windows of 3 s: it names no node",
          (), "succeeded", (attempts(1), no_straggler_named(), no_host_taken_out()),
          STRAGGLER_ENV, ddp=True, steps=STRAGGLER_STEPS, args=STRAGGLER_ARGS),
)  # fmt: skip


def entry(name: str) -> Entry:
    found = next((e for e in CATALOG if e.name == name), None)
    if found is None:
        raise TrainctlError(f"no catalog entry {name!r}: entries are {', '.join(e.name for e in CATALOG)}")
    return found


def run_entry(item: Entry, *, assembly: Path) -> Report:
    task = load_task(checkout() / TASK)
    update: dict[str, Any] = {"fleet": item.fleet, "env": {**task.env, **item.env}, "command": list(item.command) or [
        "examples/rehearsal/train.py", "--steps", str(item.steps), "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--step-seconds", "0.1", "--gradients", "ddp" if item.ddp else "allreduce", *item.args]}  # fmt: skip
    if item.timeout is not None:
        update["timeout"] = item.timeout
    task = task.model_copy(update=update)
    options = Options(faults=item.faults, nodes=2, expect=item.expect, deadline_seconds=DEADLINE_SECONDS)
    return rehearse(task, assembly=assembly, options=options)


def judge(item: Entry, report: Report) -> list[str]:
    """What did not hold, in words; empty when the entry passes."""
    problems = []
    if report["unfired_faults"]:
        problems.append(f"faults never triggered: {', '.join(report['unfired_faults'])}")
    if report["ending"] != item.expect.upper() or report["deadline_hit"]:
        how = " (the rehearsal's deadline stopped it)" if report["deadline_hit"] else ""
        problems.append(f"ended {report['ending']}{how}, users need {item.expect.upper()}")
    for check in item.holds:
        try:
            held = check.test(report)
        except (KeyError, IndexError, StopIteration, ValueError):
            held = False
        if not held:
            problems.append(f"not: {check.what}")
    return problems


def _run_one(item: Entry, assembly: Path) -> tuple[Entry, Report | None, str, float]:
    started = time.monotonic()
    entry_run = subprocess.Popen(  # noqa: S603 - this module, with a name from the table
        [sys.executable, "-m", "trainctl.rehearsal.catalog", "--entry", item.name, "--app", str(assembly)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=checkout(),
    )
    try:
        out, err = entry_run.communicate(timeout=DEADLINE_SECONDS + 120)
    except BaseException:
        # SIGTERM unwinds the rehearsal like Ctrl-C (session.py): its nodes are stopped, not orphaned.
        entry_run.terminate()
        try:
            out, err = entry_run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            entry_run.kill()
            raise
        if entry_run.returncode != 0 and not out:
            raise
    seconds = time.monotonic() - started
    try:
        return item, json.loads(out), "", seconds
    except ValueError:
        return item, None, (err.strip().splitlines() or ["no report"])[-1], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rehearse every entry of the fault catalog.")
    parser.add_argument("names", nargs="*", help="entries to run (default: all)")
    parser.add_argument("--entry", help="run one entry in this process and print its report as JSON")
    parser.add_argument("--app", type=Path, default=Path("cdk.out"))
    parser.add_argument("--workers", type=int, default=max(1, min(3, (os.cpu_count() or 2) + 1)))
    args = parser.parse_args(argv)
    try:
        if args.entry:
            print(json.dumps(run_entry(entry(args.entry), assembly=args.app.resolve()), default=str))
            return 0
        chosen = [entry(name) for name in args.names] if args.names else list(CATALOG)
    except TrainctlError as error:
        print(f"faults: {error.message}", file=sys.stderr)
        return 2
    started = time.monotonic()
    failed = 0
    pool = ThreadPoolExecutor(max_workers=args.workers)
    try:
        for item, report, failure, seconds in pool.map(lambda e: _run_one(e, args.app.resolve()), chosen):
            problems = judge(item, report) if report is not None else [f"no report: {failure}"]
            attempts_run = len(_attempts(report)) if report is not None else 0
            verdict = "PASS" if not problems else "FAIL"
            failed += bool(problems)
            detect = report.get("detect_s") if report is not None else None
            timing = f"  fault to attempt's end {detect} s" if detect is not None else ""
            detail = "" if not problems else "  " + "; ".join(problems)
            print(f"{verdict} {item.name:<30} attempts {attempts_run}  {seconds:5.1f} s{timing}{detail}", flush=True)
    except KeyboardInterrupt:
        print("faults: interrupted; the entries still running are stopped", file=sys.stderr)
        return 130
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    print(f"{len(chosen) - failed} passed, {failed} failed ({time.monotonic() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
