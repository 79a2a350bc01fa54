"""How a node's attempt ends: its exit code, the line that says why, and whether its host is asked to
take it out. Pure functions of what the other phases observed; tests/test_launcher_decisions.py holds
their table. Batch decides a multi-node job by the main node's exit code alone (Batch user guide,
"Multi-node parallel jobs"), and the job definitions retry only exit 75 (training_constructs/jobs).

  0    the trainer succeeded (and, with checkpoints, its last upload did too)
  1..  the trainer's own status: the application's, not retried (1 also when only the last upload failed);
       also when every node that failed said it was an application error (the first one's status), or
       ECS killed a child for memory (137)
  2    bad input: a value the launcher cannot run with, or a child's; not retried
  75   a node fault or a lost node: a failed device preflight, a trainer that died on a hardware fault,
       a child that reported one, a child that died without a word (Batch shows it FAILED, or it fell
       silent while Batch still shows it running), failures that are all a lost peer's echo, a first
       hang, a straggler replaced (STRAGGLER_ACTION=replace); retried on fresh nodes
  78   a fault every node of the fleet shares (the AMI, the image); not retried
  124  a hang seen again after its retry, with a heartbeat (without one a hang is 75); not retried
  143  stopped (SIGTERM) before training started
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from failure_text import Failure

BAD_INPUT_EXIT = 2
# A failed preflight (preflight.py PREFLIGHT_EXIT): the one exit code the job definitions retry.
NODE_FAULT_EXIT = 75
# The fleet's AMI or image cannot train on this GPU (preflight.py IMAGE_EXIT): not retried.
IMAGE_EXIT = 78
# A hang seen again after its retry (progress_watch.py HANG_EXIT): not retried.
HANG_EXIT = 124
STOPPED_EXIT = 143
COMMAND_NOT_FOUND_EXIT = 127  # the trainer's command cannot be run: the application's, not retried
# The preflight's own verdicts; any other status means it could not check the node.
PREFLIGHT_VERDICTS = (NODE_FAULT_EXIT, IMAGE_EXIT, BAD_INPUT_EXIT)
# A child's code that is the job's too: no retry mends bad input, a shared fault or a repeated hang.
FINAL_CODES = (BAD_INPUT_EXIT, IMAGE_EXIT, HANG_EXIT)
# A child's word that decides at once: the job's final code, or a node fault (retried).
DECISIVE_CODES = (*FINAL_CODES, NODE_FAULT_EXIT)
# Said in a node's line when it writes its take-out marker (trainctl/inspecting/recovery.py reads it).
TAKEN_OUT = "this node asks its host to take it out"
# After a trainer failed, how long the main node waits for every child's word (NODE_VERDICT_SECONDS), and
# how long a child that Batch does not show ended may stay silent before it counts as lost
# (NODE_LOST_SECONDS). A child says "alive" every node_fault.ALIVE_SECONDS (5): four missed in a row is no
# network hiccup.
VERDICT_SECONDS = 180
LOST_SECONDS = 20.0
ALIVE_SECONDS = 5.0  # node_fault.ALIVE_SECONDS (a test keeps the two equal)


@dataclass(frozen=True)
class Report:
    """What a child (node_fault.py), Batch (node_watch.py) or the hang watch told the main node."""

    code: int
    line: str

    @classmethod
    def parse(cls, text: str) -> Report | None:
        """The report file's first line, "<code> <line>"; None when it is empty."""
        first = text.splitlines()[0] if text.strip() else ""
        if not first:
            return None
        code, _, line = first.partition(" ")
        return cls(int(code) if code.isascii() and code.isdigit() else NODE_FAULT_EXIT, line)


@dataclass(frozen=True)
class Ending:
    code: int
    line: str | None = None  # said with the launcher's prefix before it exits
    mark: str | None = None  # the take-out marker's line: the host takes this node out


def for_report(report: Report) -> Ending:
    """The main node ends for a report: the job's code when no retry mends it, 75 for a node fault, and an
    application's own status (a child killed for memory, an application error) kept, not retried."""
    if report.code in FINAL_CODES:
        return Ending(report.code, f"{report.line}; ending this job with exit {report.code} (not retried)")
    if report.code == NODE_FAULT_EXIT:
        return Ending(
            NODE_FAULT_EXIT,
            f"{report.line}; ending this job with exit {NODE_FAULT_EXIT} so that Batch retries it on other nodes",
        )
    said = f"ending this job with exit {report.code} (the application's, not retried)"
    return Ending(report.code, f"{report.line}; {said}")


