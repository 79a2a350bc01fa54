"""When checkpoint_sync.py may list a folder's files in the node's manifest.

Most frameworks save a checkpoint as a folder: Hugging Face's Trainer writes `checkpoint-N/` (weights,
optimizer, scheduler, RNG states, `trainer_state.json` last), Accelerate `checkpoint_N/`, PyTorch
Distributed Checkpoint `step-N/` (every rank's `.distcp` files, the coordinator's `.metadata`). Each file is
written in place and becomes complete by the settle rule at its own time, so listing files one by one would
let a manifest name half a folder, and a retry that resumes from the newest folder, as Trainer does, would
load it torn. So the unit is the folder a file is in: a sync lists the files it uploaded only for folders
where no other file is closed but not committable (written, still settling, or changed during its upload).
Those uploads are kept (`staged`) and listed by the first sync that finds their folder settled, without
uploading them again while they are unchanged. A file directly in CHECKPOINT_DIR is a unit of its own:
scripts that save there (`checkpoint-<step>.pt`, `snapshot.pt`) save one file per checkpoint, beside files
that have nothing to do with it.

A file open for writing holds its folder back when it was created no earlier than the oldest file waiting to
be listed there (a save still writing its next file, however long that takes), but not when it was created
before: TensorBoard keeps its event file open for the whole run in Isaac Lab's run folder, created before
any `model_N.pt` beside it. Creation is the order in which inotify saw files created (IN_CREATE), else the
sync that first saw them (files it first saw together count as created together, which holds). Neither an
open file nor a closed one that never becomes committable holds anything back once it has done so for
`log_like_seconds` (a log appended through short-lived writers never settles; a save is long done by then).
A folder inside another holds that one too, while it is held itself (DeepSpeed's `checkpoint-N/global_stepN/`,
FSDP's `checkpoint-N/optimizer_0/`). The closed, unsettled files and the staged ones also hold back the
removals (checkpoint_sync.py). Python 3.10, stdlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

# A file closed but never committable for this long is a log, not part of a save (10 settle times when that
# is longer).
LOG_LIKE_FLOOR_SECONDS = 300.0

Entry = TypeVar("Entry")


def unit_of(name: str) -> str:
    """The unit a manifest name is committed with: its folder, or the file itself directly in CHECKPOINT_DIR."""
    return name.rpartition("/")[0] or name


def ancestors(unit: str) -> list[str]:
    """The folders a unit's folder is in ("a/b/c": "a/b", "a"); none for a file directly in CHECKPOINT_DIR."""
    parts = unit.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


@dataclass
class FolderCommits(Generic[Entry]):
    log_like_seconds: float
    staged: dict[str, Entry] = field(default_factory=dict)  # uploaded, waiting for their folder
    since: dict[str, float] = field(default_factory=dict)  # closed and uncommittable since, without a break
    created: dict[str, int] = field(default_factory=dict)  # the order files were created in, or first seen
    open_since: dict[str, float] = field(default_factory=dict)  # open for writing since, without a break
    _unsettled: set[str] = field(default_factory=set)  # this sync's
    _open: set[str] = field(default_factory=set)  # this sync's files open for writing

    def begin(self) -> None:
        """A sync starts: nothing is unsettled or open in it yet."""
        self._unsettled, self._open = set(), set()

    def saw(self, name: str, created: int) -> None:
        """A file this sync found, and its place in the order of creation (the first one told is kept)."""
        self.created.setdefault(name, created)

    def writing(self, name: str, now: float) -> None:
        """`name` is open for writing now."""
        self.since.pop(name, None)
        self.open_since.setdefault(name, now)
        self._open.add(name)

    def unsettled(self, name: str, now: float) -> None:
        """`name` is closed and this sync cannot commit it."""
        self.since.setdefault(name, now)
        self._unsettled.add(name)

    def committable(self, name: str) -> None:
        """`name` is committed, uploaded, stood in for by a copy, or open for writing."""
        self.since.pop(name, None)

    def blocking(self, now: float) -> set[str]:
        """This sync's unsettled files that hold their folders and the removals back."""
        return {name for name in self._unsettled if now - self.since.get(name, now) < self.log_like_seconds}

    def any_blocked(self, now: float) -> bool:
        """Whether removals wait: a closed file this sync cannot commit, or uploads staged for a folder."""
        return bool(self.blocking(now)) or bool(self.staged)

    def in_progress(self, now: float) -> set[str]:
        """Files of a save still under way, after `listable`: closed ones this sync could not commit, staged
        uploads, and files open for writing that were created no earlier than every closed file beside them
        (the event file a run folder keeps open is not a save)."""
        closed: dict[str, int] = {}
        for name, order in self.created.items():
            if name not in self._open:
                closed[unit_of(name)] = min(closed.get(unit_of(name), order), order)
        opened = {
            name
            for name in self._open
            if now - self.open_since.get(name, now) < self.log_like_seconds
            and self.created.get(name, 0) >= closed.get(unit_of(name), self.created.get(name, 0))
        }
        return self.blocking(now) | set(self.staged) | opened

    def listable(self, ready: Mapping[str, Entry], seen: set[str], now: float) -> dict[str, Entry]:
        """Of the files uploaded and unchanged (`ready`), those whose folder holds nothing back; the rest
        stay staged. `seen`: every file this sync found (what is gone is forgotten)."""
        held = {unit_of(name) for name in self.blocking(now)}
        oldest: dict[str, int] = {}
        for name in ready:
            order = self.created.get(name, 0)
            oldest[unit_of(name)] = min(oldest.get(unit_of(name), order), order)
        held |= {
            unit_of(name)
            for name in self._open
            if unit_of(name) in oldest
            and self.created.get(name, 0) >= oldest[unit_of(name)]
            and now - self.open_since.get(name, now) < self.log_like_seconds
        }
        held |= {folder for unit in held for folder in ancestors(unit)}
        listed = {name: entry for name, entry in ready.items() if unit_of(name) not in held}
        self.staged = {name: entry for name, entry in ready.items() if name not in listed}
        self.since = {name: at for name, at in self.since.items() if name in seen}
        self.open_since = {name: at for name, at in self.open_since.items() if name in self._open}
        self.created = {name: order for name, order in self.created.items() if name in seen}
        return listed
