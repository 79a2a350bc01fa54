"""Which files of folder checkpoints a restore brings back (container/launcher/checkpoint_sets.py), on
recorded manifests of two-node jobs with the layouts frameworks write: a save one node wrote part of and
never listed is left out, whichever node is lost; a save every writer listed is kept; a folder holding many
saves loses only the ones in doubt; a stopped node's last word is its final one; and what a node says
outlives the attempt it said it in."""

from __future__ import annotations

import sys

import pytest

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
from checkpoint_sets import NodeWord, carried, left_out
from folder_commit import FolderCommits

# Times in seconds. A DCP save of step-60: both ranks close their shard at about 99, the coordinator (node
# 0) writes `.metadata` at 100; with a 30 s settle the listings come at 130 or later.


def word(written_at: float, *, final: bool = False, pending: dict[str, float] | None = None,
         blind: tuple[tuple[float, float], ...] = ()) -> NodeWord:  # fmt: skip
    return NodeWord(written_at, final, pending or {}, blind)


def timed(files: dict[int, dict[str, float | None]]) -> dict[int, dict[str, tuple[float | None, float]]]:
    """Each file listed at the time given, last written 30 s before (the settle time)."""
    return {node: {name: (at, (at or 0.0) - 30) for name, at in names.items()} for node, names in files.items()}


def dropped(files: dict[int, dict[str, float | None]], words: dict[int, NodeWord]) -> dict[str, set[str]]:
    """Folder -> the names left out (every node's)."""
    return {item.unit: {name for _, name in item.names} for item in left_out(timed(files), words)}


def reasons(files: dict[int, dict[str, float | None]], words: dict[int, NodeWord]) -> dict[str, str]:
    return {item.unit: item.reason for item in left_out(timed(files), words)}


STEP_50 = {"step-50/.metadata": 70.0, "step-50/__0_0.distcp": 70.0}


