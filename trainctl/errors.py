"""Exit codes and the one kind of error trainctl reports: one line, saying what to do next."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """trainctl's exit status (docs/jobs.md, "trainctl exit status")."""

    OK = 0
    # submit --watch/--follow, run --watch/--follow, logs -f, check: the job ended FAILED.
    JOB_FAILED = 1
    # Bad input: a flag's value, a fleet that is not deployed, a job that is not ours (click's own
    # usage errors exit 2 as well).
    USAGE = 2
    # AWS could not be asked: no credentials, no region, no stacks in the region, a refused call.
    AWS = 3
    # check: the benchmark ran but its verdict is not "healthy" (or it printed none).
    UNHEALTHY = 4
    # Ctrl-C stopped the following (submit/run --follow, logs -f); the job goes on. 128 + SIGINT, as shells say.
    INTERRUPTED = 130


class TrainctlError(Exception):
    """An error shown as one line, `trainctl: <message>`, then exit with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def clip(value: object, width: int = 40) -> str:
    """A user's input as a refusal echoes it: whole when short, else its first `width` characters and an
    ellipsis, so that the line stays within 200 characters and still names the input."""
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def clip_path(value: object, width: int = 40) -> str:
    """A path as a refusal echoes it: whole when short, else an ellipsis and its last `width` characters
    (the end names the file)."""
    text = str(value)
    return text if len(text) <= width else "…" + text[-(width - 1) :]
