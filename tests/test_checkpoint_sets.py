"""Which folder checkpoints a restore brings back (container/launcher/checkpoint_sets.py), on recorded manifests
of two- and three-node jobs: a set one node wrote part of and never listed is left out, whichever node is
lost; a set every writer listed, or that only one node writes, is kept; and what a node says outlives the
attempt it said it in."""

from __future__ import annotations

import sys

import pytest

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
from checkpoint_sets import NodeWord, carried, incomplete_sets, set_of
from folder_commit import FolderCommits

# Times in seconds. A DCP save: both ranks write their shard, the coordinator (node 0) writes `.metadata`
# once both are done, at 100; with a 30 s settle the first listing comes at 130 or later.
SHARDS = {"step-50/.metadata", "step-50/__0_0.distcp"}


def word(written_at: float, *pending: str, blind: tuple[tuple[float, float], ...] = ()) -> NodeWord:
    return NodeWord(written_at, frozenset(pending), blind)


def test_a_set_is_the_folder_directly_in_the_checkpoint_folder():
    assert set_of("step-60/__1_0.distcp") == "step-60"
    assert set_of("checkpoint-4/global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt") == "checkpoint-4"
    assert set_of("snapshot.pt") is None  # a file there is judged by its own node alone


def test_a_dcp_step_whose_child_was_lost_before_listing_its_shard_is_left_out():
    files = {
        0: {
            "step-50/.metadata": 70.0,
            "step-50/__0_0.distcp": 70.0,
            "step-60/.metadata": 131.0,
            "step-60/__0_0.distcp": 131.0,
        },
        1: {"step-50/__1_0.distcp": 68.0},  # its step-60 shard closed at 99; lost at 110, before it listed it
    }
    words = {0: word(150.0), 1: word(95.0)}
    dropped = incomplete_sets(files, words)
    assert set(dropped) == {"step-60"}
    assert "node 1 did not speak after it was first listed (at 131.0, its last word at 95.0)" in dropped["step-60"]


