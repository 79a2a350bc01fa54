"""Which files of folder checkpoints a restore may bring back, from what every node's manifest says
(checkpoint_sync.py).

A checkpoint saved as a folder may be written from several nodes at once: PyTorch Distributed Checkpoint
writes each rank's `__<rank>_0.distcp` into `step-N/` wherever that rank runs, and the coordinator's
`.metadata` once every rank is done; DeepSpeed writes each rank's optimizer shard into
`checkpoint-N/global_stepN/`. Each node lists its own files of a folder together once they are all complete
(folder_commit.py), but a node lost before it listed its part leaves, in S3, no trace of that part. So each
node's manifest also carries its word: when its last look at its folder began (`written_at`), the folders
it was still writing then and since when (`pending`, from the files' own times), whether its trainer had
already ended (`final`: it writes nothing more), the spans it did not watch (`blind`: between an attempt's
last word and the next attempt's first sync) and the folders it left unfinished when an attempt ended.

A file in a folder, listed by node A at time t, is unsafe when another node B was still writing that folder
at t, or did not watch its own folder at t (it may have written a part of the same save and been lost
before listing it), unless B listed its part of that save, or B never wrote a save of that kind (the same
folder name but for its numbers: `checkpoint-20/` is of the kind of `checkpoint-10/`) though one was
listed before: a script that saves from rank 0 alone costs nothing when another node is lost.
For each folder (the unit folder_commit.py commits: a file's own folder), the restore
then leaves out the save that file belongs to: every file of the folder last written no earlier than
`SAVE_SPREAD_SECONDS` before the unsafe file was (the ranks of a collective save close their files within
seconds of each other), and every file its node listed with it or after. A folder that holds many saves (an
RSL-RL run folder, Lightning's `checkpoints/`) so loses only its newest ones, not the saves before. A folder
inside a checkpoint folder (DeepSpeed's `global_stepN/`) has its parent's files of the same save left out
with it.

This leans on one fact about how frameworks save: a save's files exist on every node before any node lists
it, since a node lists a folder only once its files have been closed and unchanged for the settle time
(30 s) and savers are collective (DCP's coordinator writes `.metadata` after every rank's write; Trainer and
Accelerate wait on a barrier). A node that starts writing into a folder after another node listed its part
of the same save is not seen. The times compared come from different hosts' clocks, so they need to agree to
well within that settle time (Amazon Linux's chrony keeps them on the Amazon Time Sync Service: EC2 user
guide, "Set the time for your Linux instance"). A file directly in CHECKPOINT_DIR is judged by its node
alone. Python 3.10, stdlib.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from folder_commit import ancestors, unit_of

# How far apart the last writes of one save's files are, across nodes: a collective save's ranks close their
# files within seconds of each other; DCP's `.metadata` follows the last shard at once.
SAVE_SPREAD_SECONDS = 10.0
# A node's manifest keeps this many spans it did not watch (one per attempt) and folders left unfinished.
KEEP_BLIND = 20
KEEP_UNFINISHED = 200


@dataclass(frozen=True)
class NodeWord:
    """What a node's manifest says besides its files. `written_at` None: a manifest written before sets were
    judged, whose node is not asked."""

    written_at: float | None = None
    final: bool = False  # its trainer had ended when the walk began
    pending: Mapping[str, float] = field(default_factory=dict)  # folder -> written since (its files' times)
    blind: tuple[tuple[float, float], ...] = ()
    unfinished: tuple[tuple[str, float, float], ...] = ()  # (folder, written since, the next attempt began)

    def doubt(self, unit: str, at: float, *, listed_its_part: bool) -> str | None:
        """Why this node's part of `unit` is in doubt for a file listed at `at`, or None. `listed_its_part`:
        this node listed files of the same save (its part of it is whole, folder_commit.py), or never wrote a
        save of that kind though one was listed before (it writes none)."""
        if self.written_at is None:
            return None
        if unit in self.pending and at >= self.pending[unit]:
            return "was still writing its part"
        if any(folder == unit and since <= at <= began for folder, since, began in self.unfinished):
            return "was still writing its part when its attempt ended"
        if listed_its_part:
            return None
        if any(start <= at <= end for start, end in self.blind):
            return "was not watching its folder then (between attempts)"
        if at > self.written_at and not self.final:
            return f"last spoke before it was listed (at {self.written_at:.1f})"
        return None


@dataclass(frozen=True)
class LeftOut:
    unit: str
    names: frozenset[tuple[int, str]]  # (node, name)
    reason: str


def left_out(
    files: Mapping[int, Mapping[str, tuple[float | None, float]]], words: Mapping[int, NodeWord]
) -> list[LeftOut]:
    """What a restore must leave out, per folder, with the reason (naming the node and what it said).
    `files`: each node's manifest, name -> (when it was listed, None before sets were judged; its last
    write, the epoch seconds of its mtime); `words`: what
    each node's manifest says besides. A node with no manifest never started its copier (its first sync
    comes as the trainer starts, long before a first save), so it wrote nothing."""
    listed: dict[str, list[tuple[float, float, int, str]]] = {}
    for node, by_name in files.items():
        for name, (at, written) in by_name.items():
            if "/" in name and at is not None:
                listed.setdefault(unit_of(name), []).append((at, written, node, name))
    # The kinds of save each node has written: folders it lists, is writing or left unfinished.
    kinds = {node: {shape_of(unit_of(name)) for name in by_name if "/" in name} for node, by_name in files.items()}
    for node, word in words.items():
        kinds.setdefault(node, set()).update(
            shape_of(unit) for unit in (*word.pending, *(u for u, _, _ in word.unfinished))
        )
    first_listed = {unit: min(at for at, _, _, _ in entries) for unit, entries in listed.items()}
    # Folder -> (the unsafe save's earliest write that counts, the node and listing that take the rest, why).
    cuts: dict[str, tuple[float, dict[int, float], str]] = {}
    for unit, entries in listed.items():
        shape = shape_of(unit)
        # An earlier save of this kind was listed: a node that never wrote one writes none (rank 0 alone saves).
        known_kind = any(shape_of(o) == shape and first_listed[o] < first_listed[unit] for o in first_listed)
        for at, written, node, _ in sorted(entries):
            vouched = {
                other for _, other_written, other, _ in entries if abs(other_written - written) <= SAVE_SPREAD_SECONDS
            }
            if known_kind:
                vouched |= {other for other in words if shape not in kinds.get(other, set())}
            reason = next(
                (f"node {other} {why}" for other, word in sorted(words.items())
                 if other != node and (why := word.doubt(unit, at, listed_its_part=other in vouched))),
                None,
            )  # fmt: skip
            if reason is not None:
                why = f"{reason}, when node {node} listed a file of it at {at:.1f}"
                cuts[unit] = (written - SAVE_SPREAD_SECONDS, {node: at}, why)
                break
    # A nested folder's save takes its parent's files of the same save along (DeepSpeed's global_stepN/).
    for unit, (since, by_node, why) in list(cuts.items()):
        for parent in ancestors(unit):
            if parent in listed and parent not in cuts:
                cuts[parent] = (since, by_node, why)
    found = []
    for unit, (since, by_node, why) in sorted(cuts.items()):
        cut_off = frozenset(
            (node, name)
            for at, written, node, name in listed[unit]
            if written >= since or at >= by_node.get(node, float("inf"))
        )
        found.append(LeftOut(unit, cut_off, why))
    return found


def shape_of(unit: str) -> str:
    """A folder's path with its numbers taken out: the kind of save (`checkpoint-10` and `checkpoint-20`)."""
    return re.sub(r"\d+", "#", unit)


def carried(previous: NodeWord, began: float) -> NodeWord:
    """The word a node's new attempt starts from, its first sync at `began`: the span since the last
    attempt's last word is blind (unless that word was final: its trainer had ended, nothing more came),
    and the folders it was writing then are unfinished from when their writing began until `began`."""
    blind = previous.blind
    if previous.written_at is not None and not previous.final:
        blind = (*blind, (previous.written_at, began))
    unfinished = (*previous.unfinished, *((unit, since, began) for unit, since in sorted(previous.pending.items())))
    return NodeWord(None, False, {}, blind[-KEEP_BLIND:], unfinished[-KEEP_UNFINISHED:])