def for_straggler(line: str) -> Ending:
    """This node was named the straggler to replace (straggler_watch.py) and a checkpoint is in S3: a node
    fault, its host takes it out, and the retry resumes on fresh nodes. `line` names the node and why."""
    return Ending(
        NODE_FAULT_EXIT,
        f"{line}; {TAKEN_OUT}; ending this job with exit {NODE_FAULT_EXIT} so that Batch retries it on other nodes",
        mark=line,
    )


def child_code(status: int, *, training_started: bool) -> int:
    """The code a child sends for its own ending: before training, anything but the job's final codes is a
    node's trouble (75); after, its trainer's status is the application's (a hardware fault is sent as 75)."""
    if training_started or status in FINAL_CODES or status == 0:
        return status
    return NODE_FAULT_EXIT


def preflight_failed(status: int) -> bool:
    return status in PREFLIGHT_VERDICTS


def for_preflight(status: int, last_error: str) -> Ending:
    """A node that failed its own checks (preflight.py printed the line). Only a node fault, not a
    shared one nor bad input, asks the host to take the node out."""
    mark = f"preflight: {last_error or f'exit {NODE_FAULT_EXIT}'}" if status == NODE_FAULT_EXIT else None
    return Ending(status, mark=mark)


def for_stop_before_training(stopped_fault: str) -> Ending:
    """Stopped before training: 143, and the take-out when the host recorded a hardware fault."""
    mark = f"stopped, hardware fault: {stopped_fault}" if stopped_fault else None
    return Ending(STOPPED_EXIT, mark=mark)


def should_check_hardware(*, status: int, stopped: bool, reported: bool) -> bool:
    """After the trainer ends: only a failure of this node's own (no stop, no child's report) may be
    its hardware's; a stopped node reads the Xid record alone (judge_stopped)."""
    return status != 0 and not stopped and not reported


@dataclass(frozen=True)
class Outcome:
    """What the node observed by the time its trainer and its last upload ended."""

    status: int  # the trainer's exit status (128 + N for signal N)
    report: Report | None = None  # a child's report or Batch's FAILED, read last
    hardware_fault: str = ""  # node_fault.py judge: an Xid or failing devices after a failure
    stopped_fault: str = ""  # node_fault.py judge --xid-only after a stop
    upload_failed: bool = False  # the copier's last upload did not complete


def after_training(outcome: Outcome) -> Ending:
    status = outcome.status
    if outcome.upload_failed and status == 0:
        status = 1
    # A report that came after this node's trainer succeeded does not undo the success.
    if outcome.report is not None and status != 0:
        return for_report(outcome.report)
    if outcome.hardware_fault:
        return Ending(NODE_FAULT_EXIT, mark=f"hardware fault: {outcome.hardware_fault}")
    if outcome.stopped_fault:
        # A stop keeps its status (the job ends anyway); the host still takes the node out.
        return Ending(status, mark=f"stopped, hardware fault: {outcome.stopped_fault}")
    return Ending(status)


@dataclass(frozen=True)
class NodeEnd:
    """How a node's trainer ended, in its own words (a child sends it to the main node: node_fault.py)."""

    node: int
    code: int  # 0 succeeded, 75 node fault, 78 shared, 2 bad input, else the trainer's status
    line: str
    failure: Failure = field(default_factory=Failure)

    @classmethod
    def parse(cls, fields: dict[str, object]) -> NodeEnd:
        rank = fields.get("rank")
        failure = Failure(
            rank=rank if isinstance(rank, int) else None, when=str(fields.get("when") or ""),
            error=str(fields.get("error") or ""),
        )  # fmt: skip
        return cls(int(str(fields["node"])), int(str(fields["code"])), str(fields.get("line", "")), failure)


@dataclass(frozen=True)
class ChildView:
    """What the main node knows of one child while it waits for every child's word."""

    node: int
    ended: NodeEnd | None = None  # its own word (the listener's CHILDREN/node-<n>)
    batch: str = ""  # SUCCEEDED or FAILED once the node watch saw it end; "" otherwise
    silent_for: float | None = None  # seconds since its last "alive"; None: never heard from

    def lost(self, waited: float, after: float = LOST_SECONDS) -> bool:
        """No word, not ended in Batch, and silent for `after` seconds (counted from the wait's start for a
        child never heard from): its host is gone or its container was killed."""
        if self.ended is not None or self.batch:
            return False
        silent = waited if self.silent_for is None else self.silent_for
        return silent >= after