def test_a_dcp_step_every_rank_listed_is_kept_though_one_node_was_lost_since():
    files = {
        0: {"step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0},
        1: {"step-60/__1_0.distcp": 129.5},
    }
    assert incomplete_sets(files, {0: word(190.0), 1: word(140.0)}) == {}


def test_a_shard_still_settling_on_a_lost_node_leaves_its_step_out():
    files = {0: {"step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0}, 1: {}}
    dropped = incomplete_sets(files, {0: word(190.0), 1: word(120.0, "step-60")})
    assert dropped == {"step-60": "node 1 was still writing its part when it last spoke"}


def test_a_coordinator_lost_before_listing_its_metadata_leaves_the_step_out_though_the_shards_were_listed():
    # Node 0 listed its shard when it settled, before the slower rank on node 1 was done and `.metadata`
    # was written; node 0 was lost while `.metadata` settled.
    files = {0: {"step-60/__0_0.distcp": 131.0}, 1: {"step-60/__1_0.distcp": 160.0}}
    dropped = incomplete_sets(files, {0: word(150.0, "step-60"), 1: word(200.0)})
    assert dropped == {"step-60": "node 0 was still writing its part when it last spoke"}


def test_the_one_node_that_writes_a_set_may_be_writing_a_newer_state_of_it():
    # rsl_rl's run folder, written by rank 0 only: its listed models are whole while model_300.pt settles.
    files = {0: {"logs/run/model_100.pt": 40.0, "logs/run/model_200.pt": 80.0}, 1: {}}
    assert incomplete_sets(files, {0: word(100.0, "logs"), 1: word(130.0)}) == {}


def test_a_set_one_node_writes_is_kept_when_the_other_node_spoke_after_it_was_first_listed():
    # The child was lost at 90, before the newest model was listed at 95; it had seen the folder since 40.
    files = {0: {"logs/run/model_100.pt": 40.0, "logs/run/model_200.pt": 95.0}, 1: {}}
    assert incomplete_sets(files, {0: word(100.0), 1: word(85.0)}) == {}


def test_a_trainer_folder_listed_after_the_other_node_last_spoke_is_left_out_and_the_one_before_kept():
    # Trainer saves checkpoint-N/ from rank 0; nothing in S3 says whether the lost child wrote to the newest.
    files = {0: {"checkpoint-10/model.safetensors": 60.0, "checkpoint-20/model.safetensors": 125.0}, 1: {}}
    assert set(incomplete_sets(files, {0: word(130.0), 1: word(120.0)})) == {"checkpoint-20"}


def test_files_in_the_checkpoint_folder_itself_are_never_left_out():
    files = {0: {"snapshot.pt": 125.0, "checkpoint-3.pt": 125.0}, 1: {}}
    assert incomplete_sets(files, {0: word(130.0), 1: word(10.0, "step-9")}) == {}


def test_manifests_from_before_sets_ask_nothing():
    files = {0: {"step-60/__0_0.distcp": None}, 1: {"step-60/__1_0.distcp": 131.0}}
    assert incomplete_sets(files, {0: NodeWord(), 1: word(140.0)}) == {}
    assert incomplete_sets({0: {"step-60/.metadata": 131.0}}, {0: word(140.0), 1: NodeWord()}) == {}


def test_a_node_with_no_manifest_wrote_nothing():
    assert incomplete_sets({0: {"step-60/.metadata": 131.0}}, {0: word(140.0)}) == {}


def test_a_set_first_listed_while_a_node_was_between_attempts_is_left_out():
    # Node 1 last spoke at 95 in attempt 1 and first synced at 200 in attempt 2; node 0 listed step-60 at
    # 131 and was lost before its attempt-2 sync could drop what its restore left out.
    after = carried(word(95.0), 200.0)
    assert after.blind == ((95.0, 200.0),)
    files = {0: {"step-60/.metadata": 131.0, "step-50/.metadata": 70.0}}
    now = NodeWord(260.0, frozenset(), after.blind, after.unfinished)
    dropped = incomplete_sets(files, {0: word(140.0), 1: now})
    assert set(dropped) == {"step-60"} and "node 1 did not speak after" in dropped["step-60"]


def test_a_set_a_node_left_unfinished_stays_out_until_written_again_after():
    # Node 1 was writing step-60 when attempt 1 ended; attempt 2 began at 200.
    after = carried(word(120.0, "step-60"), 200.0)
    assert after.unfinished == {"step-60": 200.0}
    node_1 = NodeWord(260.0, frozenset(), after.blind, after.unfinished)
    stale = {0: {"step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0}}
    assert set(incomplete_sets(stale, {0: word(140.0), 1: node_1})) == {"step-60"}
    # step-60 saved again in attempt 2 (the run resumed from step-50), listed by both at 240.
    again = {0: {"step-60/.metadata": 240.0}, 1: {"step-60/__1_0.distcp": 238.0}}
    assert incomplete_sets(again, {0: word(250.0), 1: node_1}) == {}


def test_a_node_keeps_a_bounded_memory_of_the_attempts_before():
    previous = NodeWord(0.0)
    for attempt in range(1, 40):
        previous = carried(
            NodeWord(attempt * 10.0, frozenset({f"s-{attempt}"}), previous.blind, previous.unfinished),
            attempt * 10.0 + 5,
        )
    assert len(previous.blind) == 20 and previous.blind[-1] == (390.0, 395.0)
    assert len(previous.unfinished) == 39 and previous.unfinished["s-39"] == 395.0


@pytest.mark.parametrize(
    ("writing", "closed", "expected"),
    [
        (("step-60/__1_0.distcp",), (), {"step-60/__1_0.distcp"}),  # a shard being written alone
        (("run/events.out",), ("run/model_1.pt",), set()),  # the event file open since before the model
    ],
)
def test_a_node_says_a_set_is_in_progress_while_a_save_is_written_there(writing, closed, expected):
    folders: FolderCommits[str] = FolderCommits(300.0)
    folders.begin()
    order = {name: index for index, name in enumerate((*writing, *closed))}
    if closed:  # the event file came first
        order = {writing[0]: 0, closed[0]: 1}
    for name in (*writing, *closed):
        folders.saw(name, order[name])
    for name in writing:
        folders.writing(name, 10.0)
    for name in closed:
        folders.committable(name)
    folders.listable(dict.fromkeys(closed, "entry"), set(order), 10.0)
    assert folders.in_progress(10.0) == expected


def test_a_closed_unsettled_file_and_a_staged_upload_are_in_progress():
    folders: FolderCommits[str] = FolderCommits(300.0)
    folders.begin()
    for order, name in enumerate(("ckpt-2/model.pt", "ckpt-2/optimizer.pt")):
        folders.saw(name, order)
    folders.committable("ckpt-2/model.pt")
    folders.unsettled("ckpt-2/optimizer.pt", 10.0)
    assert folders.listable({"ckpt-2/model.pt": "entry"}, {"ckpt-2/model.pt", "ckpt-2/optimizer.pt"}, 10.0) == {}
    assert folders.in_progress(10.0) == {"ckpt-2/model.pt", "ckpt-2/optimizer.pt"}
