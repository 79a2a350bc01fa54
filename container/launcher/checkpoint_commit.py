"""Which files in a checkpoint directory are complete, for checkpoint_sync.py.

A file is complete when the trainer has finished writing it:
- it appeared whole: renamed (or moved) into place, seen through inotify's IN_MOVED_TO; or
- nobody in the trainer's process tree holds it open for writing (/proc/<pid>/fd and fdinfo), and
  it has not changed for the settle time (its mtime is at least `settle` seconds old: every write
  moves the mtime, so an old mtime means no write since).
After a stop or a crash, the settle time counts back from the moment of the stop: a file written
in place during that window may be torn and is not trusted. After a clean exit (status 0) every file
is complete. Linux only (/proc, inotify); Python 3.10, stdlib.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from pathlib import Path

# <linux/inotify.h>, inotify(7): events name the file inside the watched directory; watches are not
# recursive, so every directory gets its own.
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000
IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of name
# proc(5), /proc/<pid>/fdinfo/<fd>: "flags:" is the file's open flags in octal; the access mode is
# its low two bits (O_ACCMODE): 1 = O_WRONLY, 2 = O_RDWR.
_ACCESS_MODE = 0o3

# Files checkpoint_sync.py writes while restoring; never uploaded.
PARTIAL_SUFFIX = ".checkpoint-sync-partial"


@dataclass(frozen=True)
class Identity:
    """What says that a file is still the same content: inode, size and modification time."""

    inode: int
    size: int
    mtime_ns: int

    @staticmethod
    def of(stat: os.stat_result) -> Identity:
        return Identity(stat.st_ino, stat.st_size, stat.st_mtime_ns)


def process_tree(root: int) -> set[int]:
    """`root` and all its descendants that are alive now (from each process's parent in /proc)."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        pid = int(entry.name)
        alive.add(pid)
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
    tree: set[int] = set()
    pending = [root] if root in alive else []
    while pending:
        pid = pending.pop()
        if pid not in tree:
            tree.add(pid)
            pending.extend(children.get(pid, []))
    return tree


def open_for_writing(pids: set[int], directory: Path) -> set[Path]:
    """Paths under `directory` (a resolved path) that any of `pids` holds open for writing."""
    inside = f"{directory}/"
    found: set[Path] = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if not target.startswith(inside):
                    continue
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            except OSError:
                continue
            flags = next((line.split()[1] for line in info.splitlines() if line.startswith("flags:")), "0")
            if int(flags, 8) & _ACCESS_MODE:
                found.add(Path(target))
    return found


class ArrivalWatch:
    """Files renamed or moved into the directory tree (inotify IN_MOVED_TO), remembered with the
    identity they arrived with, and the files closed after writing (IN_CLOSE_WRITE, in `closed`) and
    moved away or removed (in `gone`) since the caller last took them (take), so that the caller can
    look again once a file has settled or copy a file rewritten in place (checkpoint_snapshots.py).
    Without inotify (or after its queue overflowed) nothing is remembered: every file waits for the
    settle time and the next poll."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.arrived: dict[Path, Identity] = {}
        self.closed: list[Path] = []
        self.gone: list[Path] = []
        # The order in which files were created (IN_CREATE), as a counter: events are read in batches, so
        # the time they were read would make files created close together look simultaneous.
        self.created: dict[Path, int] = {}
        self.sequence = 0
        self.overflowed = False  # events were lost since the caller last looked
        self._dirs: dict[int, Path] = {}
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd: int = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            return
        for root, _, _ in os.walk(directory):
            self._watch(Path(root))

    @property
    def active(self) -> bool:
        return self._fd >= 0

    def _watch(self, path: Path) -> None:
        mask = IN_MOVED_TO | IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_DELETE
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd >= 0:
            self._dirs[wd] = path

    def _arrived(self, path: Path) -> None:
        try:
            if path.is_dir():
                self._watch(path)
                for root, _, names in os.walk(path):
                    self._watch(Path(root))
                    for name in names:
                        self._arrived(Path(root, name))
            else:
                self.arrived[path] = Identity.of(path.stat())
        except OSError:
            pass  # gone again: nothing to remember

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def _created_folder(self, path: Path) -> None:
        """Watch a new folder and what is in it already: files created there before the watch was added
        (a save writes its first file right after its mkdir) count as created together, now."""
        now = self.next_sequence()
        for root, _, names in os.walk(path):
            self._watch(Path(root))
            for name in names:
                self.created.setdefault(Path(root, name), now)

    def drain(self) -> tuple[int, int]:
        """Read every event queued since the last call: (files arrived, files closed after writing)."""
        arrived = closed = 0
        while self.active:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
                offset += _EVENT.size + length
                parent = self._dirs.get(wd)
                if mask & IN_Q_OVERFLOW:
                    self.arrived.clear()  # events were lost: trust only the settle time
                    self.overflowed = True
                if parent is None or not raw:
                    continue
                path = parent / os.fsdecode(raw.rstrip(b"\0"))
                if mask & IN_MOVED_TO:
                    self._arrived(path)
                    arrived += 1
                elif mask & IN_CLOSE_WRITE:
                    self.closed.append(path)
                    closed += 1
                elif mask & (IN_MOVED_FROM | IN_DELETE) and mask & IN_ISDIR:
                    # A folder moved away says nothing of its files one by one.
                    self.created = {file: n for file, n in self.created.items() if path not in file.parents}
                elif mask & (IN_MOVED_FROM | IN_DELETE):
                    self.gone.append(path)
                    self.created.pop(path, None)
                elif mask & IN_CREATE and mask & IN_ISDIR:
                    self._created_folder(path)
                elif mask & IN_CREATE:
                    self.created[path] = self.next_sequence()
        return arrived, closed

    def take(self) -> tuple[list[Path], list[Path]]:
        """The files closed after writing, and those moved away or removed, since the last call."""
        taken = self.closed, self.gone
        self.closed, self.gone = [], []
        return taken

    def appeared_whole(self, path: Path, stat: os.stat_result) -> bool:
        return self.arrived.get(path) == Identity.of(stat)


@dataclass(frozen=True)
class Rule:
    """When a file counts as complete. `stopped_at` (epoch seconds): the trainer was stopped or
    crashed then; `clean_exit`: the trainer exited with status 0."""

    settle_seconds: float
    stopped_at: float | None = None
    clean_exit: bool = False

    def complete(self, stat: os.stat_result, *, open_now: bool, whole: bool, now: float) -> bool:
        if self.clean_exit:
            return True
        if open_now:
            return False
        if whole:
            return True
        horizon = (self.stopped_at if self.stopped_at is not None else now) - self.settle_seconds
        return stat.st_mtime_ns <= horizon * 1e9
