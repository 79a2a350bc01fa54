"""Keep each training node's checkpoint directory in S3 so that a retried attempt resumes from the
last complete checkpoints. Called by distributed_run.sh.

    checkpoint_sync.py restore --uri s3://bucket/prefix/JOB --node I --main M --state-dir STATE DIR
        prints how many files it restored
    checkpoint_sync.py watch --uri s3://bucket/prefix/JOB --node I --main M --pid PID \
        --state-dir STATE [--sync-seconds 60] [--settle-seconds 30] [--final-seconds 120] DIR

Layout under the job's URI: node I keeps its files under `node-I/` and, written after them at every sync,
the manifest `node-I.manifest.json`: every complete file with its size, mtime, S3 version id and when it
was listed, and the node's word (when its look began, what it is still writing, whether its trainer had
ended: checkpoint_sets.py).
A restore reads only manifests, and fetches exactly the versions they name, so it never brings back a file
that was still being written or an upload that a kill cut short. Every node restores every node's files
(ranks land on nodes in rendezvous order, so rank 0's files may be on any node and a rank may read
another's), a folder's files only where no node's word puts their save in doubt (checkpoint_sets.py), a name
on several nodes from its own, else the main node's, else the lowest other index; it uploads only what
differs from what it restored. Restored files get the mtime they had when uploaded, so an unchanged file
is never uploaded again. Nothing in S3 is ever deleted: a file deleted locally only leaves the node's
manifest (its object versions stay in the versioned bucket), at the first sync that commits every closed
file and holds no folder back, so that a checkpoint removed once the next one is saved stays restorable
until that one is.

`watch` polls DIR every --sync-seconds, at once when a file was renamed into place, and once a file
closed after writing has settled (inotify); it uploads new or changed complete files
(checkpoint_commit.py says which); a file rewritten in place goes up as the copy taken at its last close
(checkpoint_snapshots.py), and a folder's files enter the manifest together (folder_commit.py). The S3
side is checkpoint_store.py. The launcher talks to it through files in
STATE, checked every 0.1 s (files, not signals: a signal that came before the interpreter had started
would kill it): `stopping` (the epoch time the trainer was told to stop, or crashed; SIGTERM or SIGINT
to this process count the same): upload at once what is complete; `status` (the trainer's exit status):
the final upload, then exit 0, or 1 if it failed. The final upload is tried again with backoff (1 s,
doubling to 10 s) while S3 throttles or errs, for up to --final-seconds.
Credentials come from the usual AWS sources (on Batch: the job role), the region from aws_region.py;
AWS_ENDPOINT_URL points it elsewhere (the tests use a local S3). A failure is one line on stderr. Python 3.10,
stdlib + boto3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from types import FrameType
from typing import Any

import boto3
from aws_region import region
from checkpoint_commit import PARTIAL_SUFFIX, ArrivalWatch, Rule, open_for_writing, process_tree
from checkpoint_sets import NodeWord, carried, left_out
from checkpoint_snapshots import SNAPSHOTS, Snapshots
from checkpoint_store import ERRORS, Entry, Manifest, NodeStore, entries, local_path, restore_order, transient
from folder_commit import LOG_LIKE_FLOOR_SECONDS, FolderCommits, unit_of

TICK_SECONDS = 0.1
FINAL_BACKOFF_CAP_SECONDS = 10.0


UPLOADED = "uploaded"  # in the state directory: the time of the last sync that uploaded a file
RESTORED = "restored.json"  # in the state directory: what restore brought back, for watch


def restore(client: Any, uri: str, node: int, main: int, directory: Path, state_dir: Path) -> int:
    """Every node's files, each name once: this node's own version, else the main node's, else another's; a
    folder's files only where no node's word puts their save in doubt (checkpoint_sets.py)."""
    stores = restore_order(client, uri, node, main)
    documents = {store.node: store.read_document() for store in stores}
    words = {index: word for index, (_, word) in documents.items() if word is not None}
    listed = {
        index: {name: (e.listed_at, e.mtime_ns / 1e9) for name, e in files.items()}
        for index, (files, _) in documents.items()
    }
    skipped: set[tuple[int, str]] = set()
    for item in left_out(listed, words):
        print(f"checkpoint_sync: not restoring {len(item.names)} files of {item.unit}/: {item.reason}", file=sys.stderr)
        skipped |= item.names
    chosen: dict[str, tuple[NodeStore, Entry]] = {}
    for store in stores:
        files = documents[store.node][0]
        chosen.update((name, (store, e)) for name, e in files.items() if (store.node, name) not in skipped)
    restored: Manifest = {}
    for name, (store, entry) in sorted(chosen.items()):
        target = local_path(directory, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        store.download(name, entry, target)
        restored[name] = entry
    (state_dir / RESTORED).write_text(json.dumps({name: asdict(e) for name, e in restored.items()}))
    return len(restored)


class Watcher:
    def __init__(
        self,
        client: Any,
        uri: str,
        *,
        node: int,
        directory: Path,
        pid: int,
        state_dir: Path,
        sync_seconds: float,
        settle_seconds: float,
        final_seconds: float = 120.0,
    ) -> None:
        self.store = NodeStore(client, uri, node)
        # How long the last upload keeps trying while S3 throttles or errs (after a stop, the container's
        # SIGKILL comes first).
        self.final_seconds = final_seconds
        self.directory = directory.resolve()
        self.pid = pid
        self.state_dir = state_dir
        self.sync_seconds = sync_seconds
        self.settle_seconds = settle_seconds
        self.own, previous = self.store.read_document()
        # The last attempt's word: the span until this attempt's first sync is blind (checkpoint_sets.py).
        self.previous = previous or NodeWord()
        self.word: NodeWord | None = None
        self.started: dict[str, float] = {}  # files in progress -> when their writing began, at the latest
        self.last_walk = time.time()  # what restore brought back was whole; writing began after this
        # What restore brought back (the main node's files on a child, too) is not uploaded again
        # while it is unchanged.
        try:
            restored = json.loads((state_dir / RESTORED).read_text())
        except FileNotFoundError:
            restored = {}
        self.restored: Manifest = entries(restored, str(state_dir / RESTORED))
        self.arrivals = ArrivalWatch(self.directory)
        self.snapshots = Snapshots(self.directory, state_dir / SNAPSHOTS)
        self.folders: FolderCommits[Entry] = FolderCommits(max(LOG_LIKE_FLOOR_SECONDS, 10 * settle_seconds))
        self.stopped_at: float | None = None
        self.settles_at: float | None = None  # when the next closed file settles

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.time()

    def files(self) -> list[Path]:
        found: list[Path] = []
        for root, _, names in os.walk(self.directory):
            found.extend(Path(root, name) for name in names if not name.endswith(PARTIAL_SUFFIX))
        return sorted(found)

    def sync(self, rule: Rule, *, final: bool = False) -> int:
        """Upload every new or changed complete file and list it in the manifest with the rest of its folder
        (folder_commit.py says when a folder's files may be listed). `final`: the trainer has ended. Returns
        the files uploaded."""
        self.arrivals.drain()
        self.settles_at = None
        self.folders.begin()
        walked_at = time.time()  # what this sync says it saw: everything written before its walk began
        base = self.word or carried(self.previous, walked_at)
        first_seen = self.arrivals.next_sequence()  # files this walk sees first count as created together
        writing = open_for_writing(process_tree(self.pid), self.directory)
        now = time.time()
        seen: set[str] = set()
        ready: dict[str, Entry] = {}  # uploaded, now or before: listed once their folder may be
        uploaded = 0
        try:
            for path in self.files():
                name = path.relative_to(self.directory).as_posix()
                seen.add(name)
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                if path not in writing:  # seen closed: a later close on this inode is a rewrite in place
                    self.snapshots.remember(path, stat.st_ino)
                self.folders.saw(name, self.arrivals.created.get(path, first_seen))
                if any(known.matches(stat) for known in (self.own.get(name), self.restored.get(name)) if known):
                    self.folders.committable(name)
                    continue
                staged = self.folders.staged.get(name)
                if staged is not None and staged.matches(stat):
                    ready[name] = staged
                    continue
                whole = self.arrivals.appeared_whole(path, stat)
                source = path
                if not rule.complete(stat, open_now=path in writing, whole=whole, now=now):
                    if path not in writing:  # closed, not settled yet: look again when it is
                        settles = stat.st_mtime_ns / 1e9 + self.settle_seconds
                        self.settles_at = min(self.settles_at or settles, settles)
                    # Rewritten in place: the copy taken at its last close (checkpoint_snapshots.py).
                    snapshot = self.snapshots.for_file(name, stat)
                    if snapshot is None:
                        if path in writing:
                            self.folders.writing(name, now)
                        else:
                            self.folders.unsettled(name, now)
                        continue
                    self.folders.committable(name)
                    state = (snapshot.identity.size, snapshot.identity.mtime_ns)
                    if self.has(name, *state):
                        continue
                    if staged is not None and (staged.size, staged.mtime_ns) == state:
                        ready[name] = staged  # uploaded already, waiting for its folder
                        continue
                    source = snapshot.copy
                entry = self.store.upload(source, name)
                if entry:
                    ready[name] = entry
                    uploaded += 1
                    self.folders.committable(name)
                else:
                    self.folders.unsettled(name, now)
            listed_at = time.time()
            listed = self.folders.listable(ready, seen, now)
            newly = [name for name, e in listed.items() if not self.has(name, e.size, e.mtime_ns)]
            self.own.update((name, replace(e, listed_at=listed_at)) for name, e in listed.items())
            # A file removed here leaves the manifest (its object versions stay in S3) only with a sync that
            # commits every closed file and holds no folder back: a rotation that removes the last checkpoint
            # once the next is saved (Trainer's save_total_limit) must not leave a window where neither is
            # restorable.
            if not self.folders.any_blocked(now):
                for name in [name for name in self.own if name not in seen]:
                    del self.own[name]
            self.snapshots.forget_missing(seen)
            self.word = NodeWord(walked_at, final, self.pending(walked_at, now), base.blind, base.unfinished)
        finally:
            # Every sync, also after an upload failed (what did get there is kept): the word's time says up to
            # when this node saw its folder, which other nodes' folder checkpoints need (checkpoint_sets.py).
            # A sync cut short says no more than the last one did, or, before any, than the last attempt's.
            self.store.write_manifest(self.own, self.word or replace(base, written_at=self.previous.written_at or 0.0))
        if newly:
            # A save's files are in this node's manifest: restorable. The straggler watch replaces a node only after
            # one (straggler_watch.py).
            with contextlib.suppress(OSError):
                (self.state_dir / UPLOADED).write_text(f"{time.time():.3f}\n")
        return uploaded

    def pending(self, walked_at: float, now: float) -> dict[str, float]:
        """The folders with a save in progress after a sync, each with when its files' writing began at the
        latest: for each file still in progress, the last look before the one that first found it so
        (checkpoint_sets.py compares it with the times other nodes listed their files)."""
        in_progress = {name for name in self.folders.in_progress(now) if "/" in name}
        self.started = {name: self.started.get(name, self.last_walk) for name in in_progress}
        self.last_walk = walked_at
        since: dict[str, float] = {}
        for name, began in self.started.items():
            since[unit_of(name)] = min(since.get(unit_of(name), began), began)
        return since

    def has(self, name: str, size: int, mtime_ns: int) -> bool:
        """Whether this node's manifest, or what restore brought back, already holds that state of `name`."""
        known = (self.own.get(name), self.restored.get(name))
        return any(entry is not None and (entry.size, entry.mtime_ns) == (size, mtime_ns) for entry in known)

    def look(self) -> int:
        """The copier's tick for the files rewritten in place; the number of new trusted copies."""
        closed, gone = self.arrivals.take()
        if self.arrivals.overflowed:  # events were lost: no path's inode is known any more
            self.arrivals.overflowed = False
            self.snapshots.inodes.clear()
        return self.snapshots.after_events(
            closed,
            gone,
            tree=lambda: process_tree(self.pid),
            writing=lambda: open_for_writing(process_tree(self.pid), self.directory),
            now=time.monotonic(),
        )

    def read_state(self, name: str) -> float | None:
        try:
            return float((self.state_dir / name).read_text().strip().replace(",", "."))
        except (OSError, ValueError):
            return None

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        launcher = os.getppid()
        next_sync = time.monotonic()  # a first look at once
        last_sync = float("-inf")
        stop_synced = False
        while True:
            arrived, closed = self.arrivals.drain()
            if self.stopped_at is None:
                self.stopped_at = self.read_state("stopping")
            self.snapshots.stopped = self.stopped_at is not None
            promoted = self.look()
            if arrived:
                next_sync = time.monotonic()
            elif promoted:  # goes up like a renamed file, but a file saved every step gets no sync per tick
                next_sync = min(next_sync, last_sync + max(1.0, self.sync_seconds / 10))
            elif closed:  # look again once the file has settled
                next_sync = min(next_sync, time.monotonic() + self.settle_seconds)
            status = self.read_state("status")
            if status is not None:
                break
            if os.getppid() != launcher:
                print("checkpoint_sync: the launcher is gone; final upload", file=sys.stderr)
                break
            if self.stopped_at is not None and not stop_synced:
                stop_synced = True
                self.report("stop", lambda: self.sync(Rule(self.settle_seconds, stopped_at=self.stopped_at)))
            elif self.stopped_at is None and (
                time.monotonic() >= next_sync or (self.settles_at is not None and time.time() >= self.settles_at)
            ):
                self.report("periodic", lambda: self.sync(Rule(self.settle_seconds)))
                last_sync = time.monotonic()
                next_sync = last_sync + self.sync_seconds
            time.sleep(TICK_SECONDS)
        if self.stopped_at is None:
            self.stopped_at = self.read_state("stopping")
        if status == 0:
            final = Rule(self.settle_seconds, clean_exit=True)
        else:  # stopped or crashed: the settle time counts back from the stop, or from now
            final = Rule(self.settle_seconds, stopped_at=self.stopped_at or time.time())
        deadline = time.monotonic() + self.final_seconds
        pause = 1.0
        while True:
            failure = self.report("final", lambda: self.sync(final, final=status is not None))
            if failure is None:
                return 0
            if not transient(failure) or time.monotonic() + pause > deadline:
                return 1
            print(f"checkpoint_sync: S3 asked to retry; final upload again in {pause:g} s", file=sys.stderr)
            time.sleep(pause)
            pause = min(pause * 2, FINAL_BACKOFF_CAP_SECONDS)

    def report(self, what: str, action: Callable[[], int]) -> BaseException | None:
        """Run an upload and say how it went; the error when it failed."""
        where = f"s3://{self.store.bucket}/{self.store.files_prefix}"
        try:
            count = action()
        except ERRORS as error:
            print(f"checkpoint_sync: {what} upload to {where} failed: {error}", file=sys.stderr)
            return error
        if count or what != "periodic":
            print(f"checkpoint_sync: {what} upload: {count} files to {where}", file=sys.stderr)
        return None


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("restore", "watch"):
        command = commands.add_parser(name)
        command.add_argument("directory", type=Path)
        command.add_argument("--uri", required=True)
        command.add_argument("--node", type=int, required=True)
        command.add_argument("--main", type=int, required=True, help="the main node's index (restore reads its set)")
        command.add_argument("--state-dir", type=Path, required=True)
        if name == "watch":
            command.add_argument("--pid", type=int, required=True)
            command.add_argument("--sync-seconds", type=float, default=60.0)
            command.add_argument("--settle-seconds", type=float, default=30.0)
            command.add_argument("--final-seconds", type=float, default=120.0)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    client = boto3.client("s3", region_name=region(os.environ))
    if args.command == "watch":
        try:
            watcher = Watcher(
                client,
                args.uri,
                node=args.node,
                directory=args.directory,
                pid=args.pid,
                state_dir=args.state_dir,
                sync_seconds=args.sync_seconds,
                settle_seconds=args.settle_seconds,
                final_seconds=args.final_seconds,
            )
        except ERRORS as error:
            print(f"checkpoint_sync: cannot read the manifests under {args.uri}: {error}", file=sys.stderr)
            return 1
        return watcher.run()
    try:
        count = restore(client, args.uri, args.node, args.main, args.directory, args.state_dir)
    except ERRORS as error:
        print(f"checkpoint_sync: restore failed: {error}", file=sys.stderr)
        return 1
    print(f"checkpoint_sync: restored {count} files from {args.uri}", file=sys.stderr)
    print(count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