def test_a_dcp_step_whose_child_was_lost_before_listing_its_shard_is_left_out_and_the_step_before_kept():
    files = {0: {**STEP_50, "step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0},
             1: {"step-50/__1_0.distcp": 68.0}}  # fmt: skip
    words = {0: word(150.0), 1: word(95.0)}  # node 1 closed its shard at 99, lost at 110, before listing it
    assert dropped(files, words) == {"step-60": {"step-60/.metadata", "step-60/__0_0.distcp"}}
    assert reasons(files, words)["step-60"].startswith("node 1 last spoke before it was listed (at 95.0)")


def test_a_dcp_step_every_rank_listed_is_kept_though_a_node_was_lost_since():
    files = {0: {"step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0}, 1: {"step-60/__1_0.distcp": 129.5}}
    assert dropped(files, {0: word(190.0), 1: word(140.0)}) == {}


def test_a_shard_still_settling_on_a_lost_node_leaves_its_step_out():
    files = {0: {"step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0}, 1: {}}
    words = {0: word(190.0), 1: word(120.0, pending={"step-60": 99.0})}
    assert set(dropped(files, words)) == {"step-60"}
    assert reasons(files, words)["step-60"].startswith("node 1 was still writing its part")


def test_a_coordinator_lost_while_its_metadata_settled_leaves_the_step_out():
    # The shards closed at 99 and 103, `.metadata` at 104: node 0 holds step-60/ until `.metadata` settles
    # (folder_commit.py), and was lost before; node 1 listed its shard at 133.
    files = {0: dict(STEP_50), 1: {"step-60/__1_0.distcp": 133.0}}
    words = {0: word(120.0, pending={"step-60": 99.0}), 1: word(200.0)}
    assert dropped(files, words) == {"step-60": {"step-60/__1_0.distcp"}}


def test_a_node_that_listed_its_part_of_a_save_vouches_for_it_and_one_that_did_not_takes_the_save_out():
    # Node 1 listed its shard at 133 and last spoke at 135; node 0's part came at 140.
    files = {0: {"step-60/.metadata": 140.0, "step-60/__0_0.distcp": 140.0}, 1: {"step-60/__1_0.distcp": 133.0}}
    assert dropped(files, {0: word(150.0), 1: word(135.0)}) == {}
    # A third node that last spoke at 135 and listed nothing of it: the whole save goes, node 1's shard too.
    words = {0: word(150.0), 1: word(135.0), 2: word(135.0)}
    assert dropped({**files, 2: {}}, words) == {
        "step-60": {"step-60/.metadata", "step-60/__0_0.distcp", "step-60/__1_0.distcp"}
    }


RUN = "rsl_rl/anymal/2026-11-29_01-00-00"


def test_an_rsl_rl_run_folder_keeps_its_models_when_the_saving_node_was_writing_one_at_a_stop():
    # Isaac Lab: CHECKPOINT_DIR is logs/; rank 0 saves model_N.pt and keeps the event file open in the run
    # folder; every rank writes the run's params/. At the stop both nodes' final walks found node 0 still
    # writing the run folder (the event file, a model settling).
    params = {f"{RUN}/params/env.yaml": 5.0, f"{RUN}/params/agent.yaml": 5.0}
    files = {0: {**params, f"{RUN}/model_100.pt": 40.0, f"{RUN}/model_200.pt": 80.0}, 1: dict(params)}
    words = {0: word(120.0, final=True, pending={RUN: 110.0}), 1: word(119.0, final=True)}
    assert dropped(files, words) == {}


def test_a_killed_child_costs_a_run_folder_only_the_models_listed_after_its_last_word():
    files = {0: {f"{RUN}/model_100.pt": 40.0, f"{RUN}/model_200.pt": 80.0, f"{RUN}/model_300.pt": 118.0}, 1: {}}
    words = {0: word(125.0, final=True), 1: word(85.0)}  # node 1 lost at 90
    assert dropped(files, words) == {RUN: {f"{RUN}/model_300.pt"}}


def test_a_stopped_childs_final_word_vouches_for_what_was_listed_after_it():
    # A stop: the child's trainer had ended when its final walk began at 120; rank 0 listed its newest
    # folder at 125, after an upload. Nothing of the child's can be part of it.
    files = {0: {"checkpoint-20/model.safetensors": 125.0, "checkpoint-20/trainer_state.json": 125.0}, 1: {}}
    assert dropped(files, {0: word(126.0, final=True), 1: word(120.0, final=True)}) == {}
    assert set(dropped(files, {0: word(126.0, final=True), 1: word(120.0)})) == {"checkpoint-20"}


def test_a_node_that_never_wrote_a_save_of_that_kind_vouches_once_one_was_listed_before():
    # Trainer saves checkpoint-N/ from rank 0 alone, here on node 1; node 0 was lost at 120, before
    # checkpoint-20/ was listed. Its first save, with nothing before it to tell, is in doubt.
    files = {1: {"checkpoint-10/model.safetensors": 60.0, "checkpoint-20/model.safetensors": 125.0}, 0: {}}
    assert dropped(files, {1: word(130.0), 0: word(120.0)}) == {}
    assert set(dropped({1: {"checkpoint-10/model.safetensors": 125.0}, 0: {}}, {1: word(130.0), 0: word(120.0)})) == {
        "checkpoint-10"
    }
    # A node that wrote a step before, or is writing one, is asked.
    dcp = {0: {**STEP_50, "step-60/.metadata": 131.0}, 1: {}}
    assert set(dropped(dcp, {0: word(140.0), 1: word(95.0, pending={"step-55": 90.0})})) == {"step-60"}


def test_a_deepspeed_folder_goes_with_its_global_step_folder():
    files = {
        0: {
            "checkpoint-4/trainer_state.json": 131.0,
            "checkpoint-4/global_step4/zero_pp_rank_0_optim_states.pt": 131.0,
        },
        1: {},
    }
    assert set(dropped(files, {0: word(140.0), 1: word(95.0)})) == {"checkpoint-4", "checkpoint-4/global_step4"}


def test_a_folder_every_node_saves_into_loses_only_its_newest_saves():
    # Every rank saves ckpt/step<N>_rank<R>.pt every 30 s; node 1 was lost at 110.
    files = {
        0: {"ckpt/step40_rank0.pt": 40.0, "ckpt/step70_rank0.pt": 70.0, "ckpt/step100_rank0.pt": 101.0,
            "ckpt/step130_rank0.pt": 131.0},
        1: {"ckpt/step40_rank1.pt": 40.5, "ckpt/step70_rank1.pt": 70.5, "ckpt/step100_rank1.pt": 100.5},
    }  # fmt: skip
    assert dropped(files, {0: word(140.0), 1: word(105.0)}) == {"ckpt": {"ckpt/step130_rank0.pt"}}


def test_a_folder_a_node_left_unfinished_is_left_out_only_for_what_was_listed_while_it_wrote():
    # Node 0 was writing ckpt/ from 80 when attempt 1 ended; attempt 2 began at 200 with rank 0 on node 1.
    after = carried(word(120.0, pending={"ckpt": 80.0}), 200.0)
    assert after.unfinished == (("ckpt", 80.0, 200.0),) and after.blind == ((120.0, 200.0),)
    node_0 = NodeWord(300.0, False, {}, after.blind, after.unfinished)
    files = {0: {"ckpt/model_1.pt": 40.0}, 1: {"ckpt/model_2.pt": 95.0, "ckpt/model_3.pt": 260.0}}
    # model_2, listed by node 1 while node 0 was writing, is left out; model_1 before it and model_3 after stay.
    assert dropped(files, {0: node_0, 1: word(310.0)}) == {"ckpt": {"ckpt/model_2.pt"}}


def test_a_save_listed_while_a_node_was_between_attempts_is_left_out():
    after = carried(word(95.0), 200.0)
    node_1 = NodeWord(260.0, False, {}, after.blind, after.unfinished)
    files = {0: {**STEP_50, "step-60/.metadata": 131.0}, 1: {"step-50/__1_0.distcp": 68.0}}
    assert set(dropped(files, {0: word(140.0), 1: node_1})) == {"step-60"}
    assert "node 1 was not watching its folder then" in reasons(files, {0: word(140.0), 1: node_1})["step-60"]


def test_no_span_is_blind_after_a_final_word_and_memory_is_bounded():
    assert carried(word(95.0, final=True), 200.0).blind == ()
    previous = NodeWord(0.0)
    for attempt in range(1, 40):
        pending = {f"s-{attempt}": attempt * 10.0 - 5}
        previous = carried(NodeWord(attempt * 10.0, False, pending, previous.blind, previous.unfinished),
                           attempt * 10.0 + 5)  # fmt: skip
    assert len(previous.blind) == 20 and previous.blind[-1] == (390.0, 395.0)
    assert len(previous.unfinished) == 39 and previous.unfinished[-1] == ("s-39", 385.0, 395.0)


def test_files_in_the_checkpoint_folder_itself_are_never_left_out():
    files = {0: {"snapshot.pt": 125.0, "checkpoint-3.pt": 125.0}, 1: {}}
    assert dropped(files, {0: word(130.0), 1: word(10.0, pending={"step-9": 5.0})}) == {}


def test_manifests_from_before_sets_ask_nothing_and_a_node_with_no_manifest_wrote_nothing():
    files = {0: {"step-60/__0_0.distcp": None}, 1: {"step-60/__1_0.distcp": 131.0}}
    assert dropped(files, {0: NodeWord(), 1: word(140.0)}) == {}
    assert dropped({0: {"step-60/.metadata": 131.0}, 1: {}}, {0: word(140.0), 1: NodeWord()}) == {}
    assert dropped({0: {"step-60/.metadata": 131.0}, 1: {}}, {0: word(140.0)}) == {}


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


TRAINER_30 = {"checkpoint-30/model.safetensors": 1070.0, "checkpoint-30/trainer_state.json": 1070.0,
              "checkpoint-30/rng_state_0.pth": 1070.0}  # fmt: skip


def test_a_trainer_folder_every_rank_wrote_its_rng_state_into_is_one_save():
    # Trainer: every rank writes checkpoint-N/rng_state_<R>.pth at once; rank 0 finishes the weights much
    # later. Node 1 listed its RNG state at 1031 and was lost at 1065; node 0 listed the rest at 1070.
    files = {0: {"checkpoint-20/model.safetensors": 700.0, **TRAINER_30}, 1: {"checkpoint-30/rng_state_1.pth": 1031.0}}
    assert dropped(files, {0: word(1080.0), 1: word(1060.0)}) == {}
    # Node 0 lost while still writing it: the whole folder goes, node 1's RNG state too, whenever the
    # writing began (a folder holding one save never comes back in part).
    files = {0: {"checkpoint-20/model.safetensors": 700.0}, 1: {"checkpoint-30/rng_state_1.pth": 1031.0}}
    for since in (1001.0, 1050.0):
        left = dropped(files, {0: word(1090.0, pending={"checkpoint-30": since}), 1: word(1095.0)})
        assert left == {"checkpoint-30": {"checkpoint-30/rng_state_1.pth"}}


def test_a_node_silent_since_before_an_earlier_save_of_the_kind_is_still_asked():
    # Node 1's syncs failed from 50 on: it never listed a step, but was not looking when step-50 was listed.
    files = {0: {**STEP_50, "step-60/.metadata": 131.0, "step-60/__0_0.distcp": 131.0}, 1: {}}
    assert set(dropped(files, {0: word(140.0), 1: word(50.0)})) == {"step-50", "step-60"}
    assert dropped(files, {0: word(140.0), 1: word(100.0)}) == {}  # looking then: it writes no step


def test_save_folders_inside_each_other_go_together_either_way():
    files = {
        0: {"checkpoint-4/trainer_state.json": 131.0, "checkpoint-4/global_step4/mp_rank_00_model_states.pt": 131.0},
        1: {"checkpoint-4/global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt": 129.0},
    }
    words = {0: word(140.0), 1: word(135.0, pending={"checkpoint-4/global_step4": 125.0})}
    assert set(dropped(files, words)) == {"checkpoint-4", "checkpoint-4/global_step4"}
