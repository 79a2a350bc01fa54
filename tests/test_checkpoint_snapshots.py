"""The rule for files rewritten in place (container/launcher/checkpoint_snapshots.py), on recorded sequences of
writes, closes, renames, removals and process ends: the copy taken at a close becomes the file's trusted
snapshot only when no process of the trainer ended around it, a torn state is never trusted, and a file
written aside and renamed is never copied."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
from checkpoint_snapshots import Snapshots, process_state


class Replay:
    """A checkpoint folder, the trainer's processes as recorded (pid -> start time; a pid removed has
    ended), the files open for writing, and the copier's looks."""

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path / "checkpoints"
        self.folder.mkdir()
        self.processes = {10: "100", 11: "101"}
        self.zombies: set[int] = set()
        self.writing: set[Path] = set()
        self.snapshots = Snapshots(self.folder, tmp_path / "state" / "snapshots", state=self.state)

    def state(self, pid: int) -> tuple[str, str] | None:
        if pid not in self.processes:
            return None
        return ("Z" if pid in self.zombies else "S"), self.processes[pid]

    def write(self, name: str, text: str) -> Path:
        """A save in place: the same inode, truncated and written (the close is for the look to read)."""
        path = self.folder / name
        with path.open("r+" if path.exists() else "w") as f:
            f.truncate(0)
            f.write(text)
        return path

    def save(self, name: str, text: str, *, looks: int = 2) -> Path:
        """A save in place, the look that reads its close, and `looks` more."""
        path = self.write(name, text)
        self.look((path,))
        for _ in range(looks):
            self.look()
        return path

    def look(self, closed: tuple[Path, ...] = (), gone: tuple[Path, ...] = ()) -> int:
        return self.snapshots.after_events(
            closed, gone, tree=lambda: set(self.processes), writing=lambda: set(self.writing), now=0.0
        )

    def trusted(self, name: str) -> str | None:
        snapshot = self.snapshots.trusted.get(name)
        return snapshot.copy.read_text() if snapshot else None

    def copies(self) -> list[Path]:
        store = self.snapshots.store
        return sorted(p for p in store.rglob("*") if p.is_file()) if store.exists() else []


@pytest.fixture
def replay(tmp_path: Path) -> Replay:
    r = Replay(tmp_path)
    r.look()  # the copier's first look knows the trainer's processes
    return r


def test_a_rewrite_in_place_is_trusted_two_looks_after_its_close_and_keeps_that_content(replay):
    path = replay.write("snapshot.pt", "epoch 1")
    replay.look((path,))  # the first close of a new file: remembered, not copied (no double write)
    assert replay.copies() == []
    replay.write("snapshot.pt", "epoch 2")
    assert replay.look((path,)) == 0
    assert replay.look() == 0  # pending: a process could still be seen to end
    assert replay.look() == 1
    assert replay.trusted("snapshot.pt") == "epoch 2"
    # The next save is torn (half written when the copier looks): the trusted copy keeps epoch 2.
    with path.open("w") as f:
        f.write("epo")
        replay.writing = {path}
        assert replay.trusted("snapshot.pt") == "epoch 2"
    snapshot = replay.snapshots.for_file("snapshot.pt", path.stat())
    assert snapshot is not None and snapshot.copy.read_text() == "epoch 2"
    assert snapshot.identity.size == len("epoch 2")


def test_a_file_seen_closed_by_the_walk_is_copied_at_its_first_close_after(replay):
    path = replay.write("snapshot.pt", "restored")
    replay.snapshots.remember(path, path.stat().st_ino)  # the copier's walk saw it closed
    replay.save("snapshot.pt", "epoch 7")
    assert replay.trusted("snapshot.pt") == "epoch 7"


@pytest.mark.parametrize("ends_at", [-1, 0, 1], ids=["the look before", "the same look", "the look after"])
def test_a_close_beside_a_process_end_is_never_trusted(replay, ends_at):
    """A process that dies mid-write has its files closed by the kernel: that close is no save's end."""
    path = replay.save("snapshot.pt", "epoch 1", looks=0)
    for _ in range(2):
        replay.look()
    replay.save("snapshot.pt", "epoch 2")
    assert replay.trusted("snapshot.pt") == "epoch 2"

    replay.write("snapshot.pt", "epo")  # torn: its writer died mid-write
    looks = [(), (path,), ()]
    for index, closed in enumerate(looks):
        if index == ends_at + 1:
            del replay.processes[11]
        replay.look(closed)
    replay.look()
    replay.look()
    assert replay.trusted("snapshot.pt") == "epoch 2"
    assert len(replay.copies()) == 1  # the torn copy is gone from the node's disk


