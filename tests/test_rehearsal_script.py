"""The reference script's options for the fault catalog (examples/rehearsal/train.py), each helper alone: a
whole distributed run is the catalog's (`make faults`), which takes far longer than a unit test."""

from __future__ import annotations

import functools
import importlib.util
import resource
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness import ROOT


@functools.cache
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rehearsal_train", ROOT / "examples" / "rehearsal" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_options_keep_the_old_behaviour_unless_given():
    defaults = script().options([])
    assert (defaults.fail_at_step, defaults.silent_save_seconds, defaults.compile_seconds) == (None, 0.0, 0.0)
    given = script().options(["--fail-at-step", "30", "--silent-save-seconds", "40", "--compile-seconds", "90"])
    assert (given.fail_at_step, given.silent_save_seconds, given.compile_seconds) == (30, 40.0, 90.0)


def test_fail_at_step_is_a_plain_error_of_the_users_code_at_that_step_only():
    for step in (1, 29, 31):
        script().check_batch(step, 30)
    script().check_batch(30, None)
    with pytest.raises(ValueError, match="step 30: "):
        script().check_batch(30, 30)


def test_a_silent_save_writes_the_whole_file_in_pieces_over_its_seconds(tmp_path, capsys):
    data = bytes(range(256)) * 400
    target = tmp_path / ".checkpoint-10.pt.partial"
    sizes: list[int] = []

    def watch() -> None:
        for _ in range(8):
            time.sleep(0.1)
            sizes.append(target.stat().st_size if target.exists() else 0)

    watcher = threading.Thread(target=watch)
    started = time.monotonic()
    watcher.start()
    script().write_slowly(target, data, 1.0)
    took = time.monotonic() - started
    watcher.join()
    assert target.read_bytes() == data and 1.0 <= took < 3
    # Part of the file was there while it was written: the save takes its time, it does not wait and dump.
    assert any(0 < size < len(data) for size in sizes)
    assert capsys.readouterr() == ("", "")


def test_compile_workers_burn_cpu_in_a_silent_child_the_rank_waits_for(capfd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    script().compile_workers(1.5)
    took = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    burned = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # A tenth of its time on a CPU: a child that slept would spend only its start-up (a few hundredths of a
    # second); a loaded machine (CI with a second suite beside it) gave the burner a quarter of a core.
    assert took >= 1.5 and burned >= 0.15
    assert capfd.readouterr() == ("", "")


def test_the_stall_hook_is_the_rehearsals_alone_and_names_one_local_rank(tmp_path: Path):
    stalled = script().stalled
    stall = tmp_path / "rehearsal-stall"
    assert not stalled({"LOCAL_RANK": "0"})  # not rehearsed: no variable
    assert not stalled({"REHEARSAL_STALL_FILE": str(stall), "LOCAL_RANK": "0"})  # no fault yet
    stall.write_text("0\n")
    assert stalled({"REHEARSAL_STALL_FILE": str(stall), "LOCAL_RANK": "0"})
    assert not stalled({"REHEARSAL_STALL_FILE": str(stall), "LOCAL_RANK": "1"})
    stall.write_text("")
    assert stalled({"REHEARSAL_STALL_FILE": str(stall)})
