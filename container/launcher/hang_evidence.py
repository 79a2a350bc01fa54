"""The evidence of a hang on one node, for progress_watch.py: the training ranks under torchrun, their
Python stacks (py-spy), PyTorch's flight-recorder files, and the upload beside the job's checkpoints.

A stopped process runs no faulthandler, but py-spy reads a process's memory: its default mode suspends
the process with ptrace and fails on one that a signal stopped ("Failed to suspend process"), while
--nonblocking reads it as it is (checked with py-spy 0.4.3 on a SIGSTOPped Python 3.11 process). Where
py-spy cannot read a rank (no ptrace right: Yama's ptrace_scope, no CAP_SYS_PTRACE), its file says so.
Stdlib only, Python 3.10; boto3 for the upload (as checkpoint_sync.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from aws_region import region
from checkpoint_commit import process_tree

PY_SPY_SECONDS = 30


@dataclass(frozen=True)
class Rank:
    pid: int
    rank: int
    state: str  # /proc/<pid>/stat's: T stopped by a signal, t traced, D uninterruptible, Z exited


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _stat(pid: int) -> tuple[str, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def find_ranks(root: int) -> list[Rank]:
    """The training ranks under `root` (torchrun): processes with RANK set whose parent has none (a data
    loader's workers inherit RANK from their rank)."""
    found = []
    for pid in sorted(process_tree(root)):
        rank = _environ(pid).get("RANK", "")
        try:
            state, parent = _stat(pid)
        except OSError:
            continue
        if rank.isdigit() and "RANK" not in _environ(parent):
            found.append(Rank(pid, int(rank), state))
    return sorted(found, key=lambda r: r.rank)


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"  # pip's scripts folder, off PATH in some images
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def dump_stacks(rank: Rank, seconds: float = PY_SPY_SECONDS) -> tuple[str, bool]:
    """The rank's Python stacks from py-spy, or why there are none. py-spy's default mode suspends the
    process with ptrace and fails on one that a signal stopped ("Failed to suspend process"); --nonblocking
    reads its memory as it is, which works on a stopped process too (checked with py-spy 0.4.3)."""
    tool = _py_spy()
    if tool is None:
        return "py-spy is not installed in this image: no stacks\n", False
    modes = [["--nonblocking"]] if rank.state in ("T", "t") else [[], ["--nonblocking"]]
    errors = []
    for extra in modes:
        command = [tool, "dump", "--pid", str(rank.pid), *extra]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=seconds, check=False)
        except subprocess.TimeoutExpired:
            errors.append(f"{' '.join(command[1:])}: no answer in {seconds:.0f} s")
            continue
        if result.returncode == 0:
            return result.stdout, True
        reason = [line.strip() for line in result.stderr.splitlines() if line.strip()][:3]
        errors.append(f"{' '.join(command[1:])}: {' / '.join(reason) or f'exit {result.returncode}'}")
    # No ptrace right (Yama's ptrace_scope, no CAP_SYS_PTRACE) is the usual cause inside a container.
    return "py-spy could not read this rank's stacks: " + "; ".join(errors) + "\n", False


def collect(ranks: Sequence[Rank], directory: Path, fr_prefix: str) -> list[str]:
    """Write each rank's stacks and the flight-recorder files into `directory`; problems as notes."""
    directory.mkdir(parents=True, exist_ok=True)
    notes = []
    for rank in ranks:
        text, ok = dump_stacks(rank)
        header = f"# rank {rank.rank}, pid {rank.pid}, state {rank.state}\n"
        (directory / f"stacks-rank-{rank.rank}.txt").write_text(header + text)
        if not ok:
            notes.append(f"rank {rank.rank}: {text.strip()[:160]}")
    if not ranks:
        notes.append("no training rank found (no process with RANK under the trainer)")
    if fr_prefix:
        prefix = Path(fr_prefix)
        for trace in sorted(prefix.parent.glob(prefix.name + "*")):
            if trace.is_file():
                (directory / "flight-recorder").mkdir(exist_ok=True)
                shutil.copy2(trace, directory / "flight-recorder" / trace.name)
    return notes


def upload(uri: str, directory: Path) -> str | None:
    """Upload every file under `directory` to `uri`; None, or the failure in one line."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as error:
        return f"no boto3 in {sys.executable} ({error})"
    parsed = urlparse(uri)
    prefix = parsed.path.lstrip("/")
    try:
        config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3})
        client = boto3.client("s3", region_name=region(os.environ), config=config)
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            client.upload_file(str(path), parsed.netloc, prefix + path.relative_to(directory).as_posix())
    except Exception as error:  # any failure is said in one line; the watch goes on
        return f"{error.__class__.__name__}: {str(error)[:160]}"
    return None
