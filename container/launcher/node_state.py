"""What one node's launcher holds while it runs: its settings, the signals it saw, the folder where
the listener, the node watch and the hang watch leave their reports, and the helpers it started."""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ending import Report
from node_settings import Settings
from node_tools import hostname, run_helper, say
from stop_signals import StopSignals

RELAY_DRAIN_SECONDS = 5.0


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

    def node_line(self, text: str) -> str:
        return f"node {self.settings.index} ({hostname()}): {text}"

    def tell_main(self, code: int, text: str) -> None:
        """A child tells the main node, once, why it fails (retrying for NODE_REPORT_SECONDS)."""
        batch = self.settings.batch
        self.told_main = True
        if batch is None or batch.report_to is None:
            return
        run_helper(
            self.settings.python.stdlib,
            "node_fault.py",
            "report",
            "--address",
            batch.report_to,
            "--port",
            str(batch.report_port),
            "--code",
            str(code),
            "--job",
            self.settings.job_id,
            "--within",
            str(batch.report_seconds),
            "--line",
            self.node_line(text),
            to_stderr=True,
        )

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
