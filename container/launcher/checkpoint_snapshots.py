"""Copies of checkpoint files that the trainer rewrites in place, for checkpoint_sync.py.

PyTorch's DDP tutorial and the scripts that follow it call `torch.save` on the same path every epoch: the
file is truncated and written again on the same inode, so it is never unchanged for the settle time and
the settle rule (checkpoint_commit.Rule) never lets it go. Its consistent states are the moments its
writer closes it. So when inotify says a file was closed after writing (IN_CLOSE_WRITE), it is a file
seen before on the same inode (rewritten in place, not a new file about to be renamed), and nobody in the
trainer's tree holds it open for writing, this module copies it aside at once and checks that it did not
change while copied. The copier uploads that copy under the file's name whenever the live file is not
complete itself.

A close is not always a save's end: a process that dies mid-write has its files closed by the kernel
(exit_files(), just before the process becomes a zombie), and that close says nothing about the content.
So every look (the copier's tick, 0.1 s) also notes whether a process of the trainer's tree ended since
the last: the copy of a close stays pending for two more looks, and is dropped if a process was seen to
end in the look before the one that read the close, in that look, or in the next; else it becomes the
file's trusted snapshot. The processes known are re-read each look (a stat file each); the whole of /proc
is walked for new ones only once a second and on a look with closes. A writer process that exits right
after its last close (a save in a subprocess) loses its snapshots by the same rule and is left to the
settle rule. Only the newest trusted snapshot and one pending copy are kept per file: at most two copies
of each rewritten file on the node's disk. Python 3.10, stdlib.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_commit import Identity

SNAPSHOTS = "snapshots"  # under the copier's state directory
RESCAN_SECONDS = 1.0


@dataclass(frozen=True)
class Snapshot:
    copy: Path
    identity: Identity  # the file's when it was copied: the state its writer closed
    look: int  # the look (Snapshots.look) that read the close


def start_time(pid: int) -> str | None:
    """A live process's start time (with its pid, it names one process for good); None for one gone or a
    zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # proc(5): field 3 is the state and field 22 the start time (index 0 and 19 after the comm).
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass
class Snapshots:
    """`trusted` maps a file's name (relative to the folder) to its newest trusted snapshot."""

    folder: Path  # the checkpoint directory (resolved)
    store: Path  # where the copies go
    trusted: dict[str, Snapshot] = field(default_factory=dict)
    pending: dict[str, Snapshot] = field(default_factory=dict)
    inodes: dict[Path, int] = field(default_factory=dict)  # the inode each file had when last seen
    processes: dict[int, str] = field(default_factory=dict)  # the trainer's, by pid: their start times
    look: int = 0
    ended_in: set[int] = field(default_factory=set)  # looks that saw a process of the trainer end
    scanned_at: float | None = None
    started: Callable[[int], str | None] = start_time  # the tests replay recorded processes through it

    def remember(self, path: Path, inode: int) -> None:
        """A file seen with `inode` (the copier's walk): a later close on it is a rewrite in place."""
        self.inodes[path] = inode

    def after_events(
        self,
        closed: Iterable[Path],
        gone: Iterable[Path] = (),
        *,
        tree: Callable[[], set[int]],
        writing: Callable[[], set[Path]],
        now: float,
    ) -> int:
        """One look: note the trainer's processes that ended, copy what was closed, judge the copies
        pending. Returns the number of new trusted snapshots."""
        self.look += 1
        closed = list(dict.fromkeys(closed))
        for path in gone:  # the next file at that path is a new one, whatever inode it gets
            self.inodes.pop(path, None)
        ended = [pid for pid, started in self.processes.items() if self.started(pid) != started]
        for pid in ended:
            del self.processes[pid]
        if ended:
            self.ended_in.add(self.look)
        if closed or self.pending or self.scanned_at is None or now - self.scanned_at >= RESCAN_SECONDS:
            self.scanned_at = now
            for pid in tree():
                if pid not in self.processes and (started := self.started(pid)) is not None:
                    self.processes[pid] = started
        if closed:
            open_now = writing()
            for path in closed:
                self._copy(path, open_now)
        promoted = 0
        for name, snapshot in list(self.pending.items()):
            if {snapshot.look - 1, snapshot.look, snapshot.look + 1} & self.ended_in:
                self._drop(self.pending.pop(name))
            elif self.look >= snapshot.look + 2:
                previous = self.trusted.get(name)
                self.trusted[name] = self.pending.pop(name)
                if previous is not None:
                    self._drop(previous)
                promoted += 1
        self.ended_in = {n for n in self.ended_in if n >= self.look - 3}
        return promoted

    def _copy(self, path: Path, writing: set[Path]) -> None:
        try:
            stat = path.stat()
        except OSError:
            self.inodes.pop(path, None)
            return
        rewritten = self.inodes.get(path) == stat.st_ino
        self.inodes[path] = stat.st_ino
        if not rewritten or path in writing:
            return
        name = path.relative_to(self.folder).as_posix()
        copy = self.store / f"{name}.{self.look}"
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)  # the content, and the mtime it was closed with
            after, copied = path.stat(), copy.stat()
        except OSError:
            copy.unlink(missing_ok=True)
            return
        same = Identity.of(after) == Identity.of(stat)
        if not same or (copied.st_size, copied.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            copy.unlink(missing_ok=True)  # written again while copied: the next close brings another
            return
        older = self.pending.pop(name, None)
        if older is not None:
            self._drop(older)
        self.pending[name] = Snapshot(copy, Identity.of(stat), self.look)

    def for_file(self, name: str, stat: os.stat_result) -> Snapshot | None:
        """The trusted snapshot of `name` while the live file is still the one it was copied from (the same
        inode; a file replaced by a rename is a new file)."""
        snapshot = self.trusted.get(name)
        if snapshot is None or snapshot.identity.inode != stat.st_ino:
            return None
        return snapshot

    def forget_missing(self, names: set[str]) -> None:
        """Drop the copies of files no longer in the folder: a removed file is not restored."""
        for table in (self.trusted, self.pending):
            for name in [n for n in table if n not in names]:
                self._drop(table.pop(name))
        self.inodes = {p: i for p, i in self.inodes.items() if p.relative_to(self.folder).as_posix() in names}

    @staticmethod
    def _drop(snapshot: Snapshot) -> None:
        snapshot.copy.unlink(missing_ok=True)
