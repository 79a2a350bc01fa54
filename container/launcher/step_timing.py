"""Each DDP rank's compute time before its first gradient of every step, measured without a line of the
training script: the straggler watch's signal (straggler_score.py says how it is judged).

`install()` runs in every training process (the launcher puts inject/sitecustomize.py first on its
PYTHONPATH and names STRAGGLER_TIMING_DIR). It imports nothing: it waits for the script to import
`torch.nn.parallel.distributed`, then wraps `DistributedDataParallel.forward`:

- a forward with gradients enabled starts the step's clock, unless one is running (a second forward before
  the backward belongs to the same step);
- the first gradient the backward computes stops it: at the model's first forward each parameter that
  needs a gradient gets a hook on it (`Tensor.register_hook`); after 20 steps only those that came first
  keep theirs (the parameters of DDP's first bucket, whose all-reduce starts right after). DDP's own
  all-reduce, and any communication hook of the script's, are left as they are.

With gradient accumulation under `no_sync()` each micro-batch is a step. On a GPU (the model's DDP
`device_type` is "cuda") the two ends are CUDA events on the rank's stream, read without waiting once they
completed: the GPU's time for the work, not the CPU's time to queue it. On a CPU, the process's clock.
Every `STRAGGLER_WINDOW_SECONDS` (60) a rank appends one line to `rank-<RANK>.txt` in that folder: the
wall time, the window's median, its sample count and its largest sample. What it cannot see: FSDP and
other wrappers that are not DDP, and DDP under `torch.compile` (the wrapped forward breaks the graph
there); those ranks write nothing. Python 3.10, stdlib (torch only through the script's own import).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Callable, Sequence
from statistics import median
from types import ModuleType
from typing import Any

TARGET = "torch.nn.parallel.distributed"
WARM_STEPS = 20  # steps after which only the parameters whose gradient came first keep their hooks
MAX_QUEUED = 64  # steps whose GPU events are not read yet: a stream this far behind its CPU is not timed


class StepClock:
    """One rank's samples, written out a window at a time. On a GPU (`gpu_event`, torch.cuda.Event's
    constructor) a step is timed between two events recorded on the rank's stream, read once the second has
    completed (a later step's forward asks, never waiting): kernels run after the CPU has queued them, so
    the CPU's own clock would time the queueing, and a rank that waits for its GPU in between (rank 0 printing
    `loss.item()`) would look slower than it is."""

    def __init__(
        self,
        path: str,
        window_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        gpu_event: Callable[[], Any] | None = None,
    ) -> None:
        self.path = path
        self.window_seconds = window_seconds
        self.clock = clock
        self.gpu_event = gpu_event
        self.started: Any = None  # this step's start (perf_counter, or an event), not yet matched by a collective
        self.queued: list[tuple[Any, Any]] = []  # (start, end) events whose end has not completed yet
        self.samples: list[float] = []
        self.window_began = clock()

    def forward(self, on_gpu: bool = False) -> None:
        if self.started is not None:
            return
        if on_gpu and self.gpu_event is not None:
            self._collect()
            self.started = self.gpu_event()
            self.started.record()
        else:
            self.started = time.perf_counter()

    def collective(self) -> bool:
        """The step's first gradient: close the step (True); False when none is open."""
        if self.started is None:
            return False  # a later gradient of the same step
        if isinstance(self.started, float):
            self.samples.append(time.perf_counter() - self.started)
        elif self.gpu_event is not None:
            end = self.gpu_event()
            end.record()
            self.queued = [*self.queued[-MAX_QUEUED + 1 :], (self.started, end)]
        self.started = None
        if self.clock() - self.window_began >= self.window_seconds:
            self.flush()
        return True

    def _collect(self) -> None:
        """The queued steps whose end event has completed, as samples (elapsed_time is in milliseconds)."""
        try:
            while self.queued and self.queued[0][1].query():
                start, end = self.queued.pop(0)
                self.samples.append(start.elapsed_time(end) / 1000)
        except RuntimeError:  # the CUDA context is going away (at exit): these steps are not timed
            self.queued = []

    def flush(self) -> None:
        self._collect()
        if self.samples:
            line = f"{time.time():.3f} {median(self.samples):.6f} {len(self.samples)} {max(self.samples):.6f}\n"
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(line)
        self.samples = []
        self.window_began = self.clock()


class GradientWatch:
    """One DDP model's parameters, each with a hook on its gradient: the first gradient of a step stops the
    step's clock. After WARM_STEPS steps only the hooks of the parameters that came first in one of them are
    kept (in practice those of DDP's first bucket): a step then costs one or two Python calls."""

    def __init__(self, parameters: list[Any], clock: StepClock) -> None:
        self.clock = clock
        self.firsts: set[int] = set()
        self.steps = 0
        self.handles = [parameter.register_hook(self._on_gradient(i)) for i, parameter in enumerate(parameters)]

    def _on_gradient(self, index: int) -> Callable[[Any], None]:
        def on_gradient(gradient: Any) -> None:
            if not self.clock.collective():
                return  # a later gradient of the same step
            self.firsts.add(index)
            self.steps += 1
            if self.steps == WARM_STEPS:
                for i, handle in enumerate(self.handles):
                    if i not in self.firsts:
                        handle.remove()

        return on_gradient


def patch(module: ModuleType, clock: StepClock) -> None:
    """Wrap `module.DistributedDataParallel` (torch.nn.parallel.distributed) to feed `clock`: its forward starts
    a step, and at the first forward its parameters' gradients get the watch's hooks."""
    ddp = module.DistributedDataParallel
    forward = ddp.forward

    def timed_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        if getattr(self, "_step_timing_watch", None) is None:
            parameters = [p for p in self.module.parameters() if p.requires_grad]
            self._step_timing_watch = GradientWatch(parameters, clock)
        if module.torch.is_grad_enabled():  # an evaluation under no_grad starts no step
            clock.forward(on_gpu=getattr(self, "device_type", "") == "cuda")
        return forward(self, *inputs, **kwargs)

    ddp.forward = timed_forward


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once TARGET has been executed, wherever it was found."""

    def __init__(self, then: Callable[[ModuleType], None]) -> None:
        self.then = then

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute, then = spec.loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            execute(module)
            then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _cuda_event() -> Any:
    import torch  # imported by the script already: a DDP model on a GPU is running

    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def install(environ: dict[str, str] | None = None) -> bool:
    """Time DDP steps in this process when STRAGGLER_TIMING_DIR is set; whether it will."""
    env = os.environ if environ is None else environ
    folder = env.get("STRAGGLER_TIMING_DIR")
    if not folder:
        return False
    os.makedirs(folder, exist_ok=True)
    clock = StepClock(
        os.path.join(folder, f"rank-{env.get('RANK', os.getpid())}.txt"),
        float(env.get("STRAGGLER_WINDOW_SECONDS", "60")),
        gpu_event=_cuda_event,
    )
    atexit.register(clock.flush)  # the last part of a window, when the script ends
    if TARGET in sys.modules:
        patch(sys.modules[TARGET], clock)
    else:
        sys.meta_path.insert(0, _AfterImport(lambda module: patch(module, clock)))
    return True
