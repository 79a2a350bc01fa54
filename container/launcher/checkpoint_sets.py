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
The unit is a file's own folder (what folder_commit.py commits). A folder that holds one save (its name
carries one number: `checkpoint-20`, `step-60`, `global_step4`) comes back whole or not at all: any file a
node listed there vouches for its part, a node still writing it takes it out, and save folders inside each
other (DeepSpeed's `checkpoint-N/global_stepN/`) go together. A folder of many saves (an RSL-RL run folder,
whose timestamp carries several numbers; Lightning's `checkpoints/`) loses only the saves in doubt: the
files last written within `SAVE_SPREAD_SECONDS` of one in doubt (the ranks of a collective save close
their files within seconds of each other) and what its node listed with it.

This leans on one fact about how frameworks save: a save's files exist on every node before any node lists it,
since a node lists a folder only once its files have been closed and unchanged for the settle time (30 s) and
savers are collective (DCP's coordinator writes `.metadata` after every rank's write; Trainer's ranks each
write their RNG state as the save starts). A node that starts writing into a folder after another node listed
its part of the same save, and is lost before it lists anything, is not seen. The times compared come from
different hosts' clocks, so they need to agree to well within that settle time (Amazon Linux's chrony keeps
them on the Amazon Time Sync Service: EC2 user guide, "Set the time for your Linux instance"). A file directly
in CHECKPOINT_DIR is judged by its node alone. Python 3.10, stdlib.
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


def save_folder(unit: str) -> bool:
    """Whether a folder holds one save: its own name carries one number (`checkpoint-20`, `step-60`,
    `global_step4`, `checkpoint_3`), where a run folder's timestamp carries several and `checkpoints/` none."""
    return len(re.findall(r"\d+", unit.rpartition("/")[2])) == 1


def left_out(
    files: Mapping[int, Mapping[str, tuple[float | None, float]]], words: Mapping[int, NodeWord]
) -> list[LeftOut]:
    """What a restore must leave out, per folder, with the reason (naming the node and what it said).
    `files`: each node's manifest, name -> (when it was listed, None before sets were judged; its last
    write, the epoch seconds of its mtime); `words`: what each node's manifest says besides. A node with no
    manifest never started its copier, so it is not asked."""
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
    doubted: dict[str, list[tuple[float, float, int, str]]] = {}  # folder -> (listed, written, node, why)
    for unit, entries in listed.items():
        whole = save_folder(unit)
        still = sorted(node for node, word in words.items() if unit in word.pending)
        if whole and still:  # a save folder some node was still writing, its own listed part or not
            doubted[unit] = [
                (entries[0][0], entries[0][1], entries[0][2], f"node {still[0]} was still writing its part")
            ]
            continue
        shape = shape_of(unit)
        earlier = [at for other, at in first_listed.items() if shape_of(other) == shape and at < first_listed[unit]]
        # Nodes that looked after an earlier save of this kind was listed and never wrote one write none.
        bystanders = {
            node
            for node, word in words.items()
            if earlier and shape not in kinds.get(node, set()) and (word.written_at or 0.0) >= min(earlier)
        }
        listers = {node for _, _, node, _ in entries}
        for at, written, node, _ in sorted(entries):
            same_save = listers if whole else {n for _, w, n, _ in entries if abs(w - written) <= SAVE_SPREAD_SECONDS}
            vouched = same_save | bystanders
            reason = next(
                (f"node {other} {why}" for other, word in sorted(words.items())
                 if other != node and (why := word.doubt(unit, at, listed_its_part=other in vouched))),
                None,
            )  # fmt: skip
            if reason is not None:
                doubted.setdefault(unit, []).append(
                    (at, written, node, f"{reason}, when node {node} listed a file of it at {at:.1f}")
                )
    cut: dict[str, tuple[set[tuple[int, str]], str]] = {}
    for unit, unsafe in doubted.items():
        entries = listed[unit]
        if save_folder(unit):
            names = {(node, name) for _, _, node, name in entries}
        else:  # a folder of many saves: the saves in doubt only
            names = {
                (node, name)
                for at, written, node, name in entries
                for u_at, u_written, u_node, _ in unsafe
                if abs(written - u_written) <= SAVE_SPREAD_SECONDS or (node == u_node and abs(at - u_at) <= 1.0)
            }
        cut[unit] = (names, unsafe[0][3])
    # Save folders inside each other are one save (DeepSpeed's checkpoint-N/global_stepN/): they go together.
    for unit, (_, why) in list(cut.items()):
        for other in listed:
            nested = other in ancestors(unit) or unit in ancestors(other)
            if nested and save_folder(other) and (save_folder(unit) or other in ancestors(unit)) and other not in cut:
                cut[other] = ({(node, name) for _, _, node, name in listed[other]}, why)
    return [LeftOut(unit, frozenset(names), why) for unit, (names, why) in sorted(cut.items()) if names]


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
