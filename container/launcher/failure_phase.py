"""After a trainer failed (or a child's word or a hang verdict stopped it): this node's hardware, the
children's words on the main node, a child's own word to the main node, and the verdict. The decisions
are ending.py's (decisive, after_failure); this module waits for their facts."""

from __future__ import annotations

import dataclasses
import time

import ending
from ending import Ending, NodeEnd
from failure_text import Failure, read_failure
from node_settings import NUMBER
from node_state import NodeState
from node_tools import say
from watchers import hurry_node_watch

POLL_SECONDS = 0.2


def seconds(node: NodeState, name: str, default: float) -> float:
    """A number of seconds from the environment; a value that is not one keeps the default."""
    text = node.settings.get(name, "")
    return float(text) if NUMBER.fullmatch(text) else float(default)


def await_children(node: NodeState, own: NodeEnd | None, *, decisive_for: float | None = None) -> Ending | None:
    """Training failed: wait until every child has said how it ended, has ended in Batch, or is lost, and
    judge the ending from what they said (ending.after_failure). With `decisive_for`, only an ending no
    other word can change, for at most that many seconds (None when none came)."""
    bound = seconds(node, "NODE_VERDICT_SECONDS", ending.VERDICT_SECONDS)
    # Never within one "alive" period: a live child would be judged lost between two of its keepalives.
    lost_after = max(seconds(node, "NODE_LOST_SECONDS", ending.LOST_SECONDS), ending.ALIVE_SECONDS + 1)
    start = time.monotonic()
    while True:
        waited = time.monotonic() - start
        first, views = node.reported(), node.children_views()
        if decisive_for is not None:
            decided = ending.decisive(first=first, children=views, waited=waited, lost_after=lost_after)
            if decided is not None or waited >= decisive_for:
                return decided
        else:
            decided = ending.after_failure(
                first=first, own=own, children=views, waited=waited, bound=bound, lost_after=lost_after
            )
            if decided is not None:
                return decided
        time.sleep(POLL_SECONDS)


def own_ending(node: NodeState, status: int, hardware_fault: str) -> tuple[int, str, Failure]:
    """This node's ending in its own words: a hardware fault (75), or its trainer's failure as it printed it."""
    if hardware_fault:
        return ending.NODE_FAULT_EXIT, f"hardware fault: {hardware_fault}; {ending.TAKEN_OUT}", Failure()
    failure = read_failure(node.trainer_tail())
    return status, failure.describe(status), failure


def judge_failure(node: NodeState, status: int, *, reported: bool, failed_at: float) -> tuple[Ending | None, str]:
    """(the main node's verdict, or None to judge by after_training; this node's hardware fault, or "")."""
    settings = node.settings
    verdict: Ending | None = None
    hardware_fault = ""
    order = node.straggler_order() if reported else ""
    if order:
        # Named the straggler to replace: this node's own ending, whatever the others then say.
        line = node.node_line(order)
        if not settings.is_main:
            node.tell_main(ending.NODE_FAULT_EXIT, f"{order}; {ending.TAKEN_OUT}")
        return ending.for_straggler(line), ""
    hurry_node_watch(node)
    # XID_SETTLE_SECONDS (default 5): how long the host's Xid watcher may take to record a crash's Xid.
    settle = seconds(node, "XID_SETTLE_SECONDS", 5.0)
    listening = settings.is_main and node.listener is not None
    if listening:
        # A child's node fault, or Batch's FAILED for a silent one, usually follows at once and decides
        # without this node's hardware check, as a report always has.
        check = ending.should_check_hardware(status=status, stopped=False, reported=reported)
        verdict = await_children(node, None, decisive_for=settle if check else 0.0)
    waited = time.monotonic() - failed_at
    if verdict is None and reported:
        # A child's word stopped this trainer; this node's own Xid record still decides its take-out and a
        # retry (the record only: a device probe can hang on a GPU off the bus).
        hardware_fault = node.judge("--settle", "0", "--xid-only")
        if hardware_fault:
            say(node.node_line(f"hardware fault recorded: {hardware_fault}; {ending.TAKEN_OUT}"))
            line = node.node_line(f"hardware fault: {hardware_fault}")
            xid_ending = ending.for_report(ending.Report(ending.NODE_FAULT_EXIT, line))
            verdict = dataclasses.replace(xid_ending, mark=f"hardware fault: {hardware_fault}")
    elif verdict is None and ending.should_check_hardware(status=status, stopped=False, reported=reported):
        hardware_fault = node.judge("--settle", f"{max(0.0, settle - waited):.1f}")
        if hardware_fault:
            say(
                node.node_line(
                    f"trainer exited {status} on a hardware fault: {hardware_fault}; {ending.TAKEN_OUT}; exiting"
                    f" {ending.NODE_FAULT_EXIT} so that Batch retries on other nodes"
                )
            )
    if not settings.is_main and status != 0:
        node.tell_main(*own_ending(node, status, hardware_fault))
    elif listening and verdict is None and not hardware_fault:
        own = None
        if status != 0 and not reported:
            code, said, failure = own_ending(node, status, "")
            own = NodeEnd(settings.index, code, node.node_line(said), failure)
        verdict = await_children(node, own)
    return verdict, hardware_fault
