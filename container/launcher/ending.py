"""How a node's attempt ends: its exit code, the line that says why, and whether its host is asked to
take it out. Pure functions of what the other phases observed; tests/test_launcher_decisions.py holds
their table. Batch decides a multi-node job by the main node's exit code alone (Batch user guide,
"Multi-node parallel jobs"), and the job definitions retry only exit 75 (training_constructs/jobs).

  0    the trainer succeeded (and, with checkpoints, its last upload did too)
  1..  the trainer's own status: the application's, not retried (1 also when only the last upload failed)
  2    bad input: a value the launcher cannot run with, or a child's; not retried
  75   a node fault or a lost node: a failed device preflight, a trainer that died on a hardware fault,
       a child that reported one or that Batch shows FAILED, a first hang; retried on fresh nodes
  78   a fault every node of the fleet shares (the AMI, the image); not retried
  124  a hang seen again after its retry; not retried
  143  stopped (SIGTERM) before training started
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """The main node ends for a child's report: the child's code when no retry mends it, else 75."""
    if report.code in FINAL_CODES:
        return Ending(report.code, f"{report.line}; ending this job with exit {report.code} (not retried)")
    return Ending(
        NODE_FAULT_EXIT,
        f"{report.line}; ending this job with exit {NODE_FAULT_EXIT} so that Batch retries it on other nodes",
    )


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


def child_tells_main(*, status: int, is_child: bool, training_started: bool, told: bool) -> bool:
    """A child that exits before training (bad input, a failed fetch or restore) tells the main node
    why, once; after training starts its failure is judged after its trainer exits."""
    return status != 0 and is_child and not training_started and not told


def exit_status(returncode: int) -> int:
    """subprocess's code as a shell reports it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
