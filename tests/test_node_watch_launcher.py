"""The node watcher through the real launcher (container/distributed_run.sh), two nodes on this host with
stand-in trainers and a DescribeJobs stand-in on 127.0.0.1 (tests/batch_stub.py): a child killed mid-training
without a report ends the main node with 75 naming it, also when the main node's own trainer crashed first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batch_stub import ESSENTIAL, JOB, Batch, aws_env, batch_server, fail_after, failed
from tests.test_launcher import LAUNCHER, base_env, free_port, launch


@pytest.fixture
def batch() -> Iterator[tuple[Batch, str]]:
    with batch_server() as server:
        yield server


def two_nodes(tmp_path: Path, endpoint: str, main_trainer: str, **main_extra: str) -> tuple[dict[str, str], ...]:
    """Environments of a main node and a child on this host, each with a stand-in trainer (PYTHON): the child's
    writes `child-training` and sleeps; the main node's runs `main_trainer`."""
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "1"}
    nodes |= {"MASTER_PORT": str(free_port()), "NODE_REPORT_PORT": str(free_port()), "AWS_BATCH_JQ_NAME": "gpu"}
    for name, body in (("main", main_trainer), ("child", f"touch {tmp_path / 'child-training'}\nexec sleep 120")):
        (tmp_path / name).mkdir()
        trainer = tmp_path / f"{name}.sh"
        trainer.write_text(f"#!/bin/sh\n{body}\n")
        trainer.chmod(0o755)
    aws = {k: v for k, v in aws_env(endpoint).items() if k.startswith("AWS_")}
    main = base_env(**nodes, **aws, AWS_BATCH_JOB_ID=f"{JOB}#0", AWS_BATCH_JOB_NODE_INDEX="0")
    main |= {"PYTHON": str(tmp_path / "main.sh"), "NODE_STATE_DIR": str(tmp_path / "main")}
    main |= {"NODE_WATCH_PYTHON": sys.executable, **main_extra}
    child = base_env(**nodes, AWS_BATCH_JOB_ID=f"{JOB}#1", AWS_BATCH_JOB_NODE_INDEX="1")
    child |= {"PYTHON": str(tmp_path / "child.sh"), "NODE_STATE_DIR": str(tmp_path / "child")}
    return main, child


def kill_child_mid_training(tmp_path: Path, child_env: dict[str, str]) -> None:
    """The child's container is SIGKILLed (OOM, a lost host): every process at once, no EXIT trap, no report."""
    child = subprocess.Popen([str(LAUNCHER), "t.py"], env=child_env, start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (tmp_path / "child-training").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "child-training").exists(), "the child never started training"
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_launcher_a_child_killed_without_a_report_ends_the_main_node_with_75_naming_it(batch, tmp_path):
    stub, endpoint = batch
    main_env, child_env = two_nodes(tmp_path, endpoint, "exec sleep 120", NODE_WATCH_SECONDS="1")
    main = launch(main_env, "t.py")
    try:
        kill_child_mid_training(tmp_path, child_env)
        killed = time.monotonic()
        stub.answer = fail_after(0, failed(1))  # what Batch shows once ECS reports the container's exit
        _, err = main.communicate(timeout=60)
        ended = time.monotonic()
    finally:
        main.kill()
    assert main.returncode == 75, err
    line = f"distributed_run.sh: node 1: Batch says FAILED: {ESSENTIAL}, exit code 137; it died without telling"
    assert line in err
    assert stub.failed_shown is not None
    assert ended - killed < 8  # at most one 1 s poll, then the launcher stops its trainer (slack for load)
    assert not (tmp_path / "main" / "take-out").exists()  # the main node is healthy
    print(
        f"\nchild SIGKILLed mid-training -> main node exit 75 after {ended - killed:.2f} s with a 1 s poll; "
        f"{ended - stub.failed_shown:.2f} s of it from the FAILED answer to the exit"
    )


def test_launcher_a_main_trainer_that_crashes_first_still_ends_with_75_not_1(batch, tmp_path):
    """The lost peer breaks the main node's collectives before Batch shows the child FAILED: the main node's
    trainer exits 1, and the watcher, told so, asks every second through the launcher's report grace."""
    stub, endpoint = batch
    crashed = tmp_path / "peer-gone"
    trainer = f"while [ ! -e {crashed} ]; do sleep 0.1; done\necho 'NCCL error: remote process exited' >&2\nexit 1"
    main_env, child_env = two_nodes(tmp_path, endpoint, trainer, NODE_WATCH_SECONDS="600")
    main = launch(main_env, "t.py")
    try:
        kill_child_mid_training(tmp_path, child_env)
        crashed.touch()
        time.sleep(1)  # Batch is slower than the collectives
        stub.answer = fail_after(0, failed(1))
        shown = time.monotonic()
        _, err = main.communicate(timeout=60)
        seconds = time.monotonic() - shown
    finally:
        main.kill()
    assert main.returncode == 75, err
    assert "node 1: Batch says FAILED:" in err
    assert seconds < 10  # polling every second, not every 600 s; and within the 15 s grace, or it exits 1
    print(
        f"\nmain trainer crashed first; Batch showed the child FAILED 1 s later -> exit 75 after {seconds:.2f} s more"
    )
