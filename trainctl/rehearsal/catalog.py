"""The fault catalog: every way a node or a service can fail a multi-node job, with the ending users need
and what must hold, each rehearsed on the reference script (examples/rehearsal/). `make faults` runs every
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
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.rehearsal.session import Options, checkout, rehearse
from trainctl.submitting.taskfile import load_task

TASK = Path("examples/rehearsal/task.yaml")
# The reference script checkpoints every CHECKPOINT_EVERY steps: checkpoint K is step K * CHECKPOINT_EVERY.
CHECKPOINT_EVERY = 10
# What a child's failure may cost before the main node ends the attempt (issue: "within 60 s, however it fails").
CHILD_FAILURE_SECONDS = 60.0
# The hang entry's HANG_SECONDS is 30, but the launcher never judges sooner than twice the slowest step it
# saw, and a step (with its checkpoint save) reached 30-60 s on a loaded two-core machine: three minutes is
# still "caught in minutes" (the issue), where PyTorch's own timeout is 10 and a wedge lasts until the
# attempt's timeout.
HANG_BOUND_SECONDS = 180.0
# A catalog entry that has not ended by then has hung.
DEADLINE_SECONDS = 240.0

Report = dict[str, Any]


@dataclass(frozen=True)
class Check:
    what: str
    test: Callable[[Report], bool]


def _attempts(report: Report) -> list[dict[str, Any]]:
    return [a for job in report["jobs"] for a in job["attempts"]]


def _resumed_step(attempt: dict[str, Any]) -> int | None:
    match = re.search(r"resumed from checkpoint-(\d+)", attempt["resumed"])
    return int(match.group(1)) if match else None


def attempts(count: int) -> Check:
    return Check(f"{count} attempt{'s' if count > 1 else ''} in all", lambda r: len(_attempts(r)) == count)


def resumed_from_newest(at_least: int) -> Check:
    """The last attempt resumed from the newest checkpoint completed before it (nothing trained twice, no
    older set restored), and that is at least checkpoint `at_least`."""

    def test(report: Report) -> bool:
        last = _attempts(report)[-1]
        step = _resumed_step(last)
        # What the lineage held in S3 when each earlier attempt ended (its newest checkpoint).
        ended_with = [a["last_checkpoint"] for a in _attempts(report)[:-1] if a["last_checkpoint"]]
        steps = [int(re.findall(r"\d+", name)[-1]) for name in ended_with]
        return step is not None and step >= at_least * CHECKPOINT_EVERY and step == max(steps, default=-1)

    return Check(f"the last attempt resumed from the newest checkpoint (at least checkpoint {at_least})", test)


def ended_within(seconds: float) -> Check:
    return Check(
        f"the fault ended its attempt within {seconds:.0f} s",
        lambda r: r["detect_s"] is not None and r["detect_s"] <= seconds,
    )


def main_line_names(node: int) -> Check:
    def test(report: Report) -> bool:
        first = _attempts(report)[0]
        main = next(n for n in first["nodes"] if n["main"])
        return re.search(rf"\bnode {node}\b", main["launcher"]) is not None

    return Check(f"the main node's last line names node {node}", test)


def why_says(text: str) -> Check:
    return Check(
        f"`trainctl why` says {text!r}", lambda r: any(text in line for job in r["jobs"] for line in job["why"])
    )


def host_taken_out(node: int) -> Check:
    """The launcher asked the host that served `node` in attempt 1 to take itself out (its marker: the
    rehearsal's own faults only ever remove devices or power hosts off)."""

    def test(report: Report) -> bool:
        host = next(n["host"] for n in _attempts(report)[0]["nodes"] if n["node"] == node)
        return any(h["host"] == host and h["taken_out"] for h in report["hosts"])

    return Check(f"node {node}'s first host asked to be taken out (the launcher's marker)", test)


def first_exit(code: int) -> Check:
    return Check(f"attempt 1 ended with exit {code}", lambda r: _attempts(r)[0]["exit_code"] == code)


def no_host_taken_out() -> Check:
    return Check("no host asked to be taken out", lambda r: not any(h["taken_out"] for h in r["hosts"]))


def attempt_ended(number: int, *, within: float, names: int) -> Check:
    """Attempt `number` ended within `within` seconds of its start, its main node naming node `names`."""

    def test(report: Report) -> bool:
        attempt = _attempts(report)[number - 1]
        main = next(n for n in attempt["nodes"] if n["main"])
        took = attempt["ended_s"] - attempt["started_s"]
        return took <= within and re.search(rf"\bnode {names}\b", main["launcher"]) is not None

    return Check(f"attempt {number} ended within {within:.0f} s, its main node naming node {names}", test)


def resubmitted() -> Check:
    return Check(
        "the capacity fallback resubmitted the job (a second job, from the first)",
        lambda r: len(r["jobs"]) == 2 and r["jobs"][1]["resubmitted_from"] == r["jobs"][0]["job_id"],
    )


def s3_throttled() -> Check:
    return Check("the local S3 did answer 503 SlowDown", lambda r: r["s3_throttled_requests"] > 0)


def checkpoints_in_s3(count: int) -> Check:
    return Check(
        f"all {count} checkpoints reached S3",
        lambda r: len({c for a in _attempts(r) for c in a["checkpoints_completed"]}) >= count,
    )


def evidence_uploaded() -> Check:
    return Check("the hang's evidence (stacks) was uploaded beside the checkpoints", lambda r: bool(r.get("evidence")))


@dataclass(frozen=True)
class Entry:
    name: str
    story: str
    faults: tuple[str, ...]
    expect: str
    holds: tuple[Check, ...]
    env: dict[str, str] = field(default_factory=dict)
    fleet: str = "gpu"


STEPS = 60
CATALOG: tuple[Entry, ...] = (
    Entry("no-fault", "two nodes train, checkpoint and finish", (), "succeeded",
          (attempts(1), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY), why_says("SUCCEEDED"))),
    Entry("kill-child", "a child's container is SIGKILLed after checkpoint 1 (an OOM kill looks the same)",
          ("kill-child@checkpoint:1",), "succeeded",
          (ended_within(CHILD_FAILURE_SECONDS), main_line_names(1), attempts(2), resumed_from_newest(1))),
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
          (ended_within(HANG_BOUND_SECONDS), evidence_uploaded(), attempts(2), resumed_from_newest(1)),
          {"HANG_SECONDS": "30"}),
    Entry("host-lost-mid-upload", "the node uploading checkpoint 2 loses its instance mid-upload",
          ("kill-upload@checkpoint:1",), "succeeded", (attempts(2), resumed_from_newest(1))),
    Entry("s3-slowdown", "S3 answers 503 SlowDown for 20 s after checkpoint 1", ("s3-slowdown=20@checkpoint:1",),
          "succeeded", (s3_throttled(), attempts(1), checkpoints_in_s3(STEPS // CHECKPOINT_EVERY))),
    Entry("capacity-cancel", "the main node's host is lost after checkpoint 2 and its retry finds no capacity: "
          "the queue cancels it and the capacity fallback resubmits it (a new job id)",
          ("lose-host:0@checkpoint:2", "capacity-cancel@checkpoint:2"), "succeeded",
          (resubmitted(), resumed_from_newest(2), why_says("Host EC2"))),
)  # fmt: skip


def entry(name: str) -> Entry:
    found = next((e for e in CATALOG if e.name == name), None)
    if found is None:
        raise TrainctlError(f"no catalog entry {name!r}: entries are {', '.join(e.name for e in CATALOG)}")
    return found


def run_entry(item: Entry, *, assembly: Path) -> Report:
    task = load_task(checkout() / TASK)
    task = task.model_copy(update={"fleet": item.fleet, "env": {**task.env, **item.env}, "command": [
        "examples/rehearsal/train.py", "--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--step-seconds", "0.1"]})  # fmt: skip
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