def test_a_process_end_two_looks_before_the_close_does_not_count_against_it(replay):
    replay.save("snapshot.pt", "epoch 1", looks=0)
    del replay.processes[11]  # a data loader's worker, at the end of the epoch
    replay.look()
    replay.look()
    replay.save("snapshot.pt", "epoch 2")
    assert replay.trusted("snapshot.pt") == "epoch 2"


def test_a_process_restarted_under_the_same_pid_counts_as_ended(replay):
    path = replay.save("snapshot.pt", "epoch 1", looks=0)
    replay.write("snapshot.pt", "epoch 2")
    replay.processes[11] = "999"  # pid 11 is another process now
    replay.look((path,))
    replay.look()
    replay.look()
    assert replay.trusted("snapshot.pt") is None


def test_a_file_written_aside_and_renamed_is_never_copied(replay):
    """checkpoint-N.pt.tmp is closed, renamed away, and the next save creates the name again."""
    for step in (10, 20, 30):
        aside = replay.write("latest.pt.tmp", f"step {step}")
        replay.look((aside,))
        aside.replace(replay.folder / "latest.pt")
        replay.look((), (aside,))
    replay.look()
    replay.look()
    assert replay.copies() == [] and replay.snapshots.trusted == {}


def test_a_close_while_another_writer_holds_the_file_is_not_copied(replay):
    path = replay.save("snapshot.pt", "epoch 1", looks=0)
    replay.write("snapshot.pt", "epoch 2")
    replay.writing = {path}  # a second handle, still writing
    replay.look((path,))
    replay.look()
    replay.look()
    assert replay.copies() == [] and replay.trusted("snapshot.pt") is None


def test_a_file_replaced_by_a_rename_is_a_new_file_and_a_removed_one_loses_its_copies(replay):
    path = replay.save("snapshot.pt", "epoch 1", looks=0)
    replay.save("snapshot.pt", "epoch 2")
    assert replay.snapshots.for_file("snapshot.pt", path.stat()) is not None
    (replay.folder / "other").write_text("epoch 3")
    (replay.folder / "other").replace(path)
    assert replay.snapshots.for_file("snapshot.pt", path.stat()) is None  # the live file is whole itself
    path.unlink()
    replay.snapshots.forget_missing(set())
    assert replay.copies() == [] and replay.snapshots.trusted == {}


def test_a_copy_keeps_the_mtime_the_file_was_closed_with(replay):
    path = replay.save("snapshot.pt", "epoch 1", looks=0)
    replay.write("snapshot.pt", "epoch 2")
    os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    replay.look((path,))
    replay.look()
    replay.look()
    copy = replay.snapshots.trusted["snapshot.pt"].copy
    assert copy.stat().st_mtime_ns == 1_700_000_000_000_000_000


def test_a_close_read_while_a_process_of_the_trainer_is_a_zombie_is_never_trusted(replay):
    """SIGKILL mid-save: the thread-group leader shows as a zombie at once, and its last thread closes the
    checkpoint's fd seconds later, after the GPU's device files."""
    path = replay.save("snapshot.pt", "epoch 1", looks=0)
    replay.save("snapshot.pt", "epoch 2")
    assert replay.trusted("snapshot.pt") == "epoch 2"
    replay.zombies.add(11)
    for _ in range(5):
        replay.look()
    replay.write("snapshot.pt", "epo")  # torn: the kernel closes it now
    replay.look((path,))
    for _ in range(3):
        replay.look()
    assert replay.trusted("snapshot.pt") == "epoch 2"
    del replay.processes[11]  # reaped at last
    replay.look()
    assert replay.trusted("snapshot.pt") == "epoch 2"


def test_no_copy_is_taken_once_the_trainer_was_told_to_stop(replay):
    replay.save("snapshot.pt", "epoch 1", looks=0)
    replay.snapshots.stopped = True
    replay.save("snapshot.pt", "epoch 2")
    assert replay.copies() == [] and replay.trusted("snapshot.pt") is None


def test_process_state_reads_a_live_process_and_not_a_missing_one():
    state = process_state(os.getpid())
    assert state is not None and state[0] in "RS"
    assert process_state(2**22 + 12345) is None
