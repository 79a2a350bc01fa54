"""The helpers that watch a node while it runs, each a process of its own beside the trainer:

- the listener (node_fault.py listen, main node of a multi-node job, from the launcher's start, before
  its own preflight): each child's keepalives and ending land in the children folder; a failing ending,
  or a hang verdict, also lands in the report file and SIGUSR1s this launcher;
- the beat (node_fault.py beat, each child, from its launcher's start): "alive" to the listener every
  few seconds, so that the main node can tell a silent (lost) child from a busy one;
- the node watch (node_watch.py, main node, on Batch: AWS_BATCH_JQ_NAME is set on every Batch job): a
  child that dies without a word (killed, image never pulled, host lost) shows FAILED in its node job;
  it asks DescribeJobs every NODE_WATCH_SECONDS (default 15; 0: off), every second once the trainer failed;
- the checkpoint copier (checkpoint_sync.py watch): new complete files to S3 every
  CHECKPOINT_SYNC_SECONDS, the last upload when the trainer ends or is stopped;
- the hang watch (progress_watch.py watch, with HANG_SECONDS > 0 on Batch): progress is the heartbeat
  file, the trainer's output (stamped by the relay, trainer.py), files changing in CHECKPOINT_DIR, the
  ranks' disk I/O and their helper processes' CPU (progress_signals.py); a node with none for HANG_SECONDS
  dumps its ranks' stacks and flight-recorder files and tells the main node;
- the cold-start reporter (cold_start.py, on ECS): one metric line with where the node's first
  minutes went;
- the straggler watch (straggler_watch.py, every node of a multi-node job unless STRAGGLER_WINDOW_SECONDS is
  0): the ranks' step timings (step_timing.py, which the trainer's processes load) each window, to the main
  node, which names a node slower than the others and, with STRAGGLER_ACTION=replace, replaces it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from node_settings import UINT
from node_state import NodeState
from node_tools import HERE, helper
from restore_phase import Restored

HEARTBEAT = "heartbeat"
STRAGGLER_ORDER = "straggler"  # in the launcher's folder: the order to end as the straggler (node_state.py)
STEP_TIMING = "step-timing"  # in the launcher's folder: the ranks' timing lines (step_timing.py)
OUTPUT_MARK = "output"
DEFAULT_PROGRESS_DIR = "/tmp/training-progress"  # noqa: S108 - the container's own scratch space


def start_listener(node: NodeState) -> None:
    """On the main node of a multi-node job: the listener, and on Batch the node watch; on a child, the beat."""
    settings, batch = node.settings, node.settings.batch
    if batch is None or batch.nodes <= 1:
        return
    if not batch.is_main:
        if batch.report_to is not None:
            beat = ["--address", batch.report_to, "--port", str(batch.report_port), "--job", settings.job_id]
            beat += ["--node", str(batch.index), "--pid", str(os.getpid())]
            beat += ["--order", str(node.folder() / STRAGGLER_ORDER)]
            node.spawn(helper(settings.python.stdlib, "node_fault.py", "beat", *beat))
        return
    node.faults = Path(tempfile.mkdtemp())
    pid = str(os.getpid())
    # On Batch the node watch reads the children's addresses, and the listener takes a line only from its node's.
    on_batch = bool(settings.get("AWS_BATCH_JQ_NAME"))
    # Its output goes to a file: it must not hold the launcher's stdout and stderr open.
    with open(node.faults / "listener.log", "wb") as log:
        node.listener = node.spawn(
            helper(
                settings.python.stdlib,
                "node_fault.py",
                "listen",
                "--port",
                str(batch.report_port),
                "--pid",
                pid,
                "--out",
                str(node.faults / "report"),
                "--hangs",
                str(node.faults / "hangs"),
                "--children",
                str(node.faults / "children"),
                "--job",
                settings.job_id,
                *(["--verify-senders"] if on_batch else []),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if on_batch:
        attempt = settings.get("AWS_BATCH_JOB_ATTEMPT", "1")
        attempt = attempt if UINT.fullmatch(attempt) else "1"
        node.watcher = node.spawn(
            helper(
                settings.python.node_watch,
                "node_watch.py",
                "--job",
                settings.job_id,
                "--nodes",
                str(batch.nodes),
                "--main",
                str(batch.main),
                "--pid",
                pid,
                "--out",
                str(node.faults / "report"),
                "--hurry",
                str(node.faults / "trainer-failed"),
                "--since",
                f"{node.started:.6f}",
                "--period",
                settings.get("NODE_WATCH_SECONDS", "15"),
                "--children",
                str(node.faults / "children"),
                "--attempt",
                attempt,
            )
        )


def hurry_node_watch(node: NodeState) -> None:
    """Training failed: the node watch asks every second while the launcher waits for the children."""
    if node.watcher is not None and node.faults is not None:
        (node.faults / "trainer-failed").touch()


def start_cold_start(node: NodeState, preflight_seconds: float) -> None:
    if not node.settings.get("ECS_CONTAINER_METADATA_URI_V4"):
        return
    batch = node.settings.batch
    # Watching this process's descendants for its first worker.
    node.spawn(
        helper(
            node.settings.python.cold_start,
            "cold_start.py",
            "--launcher-start",
            f"{node.started:.6f}",
            "--preflight-seconds",
            format(preflight_seconds, ".6g"),
            "--watch-pid",
            str(os.getpid()),
            "--rendezvous-start",
            f"{time.time():.6f}",
            "--rendezvous-timeout",
            str(batch.join_timeout if batch else 60),
        )
    )


def progress_dir(node: NodeState) -> Path | None:
    """The hang watch's folder, ready, when the watch is on; the script may touch its heartbeat
    (TRAINING_HEARTBEAT_FILE) each step."""
    if node.settings.batch is None or node.settings.hang_seconds <= 0:
        return None
    folder = Path(node.settings.get("PROGRESS_DIR", DEFAULT_PROGRESS_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    for name in (HEARTBEAT, OUTPUT_MARK):
        (folder / name).unlink(missing_ok=True)
    os.environ["TRAINING_HEARTBEAT_FILE"] = str(folder / HEARTBEAT)
    flight_recorder = node.settings.get("TORCH_FR_DUMP_TEMP_FILE")
    if flight_recorder:
        Path(flight_recorder).parent.mkdir(parents=True, exist_ok=True)
    if node.faults is None:
        node.faults = Path(tempfile.mkdtemp())
    return folder


def start_copier(node: NodeState, restored: Restored | None, trainer_pid: int) -> subprocess.Popen[bytes] | None:
    if restored is None or node.settings.checkpoints is None:
        return None
    c = node.settings.checkpoints
    return node.spawn(
        helper(
            node.settings.python.checkpoint,
            "checkpoint_sync.py",
            "watch",
            *restored.node_args,
            "--pid",
            str(trainer_pid),
            "--sync-seconds",
            c.sync_seconds,
            "--settle-seconds",
            c.settle_seconds,
            "--final-seconds",
            c.final_seconds,
            str(restored.folder),
        )
    )


def start_hang_watch(node: NodeState, folder: Path | None, restored: Restored | None, trainer_pid: int) -> None:
    if folder is None:
        return
    settings, batch = node.settings, node.settings.batch
    attempt = settings.get("AWS_BATCH_JOB_ATTEMPT", "1")
    watching = [
        "--pid", str(trainer_pid), "--launcher", str(os.getpid()), "--dir", str(folder),
        "--hang-seconds", str(settings.hang_seconds), "--job", settings.job_id, "--node", str(settings.index),
        "--nodes", str(batch.nodes if batch else 1), "--attempt", attempt, "--since", node.since,
    ]  # fmt: skip
    if restored is not None:
        # Evidence beside the checkpoints: the prefix checkpoint_sync.py uses, whatever names the lineage; by job
        # id, as a resubmitted job shares the lineage and counts its attempts from 1 again.
        evidence = f"{restored.uri}evidence/{settings.job_id}/attempt-{attempt}/node-{settings.index}/"
        watching += ["--uri", evidence, "--checkpoint-dir", str(restored.folder)]
    if settings.is_main and node.faults is not None:
        watching += ["--out", str(node.faults / "report"), "--hangs", str(node.faults / "hangs")]
    elif batch is not None and batch.report_to is not None:
        watching += ["--report-to", batch.report_to, "--report-port", str(batch.report_port)]
        watching += ["--within", str(batch.report_seconds)]
    # boto3 for the upload: checkpoint_sync.py's interpreter.
    node.spawn(helper(settings.python.checkpoint, "progress_watch.py", "watch", *watching))


def start_straggler_watch(node: NodeState, restored: Restored | None) -> dict[str, str]:
    """On every node of a multi-node Batch job: the straggler watch; what the trainer's environment gains for
    its processes to time their steps (step_timing.py through inject/sitecustomize.py), empty when off."""
    settings, batch, stragglers = node.settings, node.settings.batch, node.settings.stragglers
    if batch is None or batch.nodes <= 1 or stragglers.window_seconds <= 0:
        return {}
    timing = node.folder() / STEP_TIMING
    timing.mkdir(parents=True, exist_ok=True)
    window = format(stragglers.window_seconds, "g")
    watching = ["--dir", str(timing), "--pid", str(os.getpid()), "--job", settings.job_id, "--node", str(batch.index)]
    watching += ["--window", window]
    if restored is not None:
        watching += ["--saved", str(restored.state / "uploaded")]  # checkpoint_sync.UPLOADED
    if batch.is_main and node.faults is not None:
        watching += ["--children", str(node.faults / "children"), "--order", str(node.folder() / STRAGGLER_ORDER)]
        watching += ["--out", str(node.faults / "report"), "--ratio", format(stragglers.ratio, "g")]
        watching += ["--min-excess-ms", format(stragglers.min_excess_ms, "g"), "--windows", str(stragglers.windows)]
        watching += ["--action", stragglers.action, "--attempt", settings.get("AWS_BATCH_JOB_ATTEMPT", "1")]
        watching += ["--nodes", str(batch.nodes)]
        # On Batch the listener takes a line only from its node's address (report_listener.py): only there may a
        # pace end a node's attempt.
        watching += ["--verified"] if settings.get("AWS_BATCH_JQ_NAME") else []
        if settings.get("STRAGGLER_LOG_WINDOWS") == "1":
            watching.append("--log-windows")
        if restored is not None:
            watching += ["--marker-uri", f"{restored.uri}evidence/{settings.job_id}/straggler-replaced.json"]
        # boto3 for a replacement's record: then checkpoint_sync.py's interpreter; else the quickest plain one.
        python = settings.python.checkpoint if stragglers.action == "replace" else settings.python.stdlib
        node.spawn(helper(python, "straggler_watch.py", *watching))
    elif batch.report_to is not None:
        watching += ["--report-to", batch.report_to, "--report-port", str(batch.report_port)]
        node.spawn(helper(settings.python.stdlib, "straggler_watch.py", *watching))
    else:
        return {}
    path = os.pathsep.join(p for p in (str(HERE / "inject"), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "STRAGGLER_TIMING_DIR": str(timing), "STRAGGLER_WINDOW_SECONDS": window}