def _first_failure(ends: Sequence[NodeEnd]) -> NodeEnd:
    """The failure to name: one whose error is its own rather than a lost peer's echo, then the earliest by
    torchrun's clock (unknown last), then the lowest node."""
    return min(ends, key=lambda e: (e.failure.echo, e.failure.when or "~", e.node))


def decisive(
    *, first: Report | None, children: Sequence[ChildView], waited: float, lost_after: float = LOST_SECONDS
) -> Ending | None:
    """An ending no other word can change: a child's node fault, bad input, shared fault or repeated hang
    (or Batch's FAILED for a child that said nothing), or a lost child."""
    if first is not None and first.code in DECISIVE_CODES:
        return for_report(first)
    lost = [c.node for c in children if c.lost(waited, lost_after)]
    if lost:
        nodes = ", ".join(map(str, lost))
        return Ending(
            NODE_FAULT_EXIT,
            f"node {nodes}: no word for {lost_after:.0f} s and Batch does not show it ended: lost (its host "
            f"or container gone); ending this job with exit {NODE_FAULT_EXIT} so that Batch retries it on other nodes",
        )
    return None


def after_failure(
    *, first: Report | None, own: NodeEnd | None, children: Sequence[ChildView], waited: float,
    bound: float = VERDICT_SECONDS, lost_after: float = LOST_SECONDS,
) -> Ending | None:  # fmt: skip
    """The main node's ending once training failed somewhere (its own trainer, `own`, or a child's word,
    `first`: the report file's line). None: wait on (the caller asks again). A decisive report or a lost
    child ends it at once; application errors wait until every child has spoken or ended in Batch, or
    until `bound`, and then keep the first failure's own status: an application's bug is not retried."""
    settled = decisive(first=first, children=children, waited=waited, lost_after=lost_after)
    if settled is not None:
        return settled
    pending = [c.node for c in children if c.ended is None and not c.batch]
    if pending and waited < bound:
        return None
    failed = [c.ended for c in children if c.ended is not None and c.ended.code != 0]
    failed += [own] if own is not None else []
    if first is not None and all(first.line != f.line for f in failed):
        # Batch's word for a child that said nothing (killed for memory): a failure of its own.
        node = first.line.split(" ", 2)[1].rstrip(":") if first.line.startswith("node ") else ""
        failed.append(NodeEnd(int(node) if node.isdigit() else 1 << 20, first.code, first.line))
    if not failed:
        if first is not None:
            return for_report(first)
        return Ending(1, "training failed and no node said why; ending this job with exit 1 (not retried)")
    cause = _first_failure(failed)
    if all(f.failure.echo for f in failed):
        # Every rank that said why quoted a broken collective, and none an error of its own: a link or a
        # node went away under them (an EFA fault, a GPU off the bus), which a retry on fresh nodes mends.
        return Ending(
            NODE_FAULT_EXIT,
            f"{cause.line}; every failed node reports a lost peer (a broken collective) and none an error of its "
            f"own; ending this job with exit {NODE_FAULT_EXIT} so that Batch retries it on other nodes",
        )
    summary = f"{len(failed)} of {len(children) + 1} nodes failed with an application error, none with a node fault"
    if pending:
        summary += f"; no word from node {', '.join(map(str, pending))} after {bound:.0f} s"
    return Ending(
        cause.code,
        f"{cause.line}; {summary}; ending this job with exit {cause.code} (the application's error, not retried)",
    )


def child_tells_main(*, status: int, is_child: bool, training_started: bool, told: bool, stopped: bool = False) -> bool:
    """A child that exits before training (bad input, a failed fetch or restore) tells the main node
    why, once; after training starts its failure is judged after its trainer exits. A stopped child
    tells nothing: Batch stops the children when the main node has ended, or the whole job, and a child
    would spend NODE_REPORT_SECONDS trying to reach a main node that is gone."""
    return status != 0 and is_child and not training_started and not told and not stopped


def exit_status(returncode: int) -> int:
    """subprocess's code as a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
