"""The first phase of a node's life: what Batch (or Slurm through examples/slurm) and the job definition
say, read once from the environment into frozen settings. Pure: the environment and two look-ups of
this node (its accelerators, its address) come in, settings or a BadInput come out.

Batch's multi-node variables (Batch user guide, "Multi-node parallel jobs", environment variables):
  AWS_BATCH_JOB_NUM_NODES          -> --nnodes
  AWS_BATCH_JOB_NODE_INDEX         -> --node_rank (counted from the main node; c10d assigns the ranks)
  AWS_BATCH_JOB_MAIN_NODE_INDEX    -> which node hosts the rendezvous
  AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS (children only) -> the rendezvous host; the main node
                                      uses its own private address
  AWS_BATCH_JOB_ID ("<id>#<node>") -> --rdzv_id, everything from '#' stripped, so all nodes agree
A variable set to the empty string counts as unset, as it did in the shell launcher.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

NAME = "distributed_run.sh"
LINEAGE = re.compile(r"[A-Za-z0-9_-]{1,128}")
NUMBER = re.compile(r"[0-9]*\.?[0-9]+")
UINT = re.compile(r"[0-9]+")


class BadInput(Exception):
    """A value the launcher cannot run with: one line, exit 2, never retried."""


@dataclass(frozen=True)
class Interpreters:
    """Which Python runs each helper. The stdlib ones start fastest on a plain python3 (Isaac Sim's
    python.sh only where there is none); the ones that need boto3 run on the trainer's interpreter."""

    stdlib: str  # node_fault.py, the output relay: NODE_FAULT_PYTHON, PREFLIGHT_PYTHON, else python3
    preflight: str  # preflight.py: PREFLIGHT_PYTHON, else python3
    checkpoint: str  # checkpoint_sync.py, workdir_fetch.py, progress_watch.py watch: CHECKPOINT_PYTHON
    node_watch: str  # node_watch.py: NODE_WATCH_PYTHON
    cold_start: str  # cold_start.py: COLD_START_PYTHON


@dataclass(frozen=True)
class Checkpoints:
    uri: str  # CHECKPOINT_URI as given; checked (s3://) when the restore phase starts
    sync_seconds: str
    settle_seconds: str
    final_seconds: str


@dataclass(frozen=True)
class Stragglers:
    """The straggler watch (straggler_watch.py; docs/health.md, "Slow nodes") on a multi-node job."""

    window_seconds: float = 60.0  # STRAGGLER_WINDOW_SECONDS; 0 turns the watch and the ranks' timing off
    ratio: float = 1.20  # STRAGGLER_RATIO
    min_excess_ms: float = 10.0  # STRAGGLER_MIN_EXCESS_MS
    windows: int = 3  # STRAGGLER_WINDOWS
    action: str = "report"  # STRAGGLER_ACTION: report or replace


STRAGGLER_ACTIONS = ("report", "replace")


@dataclass(frozen=True)
class BatchNode:
    """This node's place in a multi-node job."""

    nodes: int
    index: int
    main: int
    join_timeout: int
    report_port: int
    report_seconds: int
    address: str  # the rendezvous host
    report_to: str | None  # the main node's address, on a child

    @property
    def is_main(self) -> bool:
        return self.index == self.main

    @property
    def node_rank(self) -> int:
        # c10d assigns ranks over its sorted node descriptors (address, pid): rank 0 may be a child
        # (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py), so trainctl check reads every node.
        return (self.index - self.main + self.nodes) % self.nodes


@dataclass(frozen=True)
class Settings:
    script: tuple[str, ...]
    nproc: int
    port: int
    hang_seconds: int
    runner: tuple[str, ...]
    job_id: str
    lineage: str
    batch: BatchNode | None
    checkpoints: Checkpoints | None
    python: Interpreters
    env: Mapping[str, str]  # the rest, read by name where a phase needs it
    stragglers: Stragglers = Stragglers()

    def get(self, name: str, default: str = "") -> str:
        """A variable's value, the default when unset or empty."""
        return self.env.get(name) or default

    @property
    def index(self) -> int:
        return self.batch.index if self.batch else 0

    @property
    def is_main(self) -> bool:
        return self.batch is None or self.batch.is_main

    def rendezvous_args(self) -> list[str]:
        if self.batch is None:
            return ["--standalone", "--nnodes=1", f"--nproc_per_node={self.nproc}"]
        b = self.batch
        return [
            f"--nnodes={b.nodes}",
            f"--node_rank={b.node_rank}",
            f"--nproc_per_node={self.nproc}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={b.address}:{self.port}",
            f"--rdzv_id={self.job_id}",
            f"--rdzv_conf=is_host={int(b.is_main)},join_timeout={b.join_timeout}",
        ]


