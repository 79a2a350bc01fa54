"""The rehearsal's report for a terminal, after the events it told while it ran (progress.py): what was
rehearsed, a table of each job's attempts, the nodes that did not exit 0, what `trainctl why` says, where
the node logs are, and the verdict last. Every line fits progress.WIDTH columns; a value the report leaves
out (JSON null) is said in words."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trainctl.rehearsal.batch_rules import EXITED_REASON, HOST_LOST_REASON
from trainctl.rehearsal.progress import node_ending, plural, wrap

NODE_LOG = re.compile(r"^node-(\d+)\.log$")
# The reference script's words (examples/rehearsal/train.py), as report.py quotes them in `resumed`.
RESUMED_FROM = re.compile(r"resumed from (\S+)")
RESTORED = re.compile(r"restored (\d+) files?")
HOST_LOST = HOST_LOST_REASON.split("{", 1)[0]


def lost_host(node: dict[str, Any]) -> bool:
    return node["exit_code"] is None and str(node["status_reason"]).startswith(HOST_LOST)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def table(header: list[str], rows: list[tuple[list[str], str]], *, indent: str, right: frozenset[int]) -> list[str]:
    """Columns as wide as their longest cell; each row's note (why the attempt ended) wraps on the lines
    under it, from the second column on, so that it gets the whole width."""
    widths = [max(len(cells[i]) for cells in [header, *(r[0] for r in rows)]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return (indent + "  ".join(padded)).rstrip()

    under = " " * (len(indent) + widths[0] + 2)
    out = [line(header)]
    for cells, note in rows:
        out.append(line(cells))
        if note:
            out += wrap(note, first=under + "ended: ", rest=under + "  ")
    return out


def resumed_from(attempt: dict[str, Any]) -> str:
    """Where the attempt's training started, as short as a table cell allows."""
    said = attempt["resumed"]
    if match := RESUMED_FROM.search(said):
        return match.group(1)
    if "no checkpoint on any node" in said:
        return "nothing"
    restored = sum(int(m.group(1)) for m in RESTORED.finditer(said))
    if restored:
        return f"{plural(restored, 'file')} restored"
    if not any(node["started_s"] is not None for node in attempt["nodes"]):
        return "never ran"
    return "nothing" if attempt["checkpoints_before"] == 0 else "not said"


def _main(attempt: dict[str, Any]) -> dict[str, Any]:
    return next(node for node in attempt["nodes"] if node["main"])


def attempt_row(attempt: dict[str, Any]) -> tuple[list[str], str]:
    main = _main(attempt)
    said = main["launcher"] or attempt["status_reason"]
    if said == EXITED_REASON and attempt["exit_code"] is not None:  # Batch's words for any exit
        said = "the main node finished" if attempt["exit_code"] == 0 else f"the main node exited {attempt['exit_code']}"
    why = "; ".join(part for part in (said, attempt["retry"] or "the job ended") if part)
    cells = [
        str(attempt["attempt"]),
        seconds(attempt["started_s"]),
        seconds(attempt["ended_s"]),
        "none" if attempt["exit_code"] is None else str(attempt["exit_code"]),
        resumed_from(attempt),
        str(len(attempt["checkpoints_completed"])),
    ]
    return cells, why


def other_nodes(attempt: dict[str, Any]) -> list[str]:
    """The children that did not exit 0, each with how and why."""
    out = []
    for node in attempt["nodes"]:
        if node["main"] or node["exit_code"] == 0:
            continue
        started = node["started_s"] is not None
        ending = node_ending(node["exit_code"], started, lost_host(node))
        when = f" at {seconds(node['ended_s'])}" if started and node["ended_s"] is not None else ""
        why = node["status_reason"] or node["reason"]
        said = f"; launcher: {node['launcher']}" if node["launcher"] else ""
        text = f"attempt {attempt['attempt']}, node {node['node']} on {node['host']}: {ending}{when}"
        out += wrap(text + (f", {why}" if why else "") + said, first="    ", rest="      ")
    return out


def job_lines(report: dict[str, Any], job: dict[str, Any]) -> list[str]:
    origin = f" (resubmitted from {job['resubmitted_from']})" if job["resubmitted_from"] else ""
    reason = f" ({job['status_reason']})" if job["status_reason"] else ""
    out = wrap(f"job {job['job_id']}{origin}: {job['status']}{reason}", rest="  ")
    if job["runnable_wait_s"]:
        out += wrap(
            f"its retry waited RUNNABLE {job['runnable_wait_s']:g} s before the queue cancelled it "
            f"({report['capacity_wait_from']}); not slept here",
            first="  ",
            rest="    ",
        )
    if job["attempts"]:
        header = ["attempt", "start", "end", "exit", "resumed from", "new checkpoints"]
        out += table(header, [attempt_row(a) for a in job["attempts"]], indent="  ", right=frozenset({0, 1, 2, 3, 5}))
    seen = [name for a in job["attempts"] for name in a["checkpoints_completed"]]
    last = next((a["last_checkpoint"] for a in reversed(job["attempts"]) if a["last_checkpoint"]), "")
    if seen or last:
        newest = f"; the newest at the end: {last}" if last else ""
        completed = f"checkpoints completed in the local S3: {plural(len(seen), 'file')}{newest}"
        out += wrap(completed, first="  ", rest="    ")
    others = [line for a in job["attempts"] for line in other_nodes(a)]
    if others:
        out += ["  other nodes that did not exit 0:", *others]
    for reason in job["why"]:
        out += wrap(reason, first="  why: ", rest="       ")
    return out


