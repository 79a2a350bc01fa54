"""The per-step timing the launcher installs in training processes (container/launcher/step_timing.py,
inject/sitecustomize.py): a step runs from its first forward to its first gradient; after the warm steps only
the parameters whose gradient came first keep a hook; a script's communication hook is left alone; on a GPU
the stream's time is read without waiting; nothing is timed without the folder; and under torchrun a plain
DDP script with no line about timing reports the rank whose forward is slower, its own hook called as
often as without the timing."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
from step_timing import WARM_STEPS, StepClock, install, patch

PLAIN_DDP = ROOT / "tests" / "fixtures" / "ddp_plain.py"


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_step_runs_from_its_first_forward_to_its_first_collective_and_a_window_is_one_line(tmp_path):
    ticks = Ticks()
    clock = StepClock(str(tmp_path / "rank-0.txt"), 60.0, clock=ticks)
    for _ in range(3):
        clock.forward()
        clock.forward()  # a second micro-batch does not restart the step
        clock.collective()
        clock.collective()  # the step's later buckets add nothing
    assert len(clock.samples) == 3 and not (tmp_path / "rank-0.txt").exists()
    ticks.now = 60.0
    clock.forward()
    clock.collective()
    _, middle, count, _ = (tmp_path / "rank-0.txt").read_text().split()
    assert count == "4" and float(middle) >= 0 and clock.samples == []


class FakeEvent:
    """torch.cuda.Event as the clock uses it: record() marks the stream, query() says whether the GPU got
    there, elapsed_time() is in milliseconds. Here the GPU reaches an event when `done` says so."""

    gpu_time = 0.0  # the stream's clock, seconds

    def __init__(self) -> None:
        self.at: float | None = None
        self.done = False

    def record(self) -> None:
        self.at = FakeEvent.gpu_time

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done, "read before the GPU completed it: that would wait"
        return (end.at - self.at) * 1000


def test_on_a_gpu_a_step_is_the_streams_time_read_without_waiting(tmp_path):
    events: list[FakeEvent] = []

    def event() -> FakeEvent:
        events.append(FakeEvent())
        return events[-1]

    clock = StepClock(str(tmp_path / "rank-0.txt"), 60.0, clock=Ticks(), gpu_event=event)
    FakeEvent.gpu_time = 1.0
    clock.forward(on_gpu=True)
    FakeEvent.gpu_time = 1.25  # the GPU's work up to the first bucket: 250 ms, whatever the CPU did meanwhile
    clock.collective()
    clock.forward(on_gpu=True)  # the next step: its events are queued, the first pair not complete yet
    assert clock.samples == [] and len(clock.queued) == 1
    clock.collective()
    events[0].done = events[1].done = True
    clock.forward(on_gpu=True)
    assert clock.samples == [0.25] and len(clock.queued) == 1  # the second step waits for its end event
    clock.forward(on_gpu=True)  # a second micro-batch: the step has begun already
    assert len(events) == 5


class FakeParameter:
    """What the watch uses of a parameter: requires_grad and register_hook, whose handle removes the hook."""

    def __init__(self, requires_grad: bool = True) -> None:
        self.requires_grad = requires_grad
        self.hooks: list[Any] = []

    def register_hook(self, hook: Any) -> Any:
        self.hooks.append(hook)
        return types.SimpleNamespace(remove=lambda: self.hooks.remove(hook))

    def gradient(self) -> None:
        for hook in list(self.hooks):
            assert hook("gradient") is None  # the gradient is left as it is


class FakeDDP:
    """What patch() relies on in torch's DistributedDataParallel: forward, and the wrapped module."""

    def __init__(self, parameters: list[FakeParameter]) -> None:
        self.module = types.SimpleNamespace(parameters=lambda: iter(parameters))
        self.comm_hooks: list[Any] = []

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        self.comm_hooks.append((state, hook))

    def forward(self, value: int) -> int:
        return value + 1


def fake_torch(tmp_path: Path) -> tuple[type[FakeDDP], StepClock]:
    module = types.ModuleType("fake_distributed")
    module.DistributedDataParallel = type("DDP", (FakeDDP,), {})  # type: ignore[attr-defined]
    module.torch = types.SimpleNamespace(is_grad_enabled=lambda: True)  # type: ignore[attr-defined]
    clock = StepClock(str(tmp_path / "rank-0.txt"), 60.0)
    patch(module, clock)
    return module.DistributedDataParallel, clock  # type: ignore[attr-defined]


def test_the_first_gradient_ends_a_step_and_only_the_first_parameters_keep_their_hooks(tmp_path):
    ddp_class, clock = fake_torch(tmp_path)
    first, second, frozen = FakeParameter(), FakeParameter(), FakeParameter(requires_grad=False)
    model = ddp_class([second, first, frozen])
    for step in range(WARM_STEPS + 5):
        assert model.forward(step) == step + 1
        first.gradient()  # the last layer's gradient comes first in the backward
        second.gradient()
    assert len(clock.samples) == WARM_STEPS + 5  # one sample a step, not one per gradient
    assert len(first.hooks) == 1 and second.hooks == [] and frozen.hooks == []


def test_a_communication_hook_of_the_scripts_is_left_alone(tmp_path):
    ddp_class, clock = fake_torch(tmp_path)
    parameter = FakeParameter()
    model = ddp_class([parameter])

    def own(state: Any, bucket: Any) -> str:
        return "future"

    model.register_comm_hook("mine", own)
    model.forward(1)
    parameter.gradient()
    assert model.comm_hooks == [("mine", own)] and len(clock.samples) == 1


def test_nothing_is_timed_without_the_folder():
    before = list(sys.meta_path)
    assert install({}) is False and sys.meta_path == before


def test_a_plain_ddp_script_reports_the_rank_whose_forward_is_slower_and_keeps_its_own_hook(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "container" / "launcher" / "inject"),
        "STRAGGLER_TIMING_DIR": str(tmp_path),
        "STRAGGLER_WINDOW_SECONDS": "0.5",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(PLAIN_DDP)]
    done = subprocess.run([*command, "--delay", "0.05", "--steps", "20", "--own-hook"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    # The script's own communication hook runs as it would without the timing: once a step (one bucket).
    assert "rank 0: own hook called 20 times" in done.stdout and "rank 1: own hook called 20 times" in done.stdout
    medians = {}
    for rank in (0, 1):
        lines = [line.split() for line in (tmp_path / f"rank-{rank}.txt").read_text().splitlines()]
        assert sum(int(count) for _, _, count, _ in lines) == 20  # every step, evaluations not counted
        medians[rank] = sorted(float(middle) for _, middle, _, _ in lines)[len(lines) // 2]
    assert medians[1] - medians[0] >= 0.04, medians
