"""The evidence of a hang on one node, for progress_watch.py: the training ranks under torchrun, their
Python stacks (py-spy), PyTorch's flight-recorder files, NCCL's RAS view of the job (ncclras, where the image
has it), and the upload beside the job's checkpoints.

A stopped process runs no faulthandler, but py-spy reads a process's memory: its default mode suspends
the process with ptrace and fails on one that a signal stopped ("Failed to suspend process"), while
--nonblocking reads it as it is (checked with py-spy 0.4.3 on a SIGSTOPped Python 3.11 process). Where
py-spy cannot read a rank (no ptrace right: Yama's ptrace_scope, no CAP_SYS_PTRACE), its file says so.
The innermost frame of a rank's main thread tells one waiting on its peers (in a collective, a barrier, a
wait for the device) from one that is elsewhere (innermost, in_collective): the main node names the latter
when the others wait (hang_verdict.first_stopped). Each dump looks the same while a rank stays where it is
(fingerprint), so a hung node uploads again only when something changed.
Stdlib only, Python 3.10; boto3 for the upload (as checkpoint_sync.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from aws_region import region
from progress_signals import environ, rank_pids, read_processes

PY_SPY_SECONDS = 30
# A py-spy frame line: "function (file:line)".
FRAME = re.compile(r"(?P<function>.+) \((?P<file>[^()]+):\d+\)")
# py-spy's thread line: "Thread 123 (idle): "MainThread"", also (active), (active+gil).
THREAD_MARK = re.compile(r"^(Thread \S+) \([a-z+]+\)", re.MULTILINE)
RUNNING = re.compile(r"state [RS]$", re.MULTILINE)
# Where a rank waits on its peers: torch.distributed's collectives and barriers (c10d, DDP's reducer, FSDP),
# autograd (DDP's all-reduce is waited for at the end of backward), a wait for the device (torch.cuda,
# torch_xla), and the communication layers of DeepSpeed and Horovod.
COLLECTIVE_PATHS = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/", "torch/cuda/", "torch_xla/",
                    "deepspeed/comm/", "horovod/")  # fmt: skip
COLLECTIVE_FUNCTIONS = frozenset((
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "barrier",
    "monitored_barrier", "reduce", "gather", "scatter", "send", "recv", "wait", "synchronize", "mark_step",
))  # fmt: skip


@dataclass(frozen=True)
class Rank:
    pid: int
    rank: int
    state: str  # /proc/<pid>/stat's: T stopped by a signal, t traced, D uninterruptible, Z exited


def find_ranks(root: int) -> list[Rank]:
    """The training ranks under `root` (torchrun), with their RANK and process state."""
    processes = read_processes()
    known: dict[int, str | None] = {}

    def rank_of(pid: int) -> str | None:
        if pid not in known:
            known[pid] = environ(pid).get("RANK")
        return known[pid]

    found = [
        Rank(pid, int(rank), processes[pid].state)
        for pid in rank_pids(processes, root, rank_of)
        if (rank := rank_of(pid) or "").isdigit()
    ]
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


def collect(ranks: Sequence[Rank], directory: Path, fr_prefix: str) -> tuple[list[str], dict[int, str]]:
    """Write each rank's stacks and the flight-recorder files into `directory`: problems as notes, and the
    stacks py-spy could read, by rank."""
    directory.mkdir(parents=True, exist_ok=True)
    notes, stacks = [], {}
    for rank in ranks:
        text, ok = dump_stacks(rank)
        header = f"# rank {rank.rank}, pid {rank.pid}, state {rank.state}\n"
        (directory / f"stacks-rank-{rank.rank}.txt").write_text(header + text)
        if ok:
            stacks[rank.rank] = text
        else:
            notes.append(f"rank {rank.rank}: {text.strip()[:160]}")
    if not ranks:
        notes.append("no training rank found (no process with RANK under the trainer)")
    if fr_prefix:
        prefix = Path(fr_prefix)
        for trace in sorted(prefix.parent.glob(prefix.name + "*")):
            if trace.is_file():
                (directory / "flight-recorder").mkdir(exist_ok=True)
                shutil.copy2(trace, directory / "flight-recorder" / trace.name)
    return notes, stacks


def innermost(stacks: str) -> str | None:
    """The innermost frame py-spy shows for the main thread ("function (file:line)"), else for the first."""
    lines = stacks.splitlines()
    threads = [i for i, line in enumerate(lines) if line.startswith("Thread ")]
    if not threads:
        return None
    main = next((i for i in threads if '"MainThread"' in lines[i]), threads[0])
    frame = lines[main + 1].strip() if main + 1 < len(lines) else ""
    return frame if FRAME.fullmatch(frame) else None


def in_collective(frame: str) -> bool:
    """Whether a frame waits on the peers: a collective, a barrier, or a wait for the device."""
    found = FRAME.fullmatch(frame)
    if found is None:
        return False
    function, file = found["function"].rsplit(".", 1)[-1], found["file"].replace("\\", "/")
    return function in COLLECTIVE_FUNCTIONS or any(part in file for part in COLLECTIVE_PATHS)


def fingerprint(directory: Path) -> str:
    """What the evidence says, without what changes from one dump to the next of a process that stays where
    it is: py-spy's idle/active mark of each thread, and running or sleeping (a spinning wait is either)."""
    parts = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        if path.name.startswith("stacks-rank-"):
            parts.append(RUNNING.sub("state R/S", THREAD_MARK.sub(r"\1", path.read_text())))
        elif path.name == RAS_FILE:
            parts.append(ras_line(path.read_text()))  # its timestamp changes on every query
        else:
            parts.append(f"{path.relative_to(directory)} {path.stat().st_size}")
    return "\n".join(parts)


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


