"""Copies of checkpoint files that the trainer rewrites in place, for checkpoint_sync.py.

PyTorch's DDP tutorial and the scripts that follow it call `torch.save` on the same path every epoch: the
file is truncated and written again on the same inode, so it is never unchanged for the settle time and
the settle rule (checkpoint_commit.Rule) never lets it go. Its consistent states are the moments its
writer closes it. So when inotify says a file was closed after writing (IN_CLOSE_WRITE), it is a file
seen before on the same inode (rewritten in place, not a new file about to be renamed), and nobody in the
trainer's tree holds it open for writing, this module copies it aside at once and checks that it did not
change while copied. The copier uploads that copy under the file's name whenever the live file is not
complete itself.

A close is not always a save's end: a process that dies mid-write has its files closed by the kernel, and
that close says nothing about the content. The kernel may close that file seconds after the process began
to die: the thread-group leader shows as a zombie first, and the last thread closes the file table in fd
order (a GPU's device files first, which takes time). So every look (the copier's tick, 0.1 s) notes
whether a process of the trainer's tree ended since the last, or is a zombie still; the copy of a close
stays pending for two more looks, and is dropped if such a look is the one before the close was read, the
one that read it, or the next; else it becomes the file's trusted snapshot. No copy is taken in a look
like that, nor once the trainer was told to stop (its processes end next). The processes known are
re-read each look (a stat file each); the whole of /proc is walked for new ones once a second and on a
look with closes, so a writer that starts and dies between two walks is not seen (a limit). A save done
by a process that exits right after its last close (a subprocess), or made right after another process
of the trainer ended (a data loader's workers at an epoch's end, unless `persistent_workers`), is not
trusted by this rule and is left to the settle rule. Only the newest trusted snapshot and one pending
copy are kept per file: at most two copies of each rewritten file on the node's disk. Python 3.10,
stdlib.
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


def process_state(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process (with its pid, the start time names one process for good); None
    for one gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # proc(5): field 3 is the state and field 22 the start time (index 0 and 19 after the comm).
    return fields[0], fields[19]


DYING = ("Z", "X")  # proc(5): zombie, dead


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
    stopped: bool = False  # the trainer was told to stop, or crashed: no new copies
    state: Callable[[int], tuple[str, str] | None] = process_state  # the tests replay recorded processes

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
        ending = False
        for pid, started in list(self.processes.items()):
            seen = self.state(pid)
            if seen is None or seen[1] != started:
                del self.processes[pid]
                ending = True
            elif seen[0] in DYING:  # kept while it is one: its files may still be closing
                ending = True
        if ending:
            self.ended_in.add(self.look)
        if closed or self.pending or self.scanned_at is None or now - self.scanned_at >= RESCAN_SECONDS:
            self.scanned_at = now
            for pid in tree():
                seen = self.state(pid)
                if pid not in self.processes and seen is not None and seen[0] not in DYING:
                    self.processes[pid] = seen[1]
        if closed and not self.stopped and not {self.look - 1, self.look} & self.ended_in:
            open_now = writing()
            for path in closed:
                self._copy(path, open_now)
        else:
            for path in closed:  # a close not worth a copy still says which inode the path has
                self._remember_close(path)
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

    def _remember_close(self, path: Path) -> os.stat_result | None:
        """The closed file's stat, its inode remembered; None when it is gone."""
        try:
            stat = path.stat()
        except OSError:
            self.inodes.pop(path, None)
            return None
        self.inodes[path] = stat.st_ino
        return stat

    def _copy(self, path: Path, writing: set[Path]) -> None:
        rewritten_inode = self.inodes.get(path)
        stat = self._remember_close(path)
        if stat is None or rewritten_inode != stat.st_ino or path in writing:
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
