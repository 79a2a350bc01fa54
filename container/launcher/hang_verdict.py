"""The main node's hang verdict, for progress_watch.py: the nodes' reports, which node stopped first, the
exit code and the one line that says why.

The attempt ends once no node still waited for is progressing and at least one is hung. A child whose
launcher has ended (the listener writes `<faults dir>/children/node-<n>`, one JSON object: node, code,
line) is neither hung nor progressing and is not waited for. Every child's watch says it is there when it
starts (a "progressing" report), so a child never heard from cannot reach the listener or runs no watch: it
holds the verdict back until every hung node has been quiet for its limit plus NO_WORD_SECONDS (time for
its own report, stack dumps and upload included, to arrive), and the line then says "no word from it".
Stdlib only, Python 3.10.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from progress_signals import HUNG

NODE_FAULT_EXIT = 75
# GNU coreutils `timeout` exits 124 when the command timed out: a hang seen again after its retry. The job
# definitions retry 75 alone, so 124 ends the job (training_constructs/jobs/multi_node_job.py RETRY_RULES).
HANG_EXIT = 124
NO_WORD_SECONDS = 60.0
SIGNALLED = ("T", "t")  # /proc/<pid>/stat: stopped by a signal, or by a tracer


@dataclass
class NodeReport:
    node: int
    host: str
    state: str
    last: float | None
    limit: float
    source: str
    ranks: list[tuple[int, str]] = field(default_factory=list)
    hardware: str | None = None
    evidence: str | None = None
    note: str = ""
    heartbeat: bool = False  # this node's ranks touched TRAINING_HEARTBEAT_FILE
    waiting: list[int] = field(default_factory=list)  # ranks whose innermost frame waits on the peers
    outside: list[tuple[int, str]] = field(default_factory=list)  # ranks elsewhere: (rank, innermost frame)
    ras: str = ""  # what NCCL's RAS view says (hang_evidence.ras_view); "" off NVIDIA nodes

    @property
    def stopped_ranks(self) -> list[int]:
        return [rank for rank, state in self.ranks if state in (*SIGNALLED, "Z", "D")]

    @property
    def signalled(self) -> bool:
        return any(state in SIGNALLED for _, state in self.ranks)

    @classmethod
    def parse(cls, line: str) -> NodeReport | None:
        try:
            fields = json.loads(line)
            fields["ranks"] = [tuple(r) for r in fields.get("ranks", [])]
            fields["outside"] = [tuple(r) for r in fields.get("outside", [])]
            return cls(**fields)
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Ended:
    """A child whose launcher ended: code 0 when its trainer succeeded."""

    node: int
    code: int
    line: str = ""


def children(hangs: Path | None) -> dict[int, NodeReport]:
    """The children's latest reports, from the file the main node's listener appends to."""
    latest: dict[int, NodeReport] = {}
    if hangs is None or not hangs.exists():
        return latest
    for line in hangs.read_text().splitlines():
        report = NodeReport.parse(line)
        if report is not None:
            latest[report.node] = report
    return latest


def ended_children(faults: Path | None) -> dict[int, Ended]:
    """The children whose ending the listener recorded under `faults`/children/."""
    found: dict[int, Ended] = {}
    if faults is None:
        return found
    for path in sorted((faults / "children").glob("node-*")):
        try:
            if path.suffix == ".batch":
                # The node watch's: Batch shows the child ended (SUCCEEDED or FAILED).
                node = int(path.stem.removeprefix("node-"))
                ended = Ended(node, 0 if path.read_text().strip() == "SUCCEEDED" else 1, "Batch shows it ended")
                found.setdefault(node, ended)
                continue
            fields = json.loads(path.read_text())
            ended = Ended(int(fields["node"]), int(fields["code"]), str(fields.get("line", "")))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        found[ended.node] = ended
    return found


def _clock(epoch: float | None) -> str:
    if epoch is None:
        return "none"
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M:%S UTC")


def first_stopped(hung: Sequence[NodeReport]) -> NodeReport:
    """The node that stopped first: one with a hardware sign or a rank stopped by a signal; else one with a
    rank outside any collective while ranks elsewhere wait in one (the others wait for it); else, among the
    nodes whose last progress lies within one limit of the newest (a node whose last output came hours ago,
    as with rank-0-only logging, is not the cause), one with a rank exited or stuck in the kernel, else the
    oldest last progress."""

    def oldest(reports: Sequence[NodeReport]) -> NodeReport:
        return min(reports, key=lambda h: (h.last or 0.0, h.node))

    marked = [h for h in hung if h.hardware or h.signalled]
    if marked:
        return oldest(marked)
    if any(h.waiting for h in hung):
        outside = [h for h in hung if h.outside]
        if outside:
            return oldest(outside)
    newest = max(h.last or 0.0 for h in hung)
    candidates = [h for h in hung if (h.last or 0.0) >= newest - max(h.limit for h in hung)]
    return oldest([h for h in candidates if h.stopped_ranks] or candidates)


def hang_exit(attempt: int, *, hardware: bool, heartbeat: bool) -> int:
    """75 (retried) on a hardware sign, on the first attempt, or when no node touched the heartbeat (silence
    alone is never proof enough to stop retrying); HANG_EXIT (not retried) from the second attempt on."""
    return NODE_FAULT_EXIT if hardware or not heartbeat or attempt <= 1 else HANG_EXIT


def _who(first: NodeReport, hung: Sequence[NodeReport]) -> tuple[str, str]:
    def ranks(numbers: Sequence[int]) -> str:
        return f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"

    stopped = first.stopped_ranks
    if stopped:
        why = "stopped: state " + "".join(sorted({s for r, s in first.ranks if r in stopped}))
        return f"{ranks(stopped)} on node {first.node}", why
    waiting = sorted({r for h in hung for r in h.waiting})
    if first.outside and waiting:
        where = "; ".join(f"rank {r} in {frame}" for r, frame in first.outside)[:160]
        verb = "waits" if len(waiting) == 1 else "wait"
        return f"{ranks([r for r, _ in first.outside])} on node {first.node}", (
            f"outside any collective while {ranks(waiting)} {verb} in one: {where}"
        )
    listed = ", ".join(str(r) for r, _ in first.ranks) or "none found"
    return f"node {first.node} (ranks {listed})", f"by its {first.source or 'output'}"


def verdict(
    reports: Mapping[int, NodeReport],
    nodes: int,
    attempt: int,
    now: float,
    ended: Mapping[int, Ended] | None = None,
) -> tuple[int, str] | None:
    """(exit code, line) once no node waited for progresses and one is hung; None before."""
    ended = ended or {}
    expected = [n for n in range(nodes) if n not in ended]
    hung = [reports[n] for n in expected if n in reports and reports[n].state == HUNG]
    if not hung or any(n in reports and reports[n].state != HUNG for n in expected):
        return None
    silent = [n for n in expected if n not in reports]
    if silent and any(now - (r.last or now) < r.limit + NO_WORD_SECONDS for r in hung):
        return None
    first = first_stopped(hung)
    hardware = [r for r in hung if r.hardware]
    heartbeat = any(r.heartbeat for r in hung)
    code = hang_exit(attempt, hardware=bool(hardware), heartbeat=heartbeat)
    who, why = _who(first, hung)
    newest = max((r.last for r in hung if r.last is not None), default=now)
    parts = [
        # The verdict waits for every node's own limit: the largest is the one that held it back.
        f"node {first.node} ({first.host}): hang: no progress on any node for {now - newest:.0f} s"
        f" (limit {max(r.limit for r in hung):.0f} s)",
        f"{who} stopped first (last progress {_clock(first.last)}, {why})",
    ]
    parts += [f"node {r.node} shows a hardware fault: {r.hardware}" for r in hardware]
    parts += [f"node {n}: no word from it" for n in silent]
    parts += [f"node {e.node} had ended (exit {e.code})" for e in sorted(ended.values(), key=lambda e: e.node)]
    where = {r.evidence.rstrip("/").rsplit("/", 1)[0] + "/" for r in hung if r.evidence}
    if where:
        parts.append(f"stacks at {' '.join(sorted(where))}")
    else:
        parts.append("stacks in each node's log (no CHECKPOINT_URI to upload them to)")
    # RAS's view is job-wide: the first stopped node's, else any node's that has one.
    ras = first.ras or next((r.ras for r in hung if r.ras), "")
    if ras:
        parts.append(ras)
    failed = [f"node {r.node}: {r.note}" for r in hung if r.note]
    if failed:
        parts.append("; ".join(failed)[:200])
    if code == HANG_EXIT:
        parts.append(f"a hang again on attempt {attempt}")
    elif not hardware:
        parts.append(
            "retried once"
            if heartbeat
            else "retried (no node touched TRAINING_HEARTBEAT_FILE: a hang is final only with it)"
        )
    return code, "; ".join(parts)