# NCCL's RAS service (NCCL >= 2.24, on by default) answers its client, ncclras, on localhost:28028 or where
# NCCL_RAS_ADDR (host:port) puts it; `-f json` (NCCL >= 2.28.7) prints every communicator's ranks with their
# count of each collective launched, and the ranks RAS could not reach (NCCL's documentation, "RAS", JSON
# Output; src/ras/client_support.cc). The view is job-wide: any node's client gathers every process's.
RAS_FILE = "ncclras.json"
RAS_SECONDS = 5.0
# ncclras waits up to -t for the job's processes, plus a margin of its own: it gets a little more than that.
RAS_MARGIN_SECONDS = 3.0
RAS_MAX_LINE = 200


def ras_command(tool: str, environ: Mapping[str, str], seconds: float) -> list[str]:
    """ncclras asking for JSON, at NCCL_RAS_ADDR's host and port when the job set them (-t 0 would wait forever)."""
    command = [tool, "-f", "json", "-t", str(max(1, round(seconds)))]
    address = environ.get("NCCL_RAS_ADDR", "").strip()
    if address:
        host, _, port = address.rpartition(":")
        if host:
            command += ["-h", host.strip("[]")]
        if port.isdigit():
            command += ["-p", port]
    return command


def ras_view(directory: Path, environ: Mapping[str, str], seconds: float = RAS_SECONDS) -> str:
    """Save ncclras's JSON view beside the stacks; the line for the hang verdict: the ranks RAS reports behind,
    or why there is no view ("" off NVIDIA nodes, where there is no NCCL to ask)."""
    if environ.get("NCCL_RAS_ENABLE", "").strip() == "0":
        return "RAS is off (NCCL_RAS_ENABLE=0): no RAS view"
    tool = shutil.which("ncclras", path=environ.get("PATH"))
    if tool is None:
        return "no ncclras in this image: no RAS view" if shutil.which("nvidia-smi", path=environ.get("PATH")) else ""
    command = ras_command(tool, environ, seconds)
    limit = seconds + RAS_MARGIN_SECONDS
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return f"RAS: ncclras gave no answer in {limit:.0f} s"
    except OSError as error:
        return f"RAS: ncclras could not run ({error.strerror or error})"
    if result.returncode != 0 or not result.stdout.strip():
        reason = next((line.strip() for line in result.stderr.splitlines() if line.strip()), "")
        return f"RAS: ncclras failed (exit {result.returncode}{': ' + reason[:80] if reason else ''})"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RAS_FILE).write_text(result.stdout)
    return ras_line(result.stdout)


def ras_line(text: str) -> str:
    """The ranks behind in each communicator's collectives and the ranks RAS could not reach, in one line."""
    found = ras_behind(text)
    if found is None:
        return f"RAS view saved ({RAS_FILE}), not parsed: its shape is not NCCL's documented one"
    if not found:
        return f"RAS ({RAS_FILE}): no rank behind in any collective, none missing"
    return f"RAS ({RAS_FILE}): " + "; ".join(found)[:RAS_MAX_LINE]


def _ranks(numbers: Sequence[int]) -> str:
    return f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, sorted(numbers)))}"


def ras_behind(text: str) -> list[str] | None:
    """From ncclras's JSON: per communicator, the ranks whose count of a collective is below the most any rank
    launched, and the missing ranks; None when the document does not have the shape NCCL documents."""
    try:
        document = json.loads(text)
        found = []
        for comm in document["communicators"]:
            name = str(comm.get("hash", "?"))
            ranks = {int(rank["rank"]): rank["collective_counts"] for rank in comm["ranks"]}
            operations = sorted({op for counts in ranks.values() for op in counts})
            for op in operations:
                counts = {rank: int(counts.get(op, 0)) for rank, counts in ranks.items()}
                most = max(counts.values())
                behind = [rank for rank, count in counts.items() if count < most]
                if behind:
                    least = min(counts[rank] for rank in behind)
                    found.append(f"{_ranks(behind)} behind in {op} ({least} of {most}, comm {name})")
            missing = list(comm.get("missing_ranks", []))
            dead = [int(m["rank"]) for m in missing if m.get("status", {}).get("considered_dead")]
            quiet = [int(m["rank"]) for m in missing if int(m["rank"]) not in dead]
            if dead:
                found.append(f"{_ranks(dead)} considered dead (comm {name})")
            if quiet:
                found.append(f"{_ranks(quiet)} missing: no data from it (comm {name})")
        return found
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
