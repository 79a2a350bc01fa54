"""What the launcher asks of this node's tools: its name and address, its accelerators, and the
helpers beside this file, each run with its own interpreter. Every look-up goes through PATH, as on
the images, so that the rehearsal's stand-ins (hostname, nvidia-smi, neuron-ls) answer."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from checkpoint_commit import process_tree
from node_settings import NAME, BadInput

HERE = Path(__file__).resolve().parent
NC_COUNT = re.compile(r'"nc_count": *([0-9]+)')


def say(message: str) -> None:
    """One line on stderr, prefixed as every launcher line is (trainctl why and the alerts look for it)."""
    print(f"{NAME}: {message}", file=sys.stderr, flush=True)


def _output(command: Sequence[str]) -> str:
    try:
        return subprocess.run(list(command), capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def hostname() -> str:
    return _output(["hostname"]).strip()


def own_address() -> str:
    words = _output(["hostname", "-I"]).split()
    if not words:
        raise BadInput("cannot find this node's private IPv4 address (hostname -I); set MASTER_ADDR")
    return words[0]


def count_accelerators() -> int:
    """The GPUs nvidia-smi lists, else the NeuronCores of every Neuron device, else 1."""
    if shutil.which("nvidia-smi"):
        gpus = sum(1 for line in _output(["nvidia-smi", "--list-gpus"]).splitlines() if line.startswith("GPU "))
        if gpus > 0:
            return gpus
    if shutil.which("neuron-ls"):
        # Every device's "nc_count", wherever neuron-ls nests it.
        cores = sum(int(n) for n in NC_COUNT.findall(_output(["neuron-ls", "--json-output"])))
        if cores > 0:
            return cores
    return 1


def helper(python: str, name: str, *args: str) -> list[str]:
    """The command line of a helper script beside this file."""
    return [python, str(HERE / name), *args]


def run_helper(
    python: str, name: str, *args: str, capture: bool = False, to_stderr: bool = False
) -> subprocess.CompletedProcess[str]:
    """Runs a helper to its end; with capture its stdout is returned (else it goes to this stdout, or
    with to_stderr to this stderr); its stderr passes through."""
    stdout = subprocess.PIPE if capture else (sys.stderr if to_stderr else None)
    try:
        return subprocess.run(helper(python, name, *args), stdout=stdout, text=True, check=False)
    except OSError as error:
        say(f"cannot run {name} with {python}: {error}")
        return subprocess.CompletedProcess(helper(python, name, *args), 127, "", "")


def run_helper_until(python: str, name: str, *args: str, stop: Callable[[], bool], grace: float) -> int:
    """Runs a helper (its output to this stderr) to its end, or until `grace` seconds after `stop()` first
    holds, whichever comes first; its exit status (-SIGTERM when it was cut short)."""
    try:
        process = subprocess.Popen(helper(python, name, *args), stdout=sys.stderr)
    except OSError as error:
        say(f"cannot run {name} with {python}: {error}")
        return 127
    deadline: float | None = None
    while process.poll() is None:
        if deadline is None and stop():
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() >= deadline:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                return process.wait(5)
            process.kill()
            return process.wait()
        time.sleep(0.1)
    return process.returncode


def kill_tree(root: int) -> None:
    """SIGKILL `root` and every process below it (torchrun's workers live in sessions of their own)."""
    for _ in range(5):
        pids = process_tree(root)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