def shell_quoted(value: str) -> str:
    """As bash's printf %q writes a value: one line whatever it holds."""
    if value.isprintable():
        return "".join(c if c.isalnum() or c in "_@%+=:,./-" else "\\" + c for c in value) or "''"
    escaped = value.encode("unicode_escape").decode("ascii").replace("'", "\\'")
    return f"$'{escaped}'"


def _value(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


def _uint(value: str) -> int | None:
    return int(value) if UINT.fullmatch(value) else None


def _positive(name: str, value: str) -> None:
    if not NUMBER.fullmatch(value) or float(value) <= 0:
        raise BadInput(f"{name}='{value}' is not a positive number")


def _seconds(name: str, value: str) -> None:
    if not NUMBER.fullmatch(value):
        raise BadInput(f"{name}='{value}' is not a number of seconds (0 or more)")


def interpreters(env: Mapping[str, str], which: Callable[[str], str | None] = shutil.which) -> Interpreters:
    python = _value(env, "PYTHON")
    python3 = which("python3") or python or "python3"
    trainer = python or "python3"
    preflight = _value(env, "PREFLIGHT_PYTHON")
    return Interpreters(
        stdlib=_value(env, "NODE_FAULT_PYTHON") or preflight or python3,
        preflight=preflight or python3,
        checkpoint=_value(env, "CHECKPOINT_PYTHON") or trainer,
        node_watch=_value(env, "NODE_WATCH_PYTHON") or trainer,
        cold_start=_value(env, "COLD_START_PYTHON") or trainer,
    )


def _checkpoints(env: Mapping[str, str]) -> Checkpoints | None:
    uri = _value(env, "CHECKPOINT_URI")
    if uri is None:
        return None
    sync = _value(env, "CHECKPOINT_SYNC_SECONDS")
    minutes = _value(env, "CHECKPOINT_SYNC_MINUTES")
    if sync is None and minutes is not None:
        _positive("CHECKPOINT_SYNC_MINUTES", minutes)
        sync = format(float(minutes) * 60, ".6g")
    sync = sync or "60"
    settle = _value(env, "CHECKPOINT_SETTLE_SECONDS") or "30"
    # How long the last upload keeps retrying while S3 throttles (503 SlowDown) or errs.
    final = _value(env, "CHECKPOINT_FINAL_SECONDS") or "120"
    _positive("CHECKPOINT_SYNC_SECONDS", sync)
    _seconds("CHECKPOINT_FINAL_SECONDS", final)
    _seconds("CHECKPOINT_SETTLE_SECONDS", settle)
    return Checkpoints(uri=uri, sync_seconds=sync, settle_seconds=settle, final_seconds=final)


def _stragglers(env: Mapping[str, str], checkpoints: Checkpoints | None) -> Stragglers:
    window = _value(env, "STRAGGLER_WINDOW_SECONDS") or "60"
    ratio = _value(env, "STRAGGLER_RATIO") or "1.2"
    excess = _value(env, "STRAGGLER_MIN_EXCESS_MS") or "10"
    windows = _value(env, "STRAGGLER_WINDOWS") or "3"
    action = _value(env, "STRAGGLER_ACTION") or "report"
    _seconds("STRAGGLER_WINDOW_SECONDS", window)
    if not NUMBER.fullmatch(ratio) or float(ratio) <= 1:
        raise BadInput(f"STRAGGLER_RATIO='{ratio}' is not a number above 1 (a node this many times slower counts)")
    if not NUMBER.fullmatch(excess):
        raise BadInput(f"STRAGGLER_MIN_EXCESS_MS='{excess}' is not a number of milliseconds (0 or more)")
    if _uint(windows) is None or int(windows) < 1:
        raise BadInput(f"STRAGGLER_WINDOWS='{windows}' is not a positive integer")
    if action not in STRAGGLER_ACTIONS:
        raise BadInput(f"STRAGGLER_ACTION='{action}' is not one of: {', '.join(STRAGGLER_ACTIONS)}")
    if action == "replace" and checkpoints is None:
        raise BadInput(
            "STRAGGLER_ACTION=replace needs CHECKPOINT_URI: a replaced node's retry resumes from the checkpoint that "
            "was uploaded before it ended"
        )
    return Stragglers(float(window), float(ratio), float(excess), int(windows), action)


def _batch_node(env: Mapping[str, str], port: int, own_address: Callable[[], str]) -> BatchNode:
    nodes_text = env.get("AWS_BATCH_JOB_NUM_NODES", "")
    index_text = env.get("AWS_BATCH_JOB_NODE_INDEX", "")
    main_text = _value(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX") or "0"
    join_text = _value(env, "RDZV_JOIN_TIMEOUT") or "1800"
    nodes, index, main = _uint(nodes_text), _uint(index_text), _uint(main_text)
    if nodes is None or nodes < 1:
        raise BadInput(f"AWS_BATCH_JOB_NUM_NODES='{nodes_text}' is not a positive integer")
    if index is None:
        raise BadInput(f"AWS_BATCH_JOB_NODE_INDEX='{index_text}' is not a non-negative integer")
    if main is None:
        raise BadInput(f"AWS_BATCH_JOB_MAIN_NODE_INDEX='{main_text}' is not a non-negative integer")
    if index >= nodes:
        raise BadInput(f"AWS_BATCH_JOB_NODE_INDEX={index} is not below AWS_BATCH_JOB_NUM_NODES={nodes}")
    if main >= nodes:
        raise BadInput(f"AWS_BATCH_JOB_MAIN_NODE_INDEX={main} is not below AWS_BATCH_JOB_NUM_NODES={nodes}")
    join_timeout = _uint(join_text)
    if join_timeout is None or join_timeout < 1:
        raise BadInput(f"RDZV_JOIN_TIMEOUT='{join_text}' is not a positive integer")
    report_port_text = _value(env, "NODE_REPORT_PORT") or str(port + 1)
    # How long a child keeps trying to reach the main node's listener (it starts with the main node's
    # launcher; Batch starts the children only once the main node runs).
    report_seconds_text = _value(env, "NODE_REPORT_SECONDS") or "60"
    report_seconds = _uint(report_seconds_text)
    if report_seconds is None:
        raise BadInput(f"NODE_REPORT_SECONDS='{report_seconds_text}' is not a number of seconds (0 or more)")
    report_port = _uint(report_port_text)
    if report_port is None or not 1 <= report_port <= 65535 or report_port == port:
        raise BadInput(
            f"NODE_REPORT_PORT='{report_port_text}' is not a port number (1..65535) other than MASTER_PORT;"
            " set NODE_REPORT_PORT"
        )
    master = _value(env, "MASTER_ADDR")
    if index == main:
        return BatchNode(nodes, index, main, join_timeout, report_port, report_seconds, master or own_address(), None)
    address = master or _value(env, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    if address is None:
        raise BadInput(f"child node {index} has neither MASTER_ADDR nor AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    return BatchNode(nodes, index, main, join_timeout, report_port, report_seconds, address, address)


def read_settings(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    accelerators: Callable[[], int],
    own_address: Callable[[], str],
    which: Callable[[str], str | None] = shutil.which,
) -> Settings:
    """Every setting the launcher runs with, checked in the order the shell launcher checked them, so
    that the first bad value is the one named. `accelerators` and `own_address` are asked only when
    NPROC_PER_NODE or MASTER_ADDR leave it to them."""
    if not args:
        raise BadInput(f"usage: {NAME} SCRIPT [ARGS...]")
    nproc_text = _value(env, "NPROC_PER_NODE") or str(accelerators())
    nproc = _uint(nproc_text)
    if nproc is None or nproc < 1:
        raise BadInput(f"NPROC_PER_NODE='{nproc_text}' is not a positive integer")
    port_text = _value(env, "MASTER_PORT") or "29500"
    port = _uint(port_text)
    if port is None or not 1 <= port <= 65535:
        raise BadInput(f"MASTER_PORT='{port_text}' is not a port number (1..65535)")
    hang_text = _value(env, "HANG_SECONDS") or "0"
    hang_seconds = _uint(hang_text)
    if hang_seconds is None:
        raise BadInput(f"HANG_SECONDS='{hang_text}' is not a whole number of seconds (0 turns the hang watch off)")
    checkpoints = _checkpoints(env)
    python = _value(env, "PYTHON")
    runner = (
        ("torchrun",) if python is None and which("torchrun") else (python or "python3", "-m", "torch.distributed.run")
    )
    job_id = (_value(env, "AWS_BATCH_JOB_ID") or "local").split("#", 1)[0]
    # The training lineage: the job id, or the one the capacity fallback's resubmitter carries over.
    lineage = _value(env, "CHECKPOINT_LINEAGE")
    if lineage is not None and not LINEAGE.fullmatch(lineage):
        raise BadInput(
            f"CHECKPOINT_LINEAGE={shell_quoted(lineage)[:80]} is not a lineage id: 1 to 128 letters, digits, '-' or '_'"
        )
    is_batch = bool(_value(env, "AWS_BATCH_JOB_NUM_NODES") or _value(env, "AWS_BATCH_JOB_NODE_INDEX"))
    return Settings(
        script=tuple(args),
        nproc=nproc,
        port=port,
        hang_seconds=hang_seconds,
        runner=runner,
        job_id=job_id,
        lineage=lineage or job_id,
        batch=_batch_node(env, port, own_address) if is_batch else None,
        checkpoints=checkpoints,
        python=interpreters(env, which),
        env=dict(env),
        stragglers=_stragglers(env, checkpoints),
    )
