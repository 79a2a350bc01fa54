"""A node's life, phase by phase: settings, listener, preflight, the job's code, restore, rendezvous
and training under supervision, judging a failure (failure_phase.py: this node's hardware and, on the
main node, every child's word), the last upload and the take-out. Each phase is a module beside this
one; what ends the node is decided in ending.py from what the phases observed.

    distributed_run.sh train.py --flag value      (the shim beside this folder runs this package)

The variables, the helpers and the exit codes: docs/health.md, docs/checkpoints.md, docs/workdir.md;
ending.py lists the exit codes."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence

import ending
from arguments import expand
from ending import Ending, Outcome
from failure_phase import judge_failure, seconds
from job_code import fetch_job_code
from node_settings import BadInput, read_settings
from node_state import EndNode, NodeState
from node_tools import count_accelerators, kill_tree, own_address, say
from preflight_phase import PreflightResult, export_socket_interface, run_preflight
from restore_phase import Restored, restore
from stop_signals import StopSignals, mark_stopping
from trainer import announce, become_trainer, command, start_trainer
from watchers import (
    progress_dir,
    start_cold_start,
    start_copier,
    start_hang_watch,
    start_listener,
    start_straggler_watch,
)

REPORT_POLL_SECONDS = 0.2
# After a child's word or a hang verdict stopped the trainer: how long it gets before it is killed
# (TRAINER_STOP_SECONDS).
STOP_KILL_SECONDS = 20.0


def _say(result: Ending) -> Ending:
    if result.line:
        say(result.line)
    return result


def _before_training(node: NodeState) -> tuple[list[str], Restored | None] | Ending:
    """Preflight, the job's code, restore: the trainer's command line, or the node's ending."""
    settings = node.settings
    start_listener(node)
    preflight_start = time.time()
    checked = run_preflight(node)
    if isinstance(checked, Ending):
        return checked
    preflight_seconds = time.time() - preflight_start
    export_socket_interface(node, checked.socket_interface)
    if ending.preflight_failed(checked.status):
        return _preflight_failed(node, checked)
    if checked.status != 0:
        raise BadInput(f"preflight.py could not check this node (exit {checked.status}, see above)")
    fetch_job_code(node)
    restored = restore(node)
    script = expand(settings.script, os.environ, note=say)
    line = command(node, [*script, *(restored.resume if restored else ())])
    announce(node, line)
    start_cold_start(node, preflight_seconds)
    if node.signals.stop_requested:
        say("stopped (SIGTERM) before training started")
        return ending.for_stop_before_training(node.judge_stopped())
    report = node.reported()
    if report is not None:
        return ending.for_report(report)
    return line, restored


def _preflight_failed(node: NodeState, checked: PreflightResult) -> Ending:
    # A child reports first and only then asks its host for the take-out: the host stops taking tasks
    # and powers off once the marker exists, and the main node must hear why before that.
    node.last_error = checked.last_error
    if node.settings.batch is not None and node.settings.batch.report_to is not None:
        text = checked.last_error or f"preflight exit {checked.status}"
        taken_out = checked.status == ending.NODE_FAULT_EXIT
        node.tell_main(checked.status, f"{text}; {ending.TAKEN_OUT}" if taken_out else text)
    return ending.for_preflight(checked.status, checked.last_error)


def _wait_trainer(node: NodeState, trainer: subprocess.Popen[bytes]) -> int:
    """The trainer's exit status. Once a report stopped it (SIGTERM), it gets TRAINER_STOP_SECONDS before its
    processes are killed: torchrun may sit in its exit barrier, or a rank in a collective, for minutes."""
    grace = seconds(node, "TRAINER_STOP_SECONDS", STOP_KILL_SECONDS)
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return ending.exit_status(trainer.wait(timeout=REPORT_POLL_SECONDS))
        reported = node.signals.reported_at
        if reported is not None and time.monotonic() - reported >= grace:
            say(f"the trainer did not stop within {grace:g} s of the report; killing it")
            kill_tree(trainer.pid)
            return ending.exit_status(trainer.wait())


