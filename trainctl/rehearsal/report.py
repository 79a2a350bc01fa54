"""What a rehearsal saw: a timeline per attempt (each node's host, start, exit and reason, and what the
launcher said), the checkpoint each attempt resumed from and the last it completed, how long the fault
took to end the attempt and training to resume, and the verdict `trainctl why` gives for the same story
(the same code: trainctl/inspecting/why.py). The terminal's rendering of it is summary.py's."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

from trainctl.inspecting import stragglers
from trainctl.inspecting.why import explain
from trainctl.rehearsal.nodes import NodeRun
from trainctl.rehearsal.progress import plural
from trainctl.rehearsal.records import Attempt, JobRun, Rehearsal, epoch_milliseconds

# The launcher's own lines, the checkpoint copier's restore line and the example scripts' resume lines (the
# reference script's, and the one PyTorch's DDP tutorial prints, which examples/rehearsal/snapshot_in_place.py
# keeps).
LAUNCHER_LINE = re.compile(r"^distributed_run\.sh: (.*)$")
RESTORED_LINE = re.compile(r"checkpoint_sync: restored (\d+) files")
RESUMED_LINE = re.compile(r"(resumed from \S+.*|no checkpoint on any node.*|Resuming training from snapshot at .*)$")
# The reference script's line for a checkpoint file renamed into place (examples/rehearsal/train.py).
SAVED_LINE = re.compile(r"\bsaved (checkpoint-\d+\.pt)$")
# The main node's straggler watch (container/launcher/straggler_watch.py): a node named or back in line, and
# the metric line of each slow window (its Timestamp, epoch milliseconds, dates the window).
STRAGGLER_LINE = re.compile(r"^straggler_watch\.py: ((?:straggler: |node \d+ is back in line).*)$")
WINDOW_LINE = re.compile(r"^straggler_watch\.py: window: (.*)$")  # with STRAGGLER_LOG_WINDOWS=1
SLOW_WINDOW = re.compile(r'^\{"_aws":\{"Timestamp":(\d+).*"StragglerWindows":1,')
LOG_GROUP = "rehearsal"


def _launcher_said(run: NodeRun) -> str:
    """The launcher's last line other than the command it ran: why the node ended, when it says."""
    said = [m.group(1) for line in run.last_lines() if (m := LAUNCHER_LINE.match(line))]
    ending = [line for line in said if not re.match(r"(node \d+ of \d+ |single node,)", line)]
    return ending[-1][:300] if ending else ""


def _resumed(runs: list[NodeRun]) -> str:
    """How many files each node restored, and where the script says it resumed from."""
    restored, resumed = [], []
    for run in runs:
        lines = run.last_lines(2000)
        count = next((m.group(1) for line in lines if (m := RESTORED_LINE.search(line))), None)
        if count is not None:
            restored.append(f"node {run.index} restored {plural(int(count), 'file')}")
        resumed += [m.group(1) for line in lines if (m := RESUMED_LINE.search(line))]
    return "; ".join(restored + resumed[:1])


def _saved(runs: list[NodeRun]) -> list[str]:
    """The checkpoint files the script says it saved in this attempt, oldest first."""
    names = {m.group(1) for run in runs for line in run.last_lines(5000) if (m := SAVED_LINE.search(line))}
    return sorted(names, key=_step)


def _offset(rehearsal: Rehearsal, stamp: float | None) -> float | None:
    return None if stamp is None else round(stamp - rehearsal.started, 1)


def node_entry(rehearsal: Rehearsal, run: NodeRun) -> dict[str, Any]:
    return {
        "node": run.index,
        "main": run.is_main,
        "host": run.host.describe(),
        "started_s": _offset(rehearsal, run.started),
        "ended_s": _offset(rehearsal, run.ended),
        "exit_code": run.exit_code,
        "reason": run.reason,
        "status_reason": run.status_reason,
        "launcher": _launcher_said(run),
        "log": str(run.log_path),
        **_stragglers(rehearsal, run),
    }


