"""What counts as a node's progress, for the hang watch (progress_watch.py). A node makes progress while any
of these moves, and hangs only once none has moved for its limit:

- heartbeat: TRAINING_HEARTBEAT_FILE's mtime. The training script touches it once per step on every rank:
  the one signal that says "a step finished". Only a job that touches it can end with the final hang code
  (hang_verdict.hang_exit): without it, silence is never proof enough to stop retrying.
- output: the trainer's output, stamped by the relay (progress_watch.py relay, an mtime). Anything printed.
- checkpoint files: CHECKPOINT_DIR's files changed (their count, total size or newest mtime; a bounded
  scan of SCAN_LIMIT entries). A save writes there whatever process or filesystem does it: a tmpfs, a FUSE
  mount or a network filesystem whose writes /proc/<pid>/io may not count.
- disk I/O: read_bytes + write_bytes in /proc/<pid>/io of the ranks and every process under them. The
  kernel counts there what a process "caused to be sent to the storage layer ... at page-dirtying time"
  and what it "really did cause to be fetched from the storage layer", at submit_bio() (Documentation/
  filesystems/proc.rst, "3.3 /proc/<pid>/io"), unlike rchar/wchar, which count every read() and write()
  including sockets, pipes and ttys. So a save anywhere on disk or a data loader reading a dataset moves it,
  and NCCL's or gloo's socket traffic and the shared memory NCCL uses between local ranks (tmpfs) do not:
  ranks waiting in a collective show none. Reads served from the page cache count nothing.
- helpers' CPU: CPU time of the processes the ranks started (their live descendants, plus the children
  each rank or descendant waited for: /proc/<pid>/stat's cutime and cstime), never the ranks' own. A
  compiler (neuronx-cc, torch.compile's compile workers), data-loader workers, a save through a subprocess
  all burn CPU there; a rank's own CPU cannot tell a stall from work, because a rank waiting in an NCCL
  collective spins a core (CUDA's default cudaDeviceScheduleAuto "actively spin[s]" while waiting when the
  process has fewer contexts than the host has cores: CUDA runtime API, cudaSetDeviceFlags) and NCCL's
  proxy thread polls the network. Nor does the accelerator's utilisation count: NCCL's kernels keep a GPU
  at 100 % while they wait for a peer (cupy/cupy#3557).

The two counters move only past a threshold within a window (Meter): CPU_STEP_SECONDS of helpers' CPU or
STORAGE_STEP_BYTES of disk I/O within WINDOW_SECONDS, so bookkeeping (an idle worker's few ms, a logger's
or a metrics agent's few KB) never adds up to progress. A node is judged only once its trainer has shown
output or a heartbeat: the other signals extend progress, they do not start the watch. The limit is
HANG_SECONDS, never below twice the longest silence that ended in progress (from the first heartbeat on):
a job that once sat silent for 8 minutes and went on is not called hung at 5. Each poll reads /proc once
(every process's stat; io and, once per process, environ under the trainer only).
Stdlib only, Python 3.10.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
# proc(5): /proc/<pid>/stat's times are in clock ticks, sysconf(_SC_CLK_TCK).
TICKS = os.sysconf("SC_CLK_TCK")
CPU_STEP_SECONDS = 1.0
STORAGE_STEP_BYTES = 1 << 20
WINDOW_SECONDS = 20.0
SCAN_LIMIT = 10_000
HUNG, PROGRESSING = "hung", "progressing"
HEARTBEAT, OUTPUT, CHECKPOINTS, DISK, HELPERS = "heartbeat", "output", "checkpoint files", "disk I/O", "helpers' CPU"


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    state: str
    start: int  # ticks after boot: with the pid, names one process for good
    cpu: int  # utime + stime, ticks
    waited: int  # cutime + cstime: the children it waited for, ticks


def parse_stat(pid: int, text: str) -> Process:
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses. After it, index 0 is field 3 (state)
    # of proc(5); utime, stime, cutime, cstime are fields 14-17 and starttime is 22.
    fields = text.rsplit(")", 1)[1].split()
    return Process(
        pid,
        int(fields[1]),
        fields[0],
        int(fields[19]),
        int(fields[11]) + int(fields[12]),
        int(fields[13]) + int(fields[14]),
    )


def read_processes(proc: Path = PROC) -> dict[int, Process]:
    """Every process in this PID namespace, from one walk of /proc."""
    found: dict[int, Process] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            found[int(entry.name)] = parse_stat(int(entry.name), Path(entry.path, "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
    return found


def tree(processes: Mapping[int, Process], roots: Iterable[int]) -> set[int]:
    """The roots that are alive and all their descendants."""
    children: dict[int, list[int]] = {}
    for process in processes.values():
        children.setdefault(process.ppid, []).append(process.pid)
    found: set[int] = set()
    pending = [root for root in roots if root in processes]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(children.get(pid, []))
    return found


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def rank_pids(processes: Mapping[int, Process], root: int, rank_of: Callable[[int], str | None]) -> list[int]:
    """The training ranks under `root` (torchrun): processes with RANK set whose parent has none (a data
    loader's workers inherit RANK from their rank). `rank_of` gives a pid's RANK, or None."""
    found = []
    for pid in tree(processes, [root]):
        parent = processes[pid].ppid
        if rank_of(pid) is not None and (parent not in processes or rank_of(parent) is None):
            found.append(pid)
    return sorted(found)


def helpers_cpu_seconds(processes: Mapping[int, Process], ranks: Iterable[int]) -> float:
    """CPU time of what the ranks started: their live descendants (with the children those waited for) and
    the children the ranks waited for; never the ranks' own."""
    ranks = set(ranks)
    ticks = sum(processes[pid].waited for pid in ranks if pid in processes)
    for pid in tree(processes, ranks) - ranks:
        ticks += processes[pid].cpu + processes[pid].waited
    return ticks / TICKS


def parse_io(text: str) -> int:
    """read_bytes + write_bytes of a /proc/<pid>/io."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return sum(int(fields.get(name, "0")) for name in ("read_bytes", "write_bytes"))


def disk_bytes(pids: Iterable[int], proc: Path = PROC) -> int:
    total = 0
    for pid in pids:
        try:
            total += parse_io((proc / str(pid) / "io").read_text())
        except (OSError, ValueError):  # gone, or no ptrace right over it
            continue
    return total


def scan(directory: Path, limit: int = SCAN_LIMIT) -> tuple[int, int, int]:
    """(files, bytes, newest mtime in ns) under `directory`, from at most `limit` entries."""
    files = size = newest = seen = 0
    pending = [str(directory)]
    while pending and seen < limit:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries[: limit - seen]:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    stat = entry.stat(follow_symlinks=False)
                    files, size, newest = files + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
            except OSError:
                continue
    return files, size, newest


@dataclass
class Meter:
    """A counter that moves when it grew by `step` within `window` seconds: a slow trickle never does."""

    step: float
    window: float = WINDOW_SECONDS
    base: float | None = None
    since: float = 0.0

    def moved(self, value: float, now: float) -> bool:
        if self.base is not None and value - self.base >= self.step:
            self.base, self.since = value, now
            return True
        # First reading, a counter that fell (a process ended), or a window without enough: start again.
        if self.base is None or value < self.base or now - self.since >= self.window:
            self.base, self.since = value, now
        return False


@dataclass
class Signals:
    """The signals read from /proc and CHECKPOINT_DIR under the trainer `root`."""

    root: int
    checkpoints: Path | None = None
    proc: Path = PROC
    cpu: Meter = field(default_factory=lambda: Meter(CPU_STEP_SECONDS))
    disk: Meter = field(default_factory=lambda: Meter(STORAGE_STEP_BYTES))
    files: tuple[int, int, int] | None = None
    ranks_known: dict[tuple[int, int], str] = field(default_factory=dict)

    def sample(self, now: float) -> list[str]:
        """The signals that moved since the last sample."""
        processes = read_processes(self.proc)

        def rank_of(pid: int) -> str | None:
            # Only a RANK found is kept: between fork and exec, torchrun's child still has torchrun's
            # environment, without RANK.
            key = (pid, processes[pid].start if pid in processes else -1)
            if key not in self.ranks_known:
                rank = environ(pid, self.proc).get("RANK")
                if rank is None:
                    return None
                self.ranks_known[key] = rank
            return self.ranks_known[key]

        ranks = rank_pids(processes, self.root, rank_of)
        moved = []
        if self.cpu.moved(helpers_cpu_seconds(processes, ranks), now):
            moved.append(HELPERS)
        if self.disk.moved(disk_bytes(tree(processes, ranks), self.proc), now):
            moved.append(DISK)
        if self.checkpoints is not None:
            files = scan(self.checkpoints)
            if self.files is not None and files != self.files:
                moved.append(CHECKPOINTS)
            self.files = files
        return moved


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@dataclass
class Progress:
    """A node's progress: the latest moment any signal moved, and which."""

    hang_seconds: float
    heartbeat: Path
    output: Path
    signals: Signals | None = None
    source: str = ""
    last: float | None = None
    slowest: float = 0.0
    heartbeat_seen: bool = False

    def sample(self, now: float) -> None:
        beat = mtime(self.heartbeat)
        if beat is not None and not self.heartbeat_seen:
            # What came before the first step (loading, compiling) is no step: the floor counts from here.
            self.heartbeat_seen, self.slowest = True, 0.0
            if self.last is None or beat > self.last:
                self.last, self.source = beat, HEARTBEAT
        moments = [(t, name) for t, name in ((beat, HEARTBEAT), (mtime(self.output), OUTPUT)) if t is not None]
        moved = self.signals.sample(now) if self.signals is not None else []
        if self.last is None and not moments:
            return
        for moment, name in sorted(moments + [(now, name) for name in moved]):
            if self.last is None or moment > self.last:
                if self.last is not None:
                    self.slowest = max(self.slowest, moment - self.last)
                self.last, self.source = moment, name

    @property
    def limit(self) -> float:
        """HANG_SECONDS, never below twice the longest silence seen."""
        return max(self.hang_seconds, 2 * self.slowest)

    def state(self, now: float) -> str:
        """HUNG once the last progress is older than the limit; a node that never showed any is not."""
        return HUNG if self.last is not None and now - self.last >= self.limit else PROGRESSING
