"""What a rehearsal tells while it runs: one short line per event (nodes start, the rendezvous, each
checkpoint reaching the local S3, a fault, an attempt's end, the job's end). The engine reports what it
observes to a `Narrator`, which words it as `Event`s for a listener; `EventPrinter` is the CLI's listener.
Without a listener (the fault catalog, whose stdout is JSON) nothing is said."""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# Every line the CLI writes fits this many columns.
WIDTH = 100


def plural(count: int, noun: str, many: str = "") -> str:
    """`1 file`, `2 files`, `0 files`; `many` where adding an s is wrong (`1 entry`, `2 entries`)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def wrap(text: str, *, first: str = "", rest: str = "", width: int | None = None) -> list[str]:
    """`text` in lines of at most `width` columns (WIDTH when None, read at each call: the docs' worked example
    is rendered narrower): the first after `first`, the others after `rest`."""
    columns = width or WIDTH
    return textwrap.wrap(text, width=columns, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [
        first.rstrip()
    ]


@dataclass(frozen=True)
class Event:
    """Something that happened, `at_s` seconds after the rehearsal started."""

    at_s: float
    kind: str  # begin, logs, attempt, node, rendezvous, checkpoint, fault, stop, job
    text: str


# A `logs` event's text: this, then the folder.
LOGS_PREFIX = "node logs under "


Listener = Callable[[Event], None]


def node_ending(exit_code: int | None, started: bool, lost: bool) -> str:
    """How a node or an attempt's main node ended, in words (never Python's None)."""
    if not started:
        return "never started"
    if exit_code is None:
        return "no exit code (its host was lost)" if lost else "no exit code"
    return f"exit {exit_code}"


def node_list(indexes: list[int]) -> str:
    return ("node " if len(indexes) == 1 else "nodes ") + ", ".join(str(i) for i in indexes)


class Narrator:
    """Turns the engine's observations into events; keeps what was already said (a checkpoint is told once)."""

    def __init__(self, listener: Listener | None = None) -> None:
        self.listener = listener
        self.started = 0.0  # the engine sets it: the rehearsal's start (monotonic), as the report's times
        self._told_checkpoints: set[str] = set()

    def _tell(self, now: float | None, kind: str, text: str) -> None:
        if self.listener is not None:
            at = 0.0 if now is None else max(0.0, round(now - self.started, 1))
            self.listener(Event(at, kind, text))

    def begin(self, definition: str, fleet: str, nodes: int, attempts: int, logs: str) -> None:
        self._tell(None, "begin", f"rehearsing {definition} (fleet {fleet}): {plural(nodes, 'node')}, "
                   f"up to {plural(attempts, 'attempt')}")  # fmt: skip
        if logs:
            self._tell(None, "logs", LOGS_PREFIX + logs)

    def attempt_started(self, now: float, job_id: str, number: int, allowed: int) -> None:
        self._tell(now, "attempt", f"attempt {number} of up to {allowed} starts: job {job_id}")

    def node_started(self, now: float, index: int, main: bool, host: str) -> None:
        self._tell(now, "node", f"node {index}{' (main)' if main else ''} started on {host}")

    def node_never_started(self, now: float, index: int, reason: str) -> None:
        self._tell(now, "node", f"node {index} never started: {reason}")

    def node_ended(self, now: float, index: int, exit_code: int | None, lost: bool) -> None:
        self._tell(now, "node", f"node {index} ended: {node_ending(exit_code, True, lost)}")

    def rendezvous(self, now: float, nodes: int) -> None:
        self._tell(now, "rendezvous", f"rendezvous complete: training processes run on {plural(nodes, 'node')}")

    def checkpoints(self, now: float, names: Iterable[str]) -> None:
        """Checkpoint files seen complete in the local S3; those told before are not told again."""
        new = [name for name in names if name not in self._told_checkpoints]
        if not new:
            return
        self._told_checkpoints.update(new)
        if len(new) == 1:
            self._tell(now, "checkpoint", f"{new[0]} is in the local S3")
        else:
            shown = ", ".join(new) if len(new) <= 3 else f"{new[0]} ... {new[-1]}"
            self._tell(now, "checkpoint", f"{plural(len(new), 'checkpoint file')} in the local S3: {shown}")

    def fault(self, now: float, text: str) -> None:
        self._tell(now, "fault", text)

    def stopping(self, now: float, signal: str, indexes: list[int], why: str) -> None:
        if indexes:
            self._tell(now, "stop", f"{signal} to {node_list(indexes)}: {why}")

    def host(self, now: float, text: str) -> None:
        self._tell(now, "fault", text)

    def attempt_ended(
        self, now: float, number: int, exit_code: int | None, started: bool, lost: bool, retry: str
    ) -> None:
        ending = node_ending(exit_code, started, lost)
        self._tell(now, "attempt", f"attempt {number} ended: main node {ending}; {retry or 'the job ends'}")

    def job_note(self, now: float, text: str) -> None:
        self._tell(now, "job", text)

    def job_ended(self, now: float, job_id: str, status: str, reason: str, attempts: int) -> None:
        why = f" ({reason})" if reason else ""
        self._tell(now, "job", f"job {job_id} {status} after {plural(attempts, 'attempt')}{why}")


class EventPrinter:
    """The CLI's listener: each event as `  12.3 s  text`, wrapped within WIDTH columns under its text.
    Faults may be told from the local S3's threads: a line is written whole."""

    def __init__(self, write: Callable[[str], None], width: int = WIDTH) -> None:
        self.write = write
        self.width = width
        self.logs = ""  # the folder of the node logs, once told
        self._lock = threading.Lock()

    def lines(self, event: Event) -> list[str]:
        stamp = f"{event.at_s:>7.1f} s  "
        return wrap(event.text, first=stamp, rest=" " * len(stamp), width=self.width)

    def __call__(self, event: Event) -> None:
        if event.kind == "logs":
            self.logs = event.text.removeprefix(LOGS_PREFIX)
        with self._lock:
            for line in self.lines(event):
                self.write(line)
