"""Each DDP rank's compute time before its first gradient collective of every step, measured without a line
of the training script: the straggler watch's signal (straggler_score.py says how it is judged).

`install()` runs in every training process (the launcher puts inject/sitecustomize.py first on its
PYTHONPATH and names STRAGGLER_TIMING_DIR). It imports nothing: it waits for the script to import
`torch.nn.parallel.distributed`, then wraps `DistributedDataParallel`:

- the first `forward` after the previous step's first collective starts the step's clock (with gradient
  accumulation under `no_sync()`, that is the first micro-batch's);
- the first communication hook call of the step (DDP calls a hook per gradient bucket, the first once the
  last layers' gradients are ready) stops it. A model without a hook of the script's gets PyTorch's default
  all-reduce hook, wrapped; a hook the script registers is wrapped instead, and called as it was.

On a GPU (the model's DDP `device_type` is "cuda") the two ends are CUDA events on the rank's stream, read
without waiting once they completed: the GPU's time for the work, not the CPU's time to queue it. On a CPU,
the process's clock. Every `STRAGGLER_WINDOW_SECONDS` (60) a rank appends one line to `rank-<RANK>.txt` in
that folder: the wall time, the window's median, its sample count and its largest sample. What it cannot
see: FSDP and other wrappers that are not DDP, DDP under `torch.compile` (the wrapped forward breaks the
graph there), and DDP with a built-in C++ hook (`_register_builtin_comm_hook`); those ranks write nothing.
A script that registers its hook only after the model's first forward gets DDP's "can only be called once"
error, as it would after registering any hook. Python 3.10, stdlib (torch only through the script's own
import).
"""

from __future__ import annotations

import atexit
import functools
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

    def collective(self) -> None:
        if self.started is None:
            return  # a later bucket of the same step
        if isinstance(self.started, float):
            self.samples.append(time.perf_counter() - self.started)
        elif self.gpu_event is not None:
            end = self.gpu_event()
            end.record()
            self.queued = [*self.queued[-MAX_QUEUED + 1 :], (self.started, end)]
        self.started = None
        if self.clock() - self.window_began >= self.window_seconds:
            self.flush()

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


def timed(hook: Callable[[Any, Any], Any], clock: StepClock) -> Callable[[Any, Any], Any]:
    @functools.wraps(hook)  # keeps the name DDP logs and checks, and the signature it validates
    def timed_hook(state: Any, bucket: Any) -> Any:
        clock.collective()
        return hook(state, bucket)

    return timed_hook


def patch(module: ModuleType, clock: StepClock) -> None:
    """Wrap `module.DistributedDataParallel` (torch.nn.parallel.distributed) to feed `clock`."""
    ddp = module.DistributedDataParallel
    register, forward = ddp.register_comm_hook, ddp.forward

    def register_comm_hook(self: Any, state: Any, hook: Callable[[Any, Any], Any]) -> None:
        self._step_timing_hooked = True
        register(self, state, timed(hook, clock))

    def register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        self._step_timing_hooked = True  # a C++ hook: nothing to wrap, so this model is not timed
        builtin(self, comm_hook_type)

    def timed_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_step_timing_hooked", False):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            register_comm_hook(self, self.process_group, allreduce_hook)
        if module.torch.is_grad_enabled():  # an evaluation under no_grad starts no step
            clock.forward(on_gpu=getattr(self, "device_type", "") == "cuda")
        return forward(self, *inputs, **kwargs)

    builtin = ddp._register_builtin_comm_hook
    ddp.register_comm_hook = register_comm_hook
    ddp._register_builtin_comm_hook = register_builtin_comm_hook
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
