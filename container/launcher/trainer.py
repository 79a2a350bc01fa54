"""Rendezvous and run the trainer: torchrun (or `$PYTHON -m torch.distributed.run`, so Isaac Sim's
python.sh works) on the script and its arguments. A single node without checkpoints becomes torchrun
(exec); otherwise the trainer runs as a child. On Batch its output passes through a relay
(progress_watch.py relay) that keeps the last bytes of each stream, so that a failed trainer's error can
be quoted, and, when the hang watch is on, stamps the time of its last output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ending import COMMAND_NOT_FOUND_EXIT
from node_state import NodeState
from node_tools import helper, say
from watchers import OUTPUT_MARK


def command(node: NodeState, script: Sequence[str]) -> list[str]:
    settings = node.settings
    return [*settings.runner, *settings.rendezvous_args(), *script]


def announce(node: NodeState, line: Sequence[str]) -> None:
    settings, batch = node.settings, node.settings.batch
    shown = " ".join(line)
    if batch is None:
        say(f"single node, {settings.nproc} processes: {shown}")
    else:
        say(
            f"node {batch.index} of {batch.nodes} (rank {batch.node_rank}, main {batch.main}), {settings.nproc}"
            f" processes, rendezvous {batch.address}:{settings.port} id {settings.job_id}: {shown}"
        )


def become_trainer(line: Sequence[str]) -> int:
    """The launcher's process becomes torchrun: nothing is left to do after it."""
    sys.stderr.flush()
    # Python ignores these; a shell would hand torchrun their defaults.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(line[0], list(line))  # noqa: S606 - the job's own command
    except OSError as error:
        say(f"cannot run {line[0]}: {error}")
    return COMMAND_NOT_FOUND_EXIT


def _relay(node: NodeState, fd: int, progress: Path | None) -> subprocess.Popen[bytes]:
    relay = helper(node.settings.python.stdlib, "progress_watch.py", "relay", "--fd", str(fd))
    relay += ["--tail", str(node.folder() / f"tail-{fd}")]
    relay += ["--mark", str(progress / OUTPUT_MARK)] if progress is not None else []
    process = subprocess.Popen(relay, stdin=subprocess.PIPE)
    node.relays.append(process)
    return process


def start_trainer(
    node: NodeState, line: Sequence[str], progress: Path | None, extra_env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """The trainer, with `extra_env` added to this launcher's environment (the straggler watch's timing)."""
    env = {**os.environ, **extra_env} if extra_env else None
    if progress is None and node.settings.batch is None:
        return subprocess.Popen(list(line), stdin=subprocess.DEVNULL, env=env)
    relays = (_relay(node, 1, progress), _relay(node, 2, progress))
    try:
        return subprocess.Popen(
            list(line), stdin=subprocess.DEVNULL, stdout=relays[0].stdin, stderr=relays[1].stdin, env=env
        )
    finally:
        # The relays end when the trainer and everything it started close the pipes.
        for relay in relays:
            if relay.stdin is not None:
                relay.stdin.close()
