"""A node's container as processes on this machine. Its processes are the ones that carry its token in
their environment (CONTAINER_VARIABLE, inherited by every process it starts: torchrun puts its workers in
sessions of their own, so a process group would not hold them). The first process is the container's
command. Stopping follows `docker stop` (ECS StopTask): the stop signal to the first process only, then
SIGKILL to every process after the grace; and when the first process exits, whatever is left of the
container is killed with it, as a container's processes are."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from trainctl.rehearsal.hosts import Host

CONTAINER_VARIABLE = "REHEARSAL_CONTAINER"


def _environs() -> Iterator[tuple[int, bytes]]:
    """Every process's pid and environment, each variable between NUL bytes (readable ones only)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), b"\0" + (entry / "environ").read_bytes() + b"\0"
            except OSError:
                continue


def container_processes(token: str, *, ranks_only: bool = False) -> list[int]:
    """The processes of the container `token`; with ranks_only, its training ranks (torchrun gives each
    worker LOCAL_RANK)."""
    mark = f"\0{CONTAINER_VARIABLE}={token}\0".encode()
    return sorted(pid for pid, env in _environs() if mark in env and (not ranks_only or b"\0LOCAL_RANK=" in env))


def containers_with_ranks(tokens: set[str]) -> set[str]:
    """Which of the containers `tokens` run a training rank, in one pass over /proc (the engine asks this
    every poll until the rendezvous is complete)."""
    marks = {token: f"\0{CONTAINER_VARIABLE}={token}\0".encode() for token in tokens}
    found: set[str] = set()
    for _pid, environ in _environs():
        if len(found) == len(marks):
            break
        if b"\0LOCAL_RANK=" in environ:
            found.update(token for token, mark in marks.items() if mark in environ)
    return found


@dataclass
class NodeRun:
    """One node in one attempt: its host, its process and how it ended (a node job `<id>#<index>`)."""

    index: int
    host: Host
    folder: Path
    log_path: Path
    is_main: bool
    process: subprocess.Popen[bytes] | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str = ""  # the container's reason (CannotPullContainerError: ...)
    status_reason: str = ""
    stop_sent: float | None = None
    lost: str = ""  # the host's reason, once its instance is gone
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    _log: IO[bytes] | None = None

    @property
    def stall_file(self) -> Path:
        """The reference script's stall hook for this node (runtime.STALL_VARIABLE): new in every attempt."""
        return self.folder / "rehearsal-stall"

    @property
    def running(self) -> bool:
        return self.process is not None and self.ended is None

    def start(self, command: list[str], env: dict[str, str], now: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(  # noqa: S603 - the job's own command, as its container would run it
            command,
            cwd=self.folder,
            env={**env, CONTAINER_VARIABLE: self.token},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started = now

    def poll(self, now: float, exited_reason: str) -> bool:
        """True when the node's first process has just exited (its leftovers are killed with it)."""
        if self.process is None or self.ended is not None:
            return False
        code = self.process.poll()
        if code is None:
            return False
        if self.lost:
            self._end(now, None, self.lost)
        else:
            self._end(now, 128 - code if code < 0 else code, exited_reason)
        return True

    def _end(self, now: float, exit_code: int | None, status_reason: str) -> None:
        self.kill_group()
        self.exit_code = exit_code
        # A reason Batch gave first (a timeout) stays.
        self.status_reason = self.status_reason or status_reason
        # Last: DescribeJobs (the local S3's thread) reads `ended` first, and then the code and reason.
        self.ended = now
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Every process of the container, until none is left (a process may fork while we look)."""
        if self.process is None:
            return
        for _ in range(20):
            pids = container_processes(self.token)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            if sig != signal.SIGKILL:
                return
            time.sleep(0.05)

    def stop(self, now: float) -> None:
        """docker stop: SIGTERM to the first process; `overdue` says when SIGKILL is due."""
        if self.running and self.stop_sent is None and self.process is not None:
            self.stop_sent = now
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def overdue(self, now: float, grace: float) -> bool:
        return self.running and self.stop_sent is not None and now - self.stop_sent >= grace

    def power_off(self, reason: str) -> None:
        """The host is gone: every process dies at once, and the node ends with no exit code and the host's
        reason when `poll` next sees it (a fault may call this from the local S3's thread)."""
        if self.process is not None and self.ended is None:
            self.lost = reason
            self.kill_group()

    def never_started(self, now: float, reason: str, status_reason: str) -> None:
        self.reason = reason
        self.status_reason = status_reason
        self.ended = now

    def ranks(self) -> list[int]:
        """The container's training ranks."""
        return container_processes(self.token, ranks_only=True) if self.process is not None else []

    def last_lines(self, count: int = 400) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-count:]


def wait_gone(runs: list[NodeRun], seconds: float = 5.0) -> None:
    """Reap what is left after a rehearsal is cut short (Ctrl-C, an error): nothing is left running."""
    for run in runs:
        run.kill_group()
    deadline = time.monotonic() + seconds
    for run in runs:
        if run.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.process.wait(timeout=max(0.1, deadline - time.monotonic()))
