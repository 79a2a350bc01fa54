"""How an attempt ends when training fails on a child, through the real launcher: two nodes on this host
with stand-in trainers (PYTHON) that fail the way torchrun does. An application's bug is the
application's (exit 1 once, its error quoted, not retried); a child that dies without a word while Batch
still shows it RUNNING is lost (75, retried); a main node whose trainer ignores the stop (torchrun in its
exit barrier) still ends within a minute of a child's failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batch_stub import JOB, Batch, aws_env, batch_server
from tests.test_launcher import LAUNCHER, base_env, free_port, launch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "container" / "launcher"))
import run_node

# What a failed torchrun prints on the node whose rank 1 raised (tests/fixtures/torchrun/ has a real one).
CHILD_BUG = r"""printf '%s\n' '[rank1]: Traceback (most recent call last):' \
  '[rank1]: ValueError: shapes do not match: (32, 16) vs (16, 8)' \
  'Root Cause (first observed failure):' '[0]:' '  time      : 2026-11-28_13:14:06' \
  '  rank      : 1 (local_rank: 0)' '  exitcode  : 1 (pid: 77)' >&2
exit 1"""
ECHO = "echo '[rank0]: RuntimeError: Connection closed by peer [127.0.0.1]:41608' >&2\nexit 1"


@pytest.fixture
def batch() -> Iterator[tuple[Batch, str]]:
    with batch_server() as server:
        yield server


def nodes(tmp_path: Path, main_trainer: str, child_trainer: str, **extra: str) -> tuple[dict[str, str], ...]:
    shared = {"AWS_BATCH_JOB_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "1"}
    shared |= {"MASTER_PORT": str(free_port()), "NODE_REPORT_PORT": str(free_port()), **extra}
    envs = []
    for index, (name, body) in enumerate((("main", main_trainer), ("child", child_trainer))):
        (tmp_path / name).mkdir()
        trainer = tmp_path / f"{name}.sh"
        trainer.write_text(f"#!/bin/sh\ntouch {tmp_path / name}/training\n{body}\n")
        trainer.chmod(0o755)
        env = base_env(**shared, AWS_BATCH_JOB_ID=f"{JOB}#{index}", AWS_BATCH_JOB_NODE_INDEX=str(index))
        envs.append(env | {"PYTHON": str(trainer), "NODE_STATE_DIR": str(tmp_path / name), "XID_SETTLE_SECONDS": "0"})
    return envs[0], envs[1]


def wait_for(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def test_an_application_error_on_every_node_ends_the_job_with_1_once_quoting_the_first_ranks_error(tmp_path):
    child_failed = tmp_path / "child-failed"
    waits = f"while [ ! -e {child_failed} ]; do sleep 0.1; done\n{ECHO}"
    main_env, child_env = nodes(tmp_path, waits, f"sleep 1\ntouch {child_failed}\n{CHILD_BUG}")
    started = time.monotonic()
    main = launch(main_env, "t.py")
    child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=60)
    try:
        _, err = main.communicate(timeout=60)
    finally:
        main.kill()
    assert child.returncode == 1, child.stderr
    assert main.returncode == 1, err  # the application's, which the job definitions do not retry
    (line,) = [x for x in err.splitlines() if "ending this job" in x]
    assert "node 1 (" in line and "rank 1 failed: ValueError: shapes do not match: (32, 16) vs (16, 8) (exit 1)" in line
    assert "2 of 2 nodes failed with an application error, none with a node fault" in line
    assert "(the application's error, not retried)" in line
    assert time.monotonic() - started < 30
    assert not (tmp_path / "main" / "take-out").exists() and not (tmp_path / "child" / "take-out").exists()


def test_a_child_killed_while_batch_still_shows_it_running_is_lost_75(batch, tmp_path):
    """Batch's DescribeJobs answers RUNNING throughout (its node job's FAILED is late): the child's silence
    on the report port is the evidence."""
    stub, endpoint = batch
    peer_gone = tmp_path / "peer-gone"
    aws = {k: v for k, v in aws_env(endpoint).items() if k.startswith("AWS_")}
    main_env, child_env = nodes(
        tmp_path, f"while [ ! -e {peer_gone} ]; do sleep 0.1; done\n{ECHO}", "exec sleep 120",
        AWS_BATCH_JQ_NAME="gpu", NODE_WATCH_SECONDS="1", NODE_LOST_SECONDS="6",
    )  # fmt: skip
    main_env |= {**aws, "NODE_WATCH_PYTHON": sys.executable}
    main = launch(main_env, "t.py")
    child = subprocess.Popen([str(LAUNCHER), "t.py"], env=child_env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        wait_for(tmp_path / "child" / "training")
        os.killpg(child.pid, signal.SIGKILL)  # its host is lost: no word, no exit code
        killed = time.monotonic()
        peer_gone.touch()  # the main node's collective breaks at once
        _, err = main.communicate(timeout=90)
        seconds = time.monotonic() - killed
    finally:
        main.kill()
        child.wait()
    assert main.returncode == 75, err
    assert "node 1: no word for 6 s and Batch does not show it ended: lost" in err
    assert stub.calls, "the node watch never asked Batch"
    assert seconds < 6 + 15


def test_a_childs_failure_ends_a_main_node_whose_trainer_ignores_the_stop_within_a_minute(tmp_path):
    """torchrun in its exit barrier: the main node's workers are done, and the stop does not end it."""
    main_env, child_env = nodes(
        tmp_path, "trap '' TERM\nsleep 300 & wait\nwait", f"sleep 1\n{CHILD_BUG}", TRAINER_STOP_SECONDS="4"
    )
    main = launch(main_env, "t.py")
    try:
        wait_for(tmp_path / "main" / "training")
        child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=60)
        failed = time.monotonic()
        _, err = main.communicate(timeout=90)
        seconds = time.monotonic() - failed
    finally:
        main.kill()
    assert child.returncode == 1
    assert main.returncode == 1, err
    assert "did not stop within 4 s of the report; killing it" in err
    assert "rank 1 failed: ValueError" in err
    assert seconds < 4 + 20
    # The default gives torchrun's own stop of its workers time: a third of "within a minute".
    assert run_node.STOP_KILL_SECONDS == 20


def test_a_stopped_child_stops_telling_a_main_node_that_is_gone(tmp_path):
    """The main node ended first (its store went with it, so the child's trainer failed) and nobody listens
    any more; Batch then stops the child. Its word can change nothing now, and every second spent on it is
    taken from the stop's last upload: it gives up within STOPPED_REPORT_SECONDS of the stop, not after
    NODE_REPORT_SECONDS (60 by default)."""
    failed = tmp_path / "child-failed"
    _, child_env = nodes(tmp_path, "exit 0", f"touch {failed}\n{ECHO}")
    child = subprocess.Popen([str(LAUNCHER), "t.py"], env=child_env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(failed)
        time.sleep(1.0)  # the launcher is now telling a main node nobody plays
        child.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        _, err = child.communicate(timeout=90)
        seconds = time.monotonic() - stopped
    finally:
        child.kill()
    assert seconds < 5 + 10, f"the child took {seconds:.0f} s to end after its stop:\n{err}"
