"""When the copier lists a folder's files (container/launcher/folder_commit.py), on recorded syncs: a folder
written file by file is listed whole or not at all, an open event file never holds its folder, a file at
the top is its own unit, and a log that never settles stops holding its folder back after a while."""

from __future__ import annotations

import sys

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
from folder_commit import FolderCommits, unit_of


def sync(
    folders: FolderCommits[str],
    now: float,
    *,
    ready: dict[str, str],
    unsettled: tuple[str, ...] = (),
    committable: tuple[str, ...] = (),
    writing: tuple[str, ...] = (),
    created: dict[str, int] | None = None,
) -> tuple[dict[str, str], bool]:
    """One sync as checkpoint_sync.py runs it: (what it lists, whether removals are held back). Files not
    in `created` count as created together when this sync first saw them."""
    folders.begin()
    seen = set(ready) | set(unsettled) | set(committable) | set(writing) | set(folders.staged)
    for name in sorted(seen):
        folders.saw(name, (created or {}).get(name, int(now)))
    for name in unsettled:
        folders.unsettled(name, now)
    for name in writing:
        folders.writing(name, now)
    for name in (*committable, *ready):
        folders.committable(name)
    listed = folders.listable(ready, seen, now)
    return listed, folders.any_blocked(now)


def test_a_trainer_folder_is_listed_only_once_its_last_file_has_settled():
    folders: FolderCommits[str] = FolderCommits(300)
    # model.safetensors has settled and is uploaded; trainer_state.json, written last, has not.
    listed, blocked = sync(
        folders, 100, ready={"checkpoint-500/model.safetensors": "v1"}, unsettled=("checkpoint-500/trainer_state.json",)
    )
    assert listed == {} and blocked
    assert folders.staged == {"checkpoint-500/model.safetensors": "v1"}  # not uploaded again
    listed, blocked = sync(
        folders,
        101,
        ready={"checkpoint-500/model.safetensors": "v1", "checkpoint-500/trainer_state.json": "v2"},
    )
    assert listed == {"checkpoint-500/model.safetensors": "v1", "checkpoint-500/trainer_state.json": "v2"}
    assert not blocked and folders.staged == {}


def test_another_folder_still_being_written_does_not_hold_a_complete_one():
    folders: FolderCommits[str] = FolderCommits(300)
    listed, _ = sync(folders, 100, ready={"step-50/__0_0.distcp": "a"}, unsettled=("step-60/__0_0.distcp",))
    assert listed == {"step-50/__0_0.distcp": "a"}


def test_an_event_file_open_for_the_whole_run_never_holds_its_run_folder():
    folders: FolderCommits[str] = FolderCommits(300)
    events, model = "rsl_rl/run/events.out.tfevents.1", "rsl_rl/run/model_50.pt"
    listed, blocked = sync(folders, 100, ready={model: "m"}, writing=(events,), created={events: 0, model: 90})
    assert listed == {model: "m"} and blocked is False


def test_files_first_seen_together_hold_their_folder_until_the_open_one_has_been_open_for_the_log_time():
    """Without inotify's order (both first seen by one sync), an open file might be the save's next file."""
    folders: FolderCommits[str] = FolderCommits(300)
    events, model = "rsl_rl/run/events.out.tfevents.1", "rsl_rl/run/model_50.pt"
    for now in (100, 250, 399):
        listed, _ = sync(folders, now, ready={model: "m"}, writing=(events,), created={events: 7, model: 7})
        assert listed == {}
    listed, _ = sync(folders, 401, ready={model: "m"}, writing=(events,), created={events: 7, model: 7})
    assert listed == {model: "m"}


def test_a_folder_inside_a_checkpoint_folder_holds_it_while_it_is_held():
    """DeepSpeed under Trainer: checkpoint-N/global_stepN/ holds the shards, checkpoint-N/ the state."""
    folders: FolderCommits[str] = FolderCommits(300)
    state, shard = "checkpoint-7/trainer_state.json", "checkpoint-7/global_step7/mp_rank_00_model_states.pt"
    listed, blocked = sync(folders, 100, ready={state: "s"}, unsettled=(shard,))
    assert listed == {} and blocked
    listed, _ = sync(folders, 101, ready={state: "s", shard: "m"})
    assert listed == {state: "s", shard: "m"}


def test_a_save_still_writing_its_next_file_holds_the_folder_however_long_it_takes():
    """Trainer: the weights are written, settled and uploaded while the optimizer state is still being
    written, longer than the settle time."""
    folders: FolderCommits[str] = FolderCommits(300)
    weights, optimizer = "checkpoint-500/model.safetensors", "checkpoint-500/optimizer.pt"
    created = {weights: 10, optimizer: 20}
    for now in (50, 200, 340):
        listed, blocked = sync(folders, now, ready={weights: "w"}, writing=(optimizer,), created=created)
        assert listed == {} and blocked  # the staged weights also hold back removals
    listed, blocked = sync(folders, 401, ready={weights: "w"}, unsettled=(optimizer,), created=created)
    assert listed == {} and blocked
    listed, _ = sync(folders, 431, ready={weights: "w", optimizer: "o"}, created=created)
    assert listed == {weights: "w", optimizer: "o"}


def test_a_file_directly_in_the_checkpoint_folder_is_a_unit_of_its_own():
    assert unit_of("checkpoint-20.pt") == "checkpoint-20.pt" and unit_of("a/b/c.pt") == "a/b"
    folders: FolderCommits[str] = FolderCommits(300)
    # The reference script's checkpoint, renamed into place beside a metrics file still settling.
    listed, blocked = sync(folders, 100, ready={"checkpoint-20.pt": "c"}, unsettled=("metrics.csv",))
    assert listed == {"checkpoint-20.pt": "c"}
    assert blocked  # a removal still waits for metrics.csv


def test_a_file_that_never_settles_stops_holding_its_folder_after_the_log_time():
    folders: FolderCommits[str] = FolderCommits(300)
    for now in (0, 100, 299):
        listed, blocked = sync(folders, now, ready={"run/model_1.pt": "m"}, unsettled=("run/train.log",))
        assert listed == {} and blocked
    listed, blocked = sync(folders, 301, ready={"run/model_1.pt": "m"}, unsettled=("run/train.log",))
    assert listed == {"run/model_1.pt": "m"} and not blocked


def test_a_break_in_being_unsettled_starts_the_log_time_again():
    folders: FolderCommits[str] = FolderCommits(300)
    sync(folders, 0, ready={}, unsettled=("run/optimizer.pt",))
    sync(folders, 250, ready={}, committable=("run/optimizer.pt",))  # written again: open now
    listed, blocked = sync(folders, 400, ready={"run/model.pt": "m"}, unsettled=("run/optimizer.pt",))
    assert listed == {} and blocked


def test_a_staged_file_that_disappeared_is_forgotten():
    folders: FolderCommits[str] = FolderCommits(300)
    sync(folders, 0, ready={"checkpoint-1/a": "a"}, unsettled=("checkpoint-1/b",))
    folders.begin()
    listed = folders.listable({}, set(), 1)
    assert listed == {} and folders.staged == {} and folders.since == {}