def _stragglers(rehearsal: Rehearsal, run: NodeRun) -> dict[str, Any]:
    """What the node's straggler watch said, each with the time of the slow window just before it (when the
    node was named), and how many windows found a node slow (a straggler needs several in a row)."""
    said: list[dict[str, Any]] = []
    window: float | None = None
    slow = 0
    ratios: list[float] = []  # each logged window's largest ratio
    # The metric's Timestamp is wall time; the rehearsal's clock is the monotonic one.
    wall_to_monotonic = time.monotonic() - time.time()
    for line in run.last_lines(20000):
        if match := SLOW_WINDOW.match(line):
            window = int(match.group(1)) / 1000 + wall_to_monotonic
            slow += 1
        elif match := STRAGGLER_LINE.match(line):
            said.append({"at_s": _offset(rehearsal, window), "what": match.group(1)[:400]})
        elif match := WINDOW_LINE.match(line):
            ratios.append(max(float(x) for x in re.findall(r" ([0-9.]+)x", match.group(1))))
    return {"stragglers": said, "slow_windows": slow, "window_ratios": ratios}


def attempt_entry(rehearsal: Rehearsal, job: JobRun, attempt: Attempt) -> dict[str, Any]:
    before = {n for n, seen in job.checkpoint_seen.items() if seen < attempt.started}
    during = {n for n, seen in job.checkpoint_seen.items() if attempt.started <= seen <= (attempt.ended or seen)}
    return {
        "attempt": attempt.number,
        "started_s": _offset(rehearsal, attempt.started),
        "ended_s": _offset(rehearsal, attempt.ended),
        "exit_code": attempt.exit_code,
        "status_reason": attempt.status_reason,
        "retry": attempt.retry,
        "resumed": _resumed([n for n in attempt.nodes if n.started])[:300],
        "saved": _saved(attempt.nodes),
        "checkpoints_before": len(before),
        "checkpoints_completed": sorted(during, key=_step),
        "last_checkpoint": max(attempt.checkpoints_at_end, key=_step) if attempt.checkpoints_at_end else None,
        "nodes": [node_entry(rehearsal, n) for n in attempt.nodes],
        "events": [{"at_s": _offset(rehearsal, t), "what": text} for t, text in attempt.events],
    }


