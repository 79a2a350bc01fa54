"""Signals, in one place. The launcher is the container's first process (the shim execs it), so the
kernel delivers it only the signals it handles; it handles three:

- SIGTERM and SIGINT: a stop. Batch stops every other node when the main node ends, and a job's cancel
  or timeout stops them all; ECS sends SIGKILL after the stop timeout (ECS_CONTAINER_STOP_TIMEOUT,
  30 s by default; the fleets' hosts set 10 minutes). Before training a stop is remembered, so that
  a node never starts training only to be killed; during training it goes to the trainer (torchrun)
  at once and the checkpoint copier starts its last upload.
- SIGUSR1: a child's report (node_fault.py listen), a child's FAILED node job (node_watch.py) or a
  hang verdict (progress_watch.py) was written for the main node: stop what runs and judge it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from types import FrameType


class StopSignals:
    """What the handlers saw, and what they do while the trainer runs."""

    def __init__(self) -> None:
        self.stop_requested = False
        self.fault_reported = False
        self.reported_at: float | None = None  # time.monotonic() of the first report
        self._trainer_pid: int | None = None
        self._stopping_file: Path | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGUSR1, self._report)

    def supervise(self, trainer_pid: int, stopping_file: Path | None) -> None:
        """From now on a stop or a report stops the trainer; one that came before it started stops it now."""
        self._trainer_pid = trainer_pid
        self._stopping_file = stopping_file
        if self.stop_requested or self.fault_reported:
            self.stop_trainer()

    def stop_trainer(self) -> None:
        """SIGTERM to torchrun, which passes it to its workers; the copier's cue to start its last upload."""
        if self._trainer_pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self._trainer_pid, signal.SIGTERM)
        mark_stopping(self._stopping_file)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True
        self.stop_trainer()

    def _report(self, signum: int, frame: FrameType | None) -> None:
        self.fault_reported = True
        if self.reported_at is None:
            self.reported_at = time.monotonic()
        self.stop_trainer()


def mark_stopping(stopping_file: Path | None) -> None:
    """The copier counts its final window from this time (a stop's, or a crash's)."""
    if stopping_file is not None and stopping_file.parent.is_dir() and not stopping_file.exists():
        stopping_file.write_text(f"{time.time():.6f}\n")