def braces(indexes: list[int]) -> str:
    """Node log names as a shell pattern: node-0.log, node-{0,1}.log, node-{0..15}.log."""
    if len(indexes) == 1:
        return f"node-{indexes[0]}.log"
    if len(indexes) > 2 and indexes == list(range(indexes[0], indexes[-1] + 1)):
        return f"node-{{{indexes[0]}..{indexes[-1]}}}.log"
    return "node-{" + ",".join(map(str, indexes)) + "}.log"


def log_lines(report: dict[str, Any]) -> list[str]:
    """Where each attempt's node logs are, relative to the folder that keeps them."""
    folder = report.get("logs_dir")
    if not folder:
        return ["node logs: not kept (--clean)"]
    out = wrap(f"node logs under {folder}:", rest="  ")
    jobs = report["jobs"]
    for number, job in enumerate(jobs, start=1):
        for attempt in job["attempts"]:
            label = f"job {number}, attempt {attempt['attempt']}" if len(jobs) > 1 else f"attempt {attempt['attempt']}"
            paths = [Path(node["log"]) for node in attempt["nodes"]]
            parents = {path.parent for path in paths}
            matches = [NODE_LOG.match(path.name) for path in paths]
            if len(parents) == 1 and all(matches):
                parent = parents.pop()
                where = parent.relative_to(folder) if parent.is_relative_to(folder) else parent
                names = braces(sorted(int(m.group(1)) for m in matches if m))
                out += wrap(f"{where}/{names}", first=f"  {label}: ", rest="    ")
            else:
                out += wrap(", ".join(map(str, paths)), first=f"  {label}: ", rest="    ")
    return out


def verdict(report: dict[str, Any]) -> str:
    """The last line: how the job ended, in how long, and whether that is what was expected."""
    missed = []
    if report["ending"] != report["expected"]:
        missed.append(f"expected {report['expected']}")
    if report["deadline_hit"]:
        missed.append("the rehearsal's deadline ended it")
    if report["unfired_faults"]:
        missed.append(f"{plural(len(report['unfired_faults']), 'fault')} never fired")
    outcome = f"NOT as expected ({'; '.join(missed)})" if missed else "as expected"
    on_batch = f" (on Batch {report['batch_seconds']} s with the RUNNABLE wait)" if report["runnable_wait_s"] else ""
    return f"{report['ending']} in {report['seconds']} s{on_batch}: {outcome}"


def lines(report: dict[str, Any]) -> list[str]:
    """The whole summary, each line at most progress.WIDTH columns."""
    timeout = f"timeout {report['timeout_seconds']} s" if report["timeout_seconds"] else "no timeout"
    out = wrap(
        f"rehearsal of {report['definition']} (fleet {report['fleet']}): {plural(report['nodes'], 'node')}, "
        f"main node {report['main_node']}, up to {plural(report['attempts_allowed'], 'attempt')}, {timeout}",
        rest="  ",
    )
    out += wrap(" ".join(report["command"]), first="  command: ", rest="    ")
    out += wrap(
        f"stop timeout {report['stop_grace_s']:g} s (SIGKILL after SIGTERM): {report['stop_grace_from']}",
        first="  ",
        rest="    ",
    )
    if report["not_rehearsed"]:
        left = ", ".join(f"{k}={v}" for k, v in report["not_rehearsed"].items())
        out += wrap(left, first="  not rehearsed on this machine: ", rest="    ")
    for event in report["fault_events"]:
        out += wrap(event["what"], first=f"  {seconds(event['at_s']):>8}  ", rest=" " * 14)
    if report["unfired_faults"]:
        out += wrap(", ".join(report["unfired_faults"]), first="  faults whose trigger never came: ", rest="    ")
    for job in report["jobs"]:
        out += job_lines(report, job)
    for host in report["hosts"]:
        if host["taken_out"] or host["powered_off"]:
            out += wrap(f"{host['host']}: taken out ({host['taken_out'] or 'terminated'})", first="  ", rest="    ")
    timing = []
    if report["detect_s"] is not None:
        timing.append(f"the fault ended its attempt after {report['detect_s']} s")
    if report["recover_s"] is not None:
        timing.append(f"training checkpointed again {report['recover_s']} s later")
    if timing:
        out += wrap("; ".join(timing), rest="  ")
    out += log_lines(report)
    out += wrap(verdict(report), rest="  ")
    return out
