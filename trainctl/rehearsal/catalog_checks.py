"""What must hold after a fault catalog entry (catalog.py), as checks on a rehearsal's report
(report.build's dictionary): attempts, resumes, which node a line names, bounds, uploads."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The reference script checkpoints every CHECKPOINT_EVERY steps: checkpoint K is step K * CHECKPOINT_EVERY.
CHECKPOINT_EVERY = 10
# What a child's failure may cost before the main node ends the attempt (issue: "within 60 s, however it fails").
CHILD_FAILURE_SECONDS = 60.0
# A hang is caught within its limit plus a minute. The limit is HANG_SECONDS, never below twice the slowest
# step the watch measured (progress_watch.py), so on a loaded machine it grows with the steps: each hang entry
# is judged against the limit the watch states in its line, "(limit N s)".
HANG_MARGIN_SECONDS = 60.0
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


def resumed_from_snapshot_epoch(at_least: int) -> Check:
    """The last attempt's script said it resumed from its snapshot at epoch `at_least` or later (the DDP
    tutorial's line, examples/rehearsal/snapshot_in_place.py), not from the start."""

    def test(report: Report) -> bool:
        match = re.search(r"Resuming training from snapshot at Epoch (\d+)", _attempts(report)[-1]["resumed"])
        return match is not None and int(match.group(1)) >= at_least

    return Check(f"the last attempt resumed from its snapshot at epoch {at_least} or later", test)


def resumed_dcp_step(at_least: int) -> Check:
    """The last attempt's ranks all resumed from one `step-N/` (N at least `at_least`), as
    examples/rehearsal/dcp_steps.py's rank 0 says once every rank loaded it."""

    def test(report: Report) -> bool:
        match = re.search(r"resumed from step-(\d+) on all \d+ ranks", _attempts(report)[-1]["resumed"])
        return match is not None and int(match.group(1)) >= at_least

    return Check(f"every rank of the last attempt resumed from one step-N/, N at least {at_least}", test)


def ended_within(seconds: float) -> Check:
    return Check(
        f"the fault ended its attempt within {seconds:.0f} s",
        lambda r: r["detect_s"] is not None and r["detect_s"] <= seconds,
    )


def fault_ended_within(fault: str, seconds: float) -> Check:
    """The attempt that fault `fault` (its spec) ended, ended within `seconds` of it (other faults, such as a
    lag that applies from the start, do not count)."""

    def test(report: Report) -> bool:
        at = next(e["at_s"] for e in report["fault_events"] if e["what"].startswith(f"fault {fault}"))
        ends = [a["ended_s"] for a in _attempts(report) if a["ended_s"] is not None and a["ended_s"] >= at]
        return bool(ends) and min(ends) - at <= seconds

    return Check(f"the fault {fault} ended its attempt within {seconds:.0f} s", test)


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


def _main_line(attempt: dict[str, Any]) -> str:
    return str(next(n for n in attempt["nodes"] if n["main"])["launcher"])


def hang_caught() -> Check:
    """The hang ended its attempt within the limit the watch measured (HANG_SECONDS, or twice the slowest
    step it saw) plus HANG_MARGIN_SECONDS."""

    def test(report: Report) -> bool:
        limit = re.search(r"\(limit (\d+) s\)", _main_line(_attempts(report)[0]))
        return (
            limit is not None
            and report["detect_s"] is not None
            and (report["detect_s"] <= int(limit.group(1)) + HANG_MARGIN_SECONDS)
        )

    return Check(f"the hang ended its attempt within its limit plus {HANG_MARGIN_SECONDS:.0f} s", test)


def hang_names(node: int) -> Check:
    """The hang line names `node` as where a rank stopped first (not a peer that waited for it)."""

    def test(report: Report) -> bool:
        line = _main_line(_attempts(report)[0])
        named = rf"(ranks? [\d, ]+ on node {node}|node {node} \(ranks? [^)]*\)) stopped first"
        return re.search(named, line) is not None

    return Check(f"the hang line names node {node} as the one that stopped first", test)


def last_save_uploaded() -> Check:
    """The newest checkpoint the script saved in the last attempt is in S3 at its end: nothing it saved is lost."""

    def test(report: Report) -> bool:
        last = _attempts(report)[-1]
        saved, uploaded = last["saved"], last["last_checkpoint"]
        newest = max((int(re.findall(r"\d+", name)[-1]) for name in saved), default=None)
        return newest is not None and uploaded is not None and int(re.findall(r"\d+", uploaded)[-1]) >= newest

    return Check("the last checkpoint the script saved is in S3 at the end: checkpoints kept", test)


def evidence_uploaded() -> Check:
    return Check("the hang's evidence (stacks) was uploaded beside the checkpoints", lambda r: bool(r.get("evidence")))


def _straggler_lines(report: Report) -> list[dict[str, Any]]:
    return [said for a in _attempts(report) for n in a["nodes"] if n["main"] for said in n.get("stragglers", [])]


def straggler_named(node: int) -> Check:
    """The main node's straggler watch named `node`, and only it."""

    def test(report: Report) -> bool:
        named = {m.group(1) for s in _straggler_lines(report) if (m := re.match(r"straggler: node (\d+) ", s["what"]))}
        return named == {str(node)}

    return Check(f"the straggler watch named node {node}, and no other", test)


def no_straggler_named() -> Check:
    return Check(
        "the straggler watch named no node",
        lambda r: not any(s["what"].startswith("straggler: ") for s in _straggler_lines(r)),
    )


def straggler_found_within(fault: str, seconds: float) -> Check:
    """The straggler was named within `seconds` of the slowdown's start (the fault's event)."""

    def test(report: Report) -> bool:
        at = next(e["at_s"] for e in report["fault_events"] if e["what"].startswith(f"fault {fault}"))
        named = [s["at_s"] for s in _straggler_lines(report) if s["what"].startswith("straggler: ")]
        return bool(named) and named[0] is not None and named[0] - at <= seconds

    return Check(f"the straggler was named within {seconds:.0f} s of the slowdown", test)
