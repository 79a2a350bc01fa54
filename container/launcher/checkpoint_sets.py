"""Which folder checkpoints a restore may bring back, from what every node's manifest says (checkpoint_sync.py).

A checkpoint saved as a folder may be written from several nodes at once: PyTorch Distributed Checkpoint
writes each rank's `__<rank>_0.distcp` into `step-N/` wherever that rank runs, and the coordinator's
`.metadata` once every rank is done; DeepSpeed writes each rank's optimizer shard into `checkpoint-N/`. Each
node lists its own files of a folder together once they are all complete (folder_commit.py), but a node lost
before it listed its part leaves, in S3, no trace of that part. So the set a restore judges is a folder
directly in CHECKPOINT_DIR, across nodes, and a set is restorable when each node either

- lists files of it and was not still writing it at its last word (the only node that lists a set may be
  writing a newer state of it: its list is one consistent state of its own folder), or
- spoke after the set was first listed anywhere without naming it, so it wrote nothing to it.

"Spoke" means a manifest it wrote (every sync writes one, with the time its walk began), not counting the time
between an attempt's end and the next attempt's first sync (`blind`), and a set it was still writing when an
attempt ended counts as written-and-unfinished until the next attempt began (`unfinished`).

This leans on one fact about how frameworks save: a set's files exist on every node before any node lists the
set, since a node lists a folder only once its files have been closed and unchanged for the settle time (30 s)
and savers are collective (DCP's coordinator writes `.metadata` after every rank's write; Trainer and
Accelerate wait on a barrier). A node that starts writing into a set after another node listed it is not seen.
The times compared come from different hosts' clocks, so they need to agree only to well within that settle
time (Amazon Linux's chrony keeps them on the Amazon Time Sync Service: EC2 user guide, "Set the time for
your Linux instance"). A file directly in CHECKPOINT_DIR is a set of its own, judged by its node alone. Python 3.10,
stdlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# A node's manifest keeps this many spans it did not watch (one per attempt) and sets it left unfinished.
KEEP_BLIND = 20
KEEP_UNFINISHED = 200


def set_of(name: str) -> str | None:
    """The folder directly in CHECKPOINT_DIR that a manifest name belongs to; None for a file there itself."""
    folder, _, _ = name.partition("/")
    return folder if folder != name else None


@dataclass(frozen=True)
class NodeWord:
    """What a node's manifest says besides its files. `written_at` None: a manifest written before sets were
    judged, whose node is not asked."""

    written_at: float | None = None
    pending: frozenset[str] = frozenset()  # sets it was writing at `written_at`
    blind: tuple[tuple[float, float], ...] = ()  # spans it did not watch its folder (between attempts)
    unfinished: Mapping[str, float] = field(default_factory=dict)  # set -> when the attempt after it began

    def saw(self, at: float) -> bool:
        """Whether this node watched its folder at `at` and said so afterwards."""
        if self.written_at is None:
            return True
        return at <= self.written_at and not any(start <= at <= end for start, end in self.blind)

    def writing(self, unit: str, listed: float) -> bool:
        """Whether this node was still writing `unit` (a set first listed at `listed`) when it last spoke."""
        return unit in self.pending or self.unfinished.get(unit, float("-inf")) >= listed


def incomplete_sets(files: Mapping[int, Mapping[str, float | None]], words: Mapping[int, NodeWord]) -> dict[str, str]:
    """The sets a restore must leave out, each with the reason (naming the node and what it said).
    `files`: each node's manifest, name -> when it was listed (None: before sets were judged); `words`: what
    each node's manifest says besides. A node with no manifest never started its copier (its first sync
    comes as the trainer starts, long before a first save), so it wrote nothing."""
    first_listed: dict[str, float] = {}
    writers: dict[str, set[int]] = {}
    for node, names in files.items():
        for name, at in names.items():
            unit = set_of(name)
            if unit is None:
                continue
            writers.setdefault(unit, set()).add(node)
            if at is not None:
                first_listed[unit] = min(first_listed.get(unit, at), at)
    dropped: dict[str, str] = {}
    everyone = sorted(words)
    for unit, listed in sorted(first_listed.items()):
        still = [node for node in everyone if node in words and words[node].writing(unit, listed)]
        own = writers[unit]
        if still and not (len(own) == 1 and set(still) <= own):
            dropped[unit] = f"node {still[0]} was still writing its part when it last spoke"
            continue
        for node in everyone:
            if node in own or node in still:
                continue
            word = words[node]
            if not word.saw(listed):
                dropped[unit] = (
                    f"node {node} did not speak after it was first listed (at {listed:.1f}, its last word at "
                    f"{word.written_at:.1f}), so its part of it is unknown"
                )
                break
    return dropped


def carried(previous: NodeWord, began: float) -> NodeWord:
    """The word a node's new attempt starts from, its first sync at `began`: the span since the last
    attempt's last word is blind, and the sets it was writing then are unfinished until `began`."""
    blind = previous.blind
    if previous.written_at is not None:
        blind = (*blind, (previous.written_at, began))
    unfinished = dict(previous.unfinished)
    unfinished.update(dict.fromkeys(previous.pending, began))
    newest = sorted(unfinished.items(), key=lambda item: item[1])[-KEEP_UNFINISHED:]
    return NodeWord(None, frozenset(), blind[-KEEP_BLIND:], dict(newest))
