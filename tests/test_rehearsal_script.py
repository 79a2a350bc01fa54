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
    assert (defaults.compile_share, defaults.gradients) == (1.0, "ddp")
    given = script().options(["--fail-at-step", "30", "--silent-save-seconds", "40", "--compile-seconds", "90"])
    assert (given.fail_at_step, given.silent_save_seconds, given.compile_seconds) == (30, 40.0, 90.0)
    assert script().options(["--gradients", "allreduce", "--compile-share", "0.25"]).compile_share == 0.25
    with pytest.raises(SystemExit):
        script().options(["--gradients", "fsdp"])


def test_the_step_by_hand_is_sgd_on_the_gradient_summed_over_ranks_and_divided_by_their_number():
    import torch
    import torch.distributed as dist

    train = script()
    # One rank in a process group of its own: the all-reduce sums one gradient, so the step is SGD's.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        before = [parameter.detach().clone() for parameter in model.parameters()]
        model(torch.ones(2, 4)).sum().backward()
        gradients = [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]
        assert len(gradients) == 2 and all(gradient.abs().sum() > 0 for gradient in gradients)
        train.averaged_sgd_step(model, learning_rate=0.5)
    finally:
        dist.destroy_process_group()
    for parameter, old, gradient in zip(model.parameters(), before, gradients, strict=True):
        assert torch.allclose(parameter.detach(), old - 0.5 * gradient)
        assert parameter.grad is None  # zeroed for the next step, as optimizer.zero_grad() does


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


def test_a_compile_worker_given_a_share_of_a_core_sleeps_the_rest():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    script().compile_workers(1.5, 0.25)
    took = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    burned = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # A quarter of 1.5 s is 0.375 s of spinning, which no CPU time can exceed; a whole core would be 1.5 s.
    assert took >= 1.5 and 0.05 <= burned < 0.9


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
