"""What one node's launcher holds while it runs: its settings, the signals it saw, the folder where
the listener, the node watch and the hang watch leave their reports, and the helpers it started."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ending import ChildView, NodeEnd, Report
from failure_text import Failure
from node_settings import Settings
from node_tools import hostname, run_helper, run_helper_until, say
from stop_signals import StopSignals

RELAY_DRAIN_SECONDS = 5.0
# How long a child whose trainer succeeded tries to tell the main node (its hang watch stops counting it).
SUCCESS_REPORT_SECONDS = 5
# How much longer a child's word gets once this node is stopped. A stop comes when the main node has ended
# (Batch stops the others) or the whole job is cancelled or timed out: no word can change that ending, and
# time spent on it is time taken from the stop's last checkpoint upload. One connection attempt (5 s).
STOPPED_REPORT_SECONDS = 5.0
# After the trainer exits, how long its output relays get to write the stream's last bytes.
RELAY_TAIL_SECONDS = 2.0


class EndNode(Exception):
    """Ends the launcher with `code` (its line already said), from whichever phase decided it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass
class NodeState:
    settings: Settings
    signals: StopSignals
    started: float  # the launcher's start (__main__, before any import)
    faults: Path | None = None  # the main node's report files (node_fault.py listen writes them)
    listener: subprocess.Popen[bytes] | None = None
    watcher: subprocess.Popen[bytes] | None = None
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)  # every process it started but the trainer
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)  # the trainer's output relays
    last_error: str = ""
    told_main: bool = False
    training_started: bool = False

    @property
    def since(self) -> str:
        """The launcher's start, whole seconds (node_fault.py judge --since)."""
        return str(int(self.started))

    def reported(self) -> Report | None:
        if self.faults is None:
            return None
        report = self.faults / "report"
        try:
            return Report.parse(report.read_text(errors="replace"))
        except OSError:
            return None

    def straggler_order(self) -> str:
        """Why the straggler watch told this node to end as the straggler to replace, or "" (straggler_watch.py:
        node_fault.py beat writes a child's, the main node's watch its own)."""
        if self.faults is None:
            return ""
        try:
            return (self.faults / "straggler").read_text(errors="replace").strip()[:300]
        except OSError:
            return ""

    def node_line(self, text: str) -> str:
        return f"node {self.settings.index} ({hostname()}): {text}"

    def folder(self) -> Path:
        """This launcher's scratch folder: the report files on the main node, the trainer's output tails."""
        if self.faults is None:
            self.faults = Path(tempfile.mkdtemp())
        return self.faults

    def tell_main(self, code: int, text: str, failure: Failure | None = None, *, wait: bool = True) -> None:
        """A child tells the main node, once, how it ended (retrying for NODE_REPORT_SECONDS); without
        `wait`, trying for SUCCESS_REPORT_SECONDS only (a success: the main node may be gone already). A stop
        cuts it to STOPPED_REPORT_SECONDS from the stop."""
        batch = self.settings.batch
        self.told_main = True
        if batch is None or batch.report_to is None:
            return
        said = failure or Failure()
        args = ["--address", batch.report_to, "--port", str(batch.report_port), "--job", self.settings.job_id]
        args += ["--node", str(batch.index), "--code", str(code), "--line", self.node_line(text)]
        args += ["--when", said.when, "--error", said.error]
        args += ["--rank", str(said.rank)] if said.rank is not None else []
        within = batch.report_seconds if wait else SUCCESS_REPORT_SECONDS
        run_helper_until(
            self.settings.python.stdlib,
            "node_fault.py",
            "report",
            *args,
            "--within",
            str(within),
            stop=lambda: self.signals.stop_requested,
            grace=STOPPED_REPORT_SECONDS,
        )

    def trainer_tail(self) -> list[str]:
        """The last lines the trainer wrote (stdout's, then stderr's), once its relays have written them."""
        deadline = time.monotonic() + RELAY_TAIL_SECONDS
        for relay in self.relays:
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.wait(max(0.0, deadline - time.monotonic()))
        lines: list[str] = []
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                lines += (self.folder() / f"tail-{fd}").read_text(errors="replace").splitlines()
        return lines

    def children_views(self) -> list[ChildView]:
        """What the listener and the node watch have of each child (node_fault.py, node_watch.py)."""
        batch = self.settings.batch
        if batch is None or self.faults is None:
            return []
        folder = self.faults / "children"
        now = time.time()
        views = []
        for node in (n for n in range(batch.nodes) if n != batch.main):
            ended: NodeEnd | None = None
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                ended = NodeEnd.parse(json.loads((folder / f"node-{node}").read_text()))
            status = ""
            with contextlib.suppress(OSError):
                status = (folder / f"node-{node}.batch").read_text().strip()
            silent: float | None = None
            with contextlib.suppress(OSError):
                silent = max(0.0, now - (folder / f"node-{node}.alive").stat().st_mtime)
            views.append(ChildView(node, ended, status, silent))
        return views

    def mark(self, line: str) -> None:
        """The take-out marker: the host stops taking tasks and powers off once it exists."""
        run_helper(self.settings.python.stdlib, "node_fault.py", "mark", "--line", line)

    def judge(self, *args: str) -> str:
        """node_fault.py judge: the hardware fault this node's host recorded, or ''."""
        result = run_helper(
            self.settings.python.stdlib, "node_fault.py", "judge", "--since", self.since, *args, capture=True
        )
        return result.stdout.strip() if result.returncode == 0 else ""

    def judge_stopped(self) -> str:
        """A stopped node (Batch stops every other node when the main node ends) judges itself by the
        host's Xid record alone, at once: a GPU needing a reset must not take the next job."""
        fault = self.judge("--settle", "0", "--xid-only")
        if fault:
            say(
                self.node_line(
                    f"stopped with a hardware fault recorded: {fault}; asking the host to take this node out"
                )
            )
        return fault

    def spawn(self, command: list[str], **options: Any) -> subprocess.Popen[bytes] | None:
        """A helper process, ended with this launcher as the container's end would end it; one that cannot
        start is said in one line and the node goes on without it, as a shell's background job would."""
        try:
            process: subprocess.Popen[bytes] = subprocess.Popen(command, stdin=subprocess.DEVNULL, **options)
        except OSError as error:
            name = Path(command[1]).name if len(command) > 1 else command[0]
            say(f"cannot run {name} with {command[0]}: {error.strerror or error}")
            return None
        self.helpers.append(process)
        return process

    def stop_helpers(self) -> None:
        """When the launcher (the container's first process) exits, the container ends and every process
        in it with it; here too, so that no helper outlives it (a child's hang watch would otherwise keep
        retrying its report to a main node that is gone, for NODE_REPORT_SECONDS). The trainer's output
        relays first get RELAY_DRAIN_SECONDS to pass on its last lines."""
        deadline = time.monotonic() + RELAY_DRAIN_SECONDS
        for relay in self.relays:
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.wait(max(0.0, deadline - time.monotonic()))
        for process in [*self.relays, *self.helpers]:
            if process.poll() is None:
                process.kill()
