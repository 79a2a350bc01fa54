"""What a failed trainer said about its failure, read from the last lines of its output: which rank
failed first on this node, when, and the error line to quote. Pure; stdlib only, Python 3.10.

torchrun ends a failed run with a ChildFailedError block whose "Root Cause (first observed failure)"
entry names the rank, the time and the exit code (torch/distributed/elastic/multiprocessing/errors,
_FAILURE_FORMAT_TEMPLATE), and since PyTorch 2.2 it prefixes each worker's lines with "[rankN]: ".
tests/fixtures/torchrun/ holds a real run's output. A failure that is only the echo of a lost peer
(the collective's connection broke) is told apart so that the node whose rank failed for its own
reason is named first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(?P<name>time|rank|exitcode)\s*:\s*(?P<value>.*?)\s*$")
_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?(?P<text>.*)$")
# A Python exception's last line: "ValueError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt".
_EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Warning))\b(?::.*)?$")
# An interpreter's or a shell's own complaint, which names no exception ("python3: can't open file ...").
_PLAIN_ERROR = re.compile(r"can't open file|No such file or directory|: command not found|\[Errno \d+\]")
# torchrun's own lines about the failure it reports, not the application's error.
_TORCHRUN_OWN = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",)
# Errors a rank raises when a peer went away: the collective's connection broke or timed out.
_PEER_ECHO = re.compile(
    r"Connection (closed|reset) by peer|remote process exited|Broken pipe|ECONNRESET|NCCL communicator was aborted"
    r"|ProcessGroupNCCL.*(?:Watchdog|timed out|aborted)|DistNetworkError|DistBackendError|Socket Timeout"
    r"|ncclRemoteError|ncclSystemError|Timed out waiting|store.*(?:closed|refused)",
    re.IGNORECASE,
)
MAX_ERROR = 200


@dataclass(frozen=True)
class Failure:
    """A node's failed trainer in words; every field may be unknown."""

    rank: int | None = None
    when: str = ""  # torchrun's time of the first observed failure, "YYYY-mm-dd_HH:MM:SS"
    error: str = ""  # the error line to quote

    @property
    def echo(self) -> bool:
        """The error is a lost peer's echo (a broken collective), not this rank's own."""
        return bool(self.error) and _PEER_ECHO.search(self.error) is not None

    def describe(self, status: int) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "its trainer"
        said = f": {self.error}" if self.error else ""
        return f"{who} failed{said} (exit {status})"


def _root_cause(lines: Sequence[str]) -> tuple[int | None, str]:
    start = max((i for i, line in enumerate(lines) if ROOT_CAUSE in line), default=-1)
    if start < 0:
        return None, ""
    rank: int | None = None
    when = ""
    for line in lines[start + 1 : start + 12]:
        match = _FIELD.match(line)
        if match is None:
            continue
        if match["name"] == "rank" and rank is None:
            digits = match["value"].split(" ", 1)[0]
            rank = int(digits) if digits.isdigit() else None
        elif match["name"] == "time" and not when:
            when = match["value"]
    return rank, when


def _exception(text: str) -> str | None:
    text = text.strip()
    if _EXCEPTION.match(text) is None and _PLAIN_ERROR.search(text) is None:
        return None
    if any(text.startswith(own) for own in _TORCHRUN_OWN) or text.startswith(("File ", "Traceback")):
        return None
    return text[:MAX_ERROR]


def read_failure(lines: Sequence[str]) -> Failure:
    """The failure in a failed trainer's last lines: torchrun's root cause, and the last exception line
    of that rank (its "[rankN]: " lines), else the last exception line any process printed."""
    rank, when = _root_cause(lines)
    by_rank: dict[int, str] = {}
    anywhere = ""
    for line in lines:
        prefixed = _RANK_PREFIX.match(line)
        error = _exception(prefixed["text"] if prefixed else line)
        if error is None:
            continue
        if prefixed:
            by_rank[int(prefixed["rank"])] = error
        anywhere = error
    if rank is not None:
        # torchrun named the rank: its own error line, or none (never another rank's).
        return Failure(rank=rank, when=when, error=by_rank.get(rank, "" if by_rank else anywhere))
    if by_rank:
        # No root cause (a plain python trainer under torchrun's prefixes): a rank whose error is its own.
        own = {r: e for r, e in by_rank.items() if not _PEER_ECHO.search(e)} or by_rank
        chosen = min(own)
        return Failure(rank=chosen, when=when, error=own[chosen])
    return Failure(when=when, error=anywhere)