def _train(node: NodeState, line: list[str], restored: Restored | None) -> Ending:
    settings = node.settings
    progress = progress_dir(node)
    timing = start_straggler_watch(node, restored)
    try:
        trainer = start_trainer(node, line, progress, timing)
    except OSError as error:
        # As a shell reports a command it cannot run (the trainer's, or its output relay's).
        say(f"cannot run {error.filename or line[0]}: {error.strerror or error}")
        if restored is not None:
            shutil.rmtree(restored.state, ignore_errors=True)
        return Ending(ending.COMMAND_NOT_FOUND_EXIT)
    stopping = restored.state / "stopping" if restored else None
    node.signals.supervise(trainer.pid, stopping)
    copier = start_copier(node, restored, trainer.pid)
    start_hang_watch(node, progress, restored, trainer.pid)
    status = _wait_trainer(node, trainer)
    failed_at = time.monotonic()
    # A child's word or a hang verdict that stopped the trainer decides, whatever the trainer then returned.
    reported = node.signals.fault_reported
    if status != 0 or reported:
        # A crash counts back from its own time, like a stop.
        mark_stopping(stopping)
    hardware_fault = stopped_fault = ""
    verdict: Ending | None = None
    if node.signals.stop_requested:
        stopped_fault = node.judge_stopped()
    elif status != 0 or reported:
        verdict, hardware_fault = judge_failure(node, status, reported=reported, failed_at=failed_at)
    elif not settings.is_main:
        node.tell_main(0, "its trainer succeeded", wait=False)
    upload_failed = False
    if restored is not None:
        (restored.state / "status.tmp").write_text(f"{status}\n")
        os.replace(restored.state / "status.tmp", restored.state / "status")
        # A copier that could not start uploaded nothing: as failed as one that gave up.
        upload_failed = copier is None or ending.exit_status(copier.wait()) != 0
        shutil.rmtree(restored.state, ignore_errors=True)
        if upload_failed:
            say(f"final checkpoint upload to {restored.uri} FAILED; results of this attempt are only on this node")
    if verdict is not None:
        return verdict
    outcome = Outcome(status, node.reported() if reported else None, hardware_fault, stopped_fault, upload_failed)
    return ending.after_training(outcome)


def run(node: NodeState) -> Ending:
    prepared = _before_training(node)
    if isinstance(prepared, Ending):
        return _say(prepared)
    line, restored = prepared
    # From here on, a child's failure is judged after its trainer exits.
    node.training_started = True
    if node.settings.batch is None and restored is None:
        return Ending(become_trainer(line))
    return _say(_train(node, line, restored))


def main(args: Sequence[str], *, signals: StopSignals, started: float) -> int:
    """The node's life; its end in this order: the helpers stop (as the container's end would stop
    them), a child that ends before training tells the main node why, and the take-out marker comes
    last, so that the host takes the node out only once this container's exit is on its way to Batch."""
    node: NodeState | None = None
    result = Ending(1)
    try:
        settings = read_settings(args, os.environ, accelerators=count_accelerators, own_address=own_address)
        node = NodeState(settings=settings, signals=signals, started=started)
        result = run(node)
    except BadInput as error:
        result = _failed(node, str(error), ending.BAD_INPUT_EXIT)
    except EndNode as end:
        result = Ending(end.code)
    except OSError as error:
        result = _failed(node, str(error), 1)
    finally:
        if node is not None:
            node.stop_helpers()
            if ending.child_tells_main(
                status=result.code,
                is_child=not node.settings.is_main,
                training_started=node.training_started,
                told=node.told_main,
                stopped=node.signals.stop_requested,
            ):
                code = ending.child_code(result.code, training_started=False)
                node.tell_main(code, node.last_error or f"launcher exited {result.code} before the rendezvous")
            if result.mark:
                node.mark(result.mark)
    return result.code


def _failed(node: NodeState | None, message: str, code: int) -> Ending:
    say(message)
    if node is not None:
        node.last_error = message
    return Ending(code)