def _step(name: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", name)
    return (int(digits[-1]) if digits else -1, name)


def described(job: JobRun) -> dict[str, Any]:
    """The job as DescribeJobs would show it: what `trainctl why` reads."""
    attempts = []
    for attempt in job.attempts:
        main = attempt.main
        container: dict[str, Any] = {"logStreamName": str(main.log_path)}
        if attempt.exit_code is not None:
            container["exitCode"] = attempt.exit_code
        if main.reason:
            container["reason"] = main.reason
        attempts.append(
            {
                "container": container,
                "startedAt": epoch_milliseconds(attempt.started),
                "stoppedAt": epoch_milliseconds(attempt.ended or attempt.started),
                "statusReason": attempt.status_reason,
            }
        )
    ended = [a for a in attempts if a["stoppedAt"]]
    return {
        "jobId": job.job_id,
        "jobName": job.spec.name,
        "status": job.status,
        "startedAt": attempts[0]["startedAt"] if attempts else None,
        "stoppedAt": ended[-1]["stoppedAt"] if ended else None,
        "statusReason": job.status_reason,
        "attempts": attempts,
        "tags": dict(job.spec.tags),
        "nodeProperties": {
            "numNodes": job.spec.nodes,
            "nodeRangeProperties": [
                {"targetNodes": "0:", "container": {"logConfiguration": {"options": {"awslogs-group": LOG_GROUP}}}}
            ],
        },
    }


def verdict(job: JobRun) -> list[str]:
    """What `trainctl why` would say, reading the main node's log of each attempt as it reads CloudWatch's."""

    def tail(group: str, stream: str) -> list[str]:
        try:
            with open(stream, errors="replace") as log:
                return log.read().splitlines()[-50:]
        except OSError:
            return []

    def find(group: str, stream: str) -> list[str]:
        try:
            with open(stream, errors="replace") as log:
                return [line for line in log.read().splitlines() if stragglers.WATCH in line]
        except OSError:
            return []

    job_view = described(job)
    slow = stragglers.notes(stragglers.main_streams(job_view, None), LOG_GROUP, find)
    return explain(job_view, queue=None, environment=None, instance=None,
                   now=datetime.now(UTC), tail=tail).reasons + slow  # fmt: skip


def detect_and_recover(rehearsal: Rehearsal) -> dict[str, float | None]:
    """Seconds from the first fault to the end of the attempt it ended, and from that end to the first
    checkpoint completed after it (training running again)."""
    if not rehearsal.fired:
        return {"detect_s": None, "recover_s": None}
    fault_at = rehearsal.fired[0][0]
    attempts = [(job, a) for job in rehearsal.jobs() for a in job.attempts]
    hit = next(((job, a) for job, a in attempts if a.ended and a.ended >= fault_at and a.exit_code != 0), None)
    if hit is None:
        return {"detect_s": None, "recover_s": None}
    ended = hit[1].ended or fault_at
    later = [seen for job in rehearsal.jobs() for seen in job.checkpoint_seen.values() if seen > ended]
    if not later:
        return {"detect_s": round(ended - fault_at, 1), "recover_s": None}
    # A capacity cancel between the two: on Batch the retry waited RUNNABLE first, which is not slept here.
    waited = sum(j.runnable_wait for j in rehearsal.jobs() if j.cancelled_at and ended <= j.cancelled_at <= min(later))
    return {"detect_s": round(ended - fault_at, 1), "recover_s": round(min(later) - ended + waited, 1)}


def build(rehearsal: Rehearsal, *, left_out: dict[str, str], expect: str) -> dict[str, Any]:
    last = rehearsal.last
    jobs = [
        {
            "job_id": job.job_id,
            "status": job.status,
            "status_reason": job.status_reason,
            "resubmitted_from": job.resubmitted_from,
            "placement": job.placement,
            "runnable_wait_s": job.runnable_wait or None,
            "attempts": [attempt_entry(rehearsal, job, a) for a in job.attempts],
            "why": verdict(job),
        }
        for job in rehearsal.jobs()
    ]
    spec = rehearsal.first.spec
    facts = rehearsal.facts
    waited = sum(job.runnable_wait for job in rehearsal.jobs())
    seconds = round(rehearsal.ended - rehearsal.started, 1)
    hosts = [
        {"host": h.describe(), "taken_out": h.take_out_reason or None, "powered_off": h.powered_off}
        for pool in rehearsal.pools
        for h in pool.hosts
    ]
    return {
        "definition": spec.definition,
        "fleet": spec.fleet,
        "nodes": spec.nodes,
        "main_node": spec.main_node,
        "command": list(spec.command),
        "attempts_allowed": spec.attempts,
        "timeout_seconds": spec.timeout_seconds,
        "stop_grace_s": facts.stop_grace_seconds,
        "stop_grace_from": facts.stop_grace_from,
        "capacity_wait_s": facts.capacity_wait_seconds,
        "capacity_wait_from": facts.capacity_wait_from,
        "not_rehearsed": left_out,
        "faults": [f.spec for f in rehearsal.faults],
        "unfired_faults": rehearsal.unfired,
        "s3_throttled_requests": rehearsal.throttled,
        "fault_events": [{"at_s": _offset(rehearsal, t), "what": text} for t, text in rehearsal.fired],
        "jobs": jobs,
        "hosts": hosts,
        "evidence": [key for job in rehearsal.jobs() for key in job.evidence],
        "ending": last.status,
        "expected": expect.upper(),
        "as_expected": last.status == expect.upper() and not rehearsal.deadline_hit and not rehearsal.unfired,
        "deadline_hit": rehearsal.deadline_hit,
        "seconds": seconds,
        # Time Batch would have spent that the rehearsal did not sleep: a retry RUNNABLE until its queue's
        # capacity limit cancelled it. On Batch the job took seconds + runnable_wait_s at least.
        "runnable_wait_s": waited,
        "batch_seconds": round(seconds + waited, 1),
        **detect_and_recover(rehearsal),
    }
