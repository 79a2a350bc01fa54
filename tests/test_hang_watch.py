"""The hang watch (container/launcher/progress_watch.py) through the real launcher: a stand-in trainer that stops
heartbeating (and SIGSTOPs itself, as `trainctl rehearse`'s stop-rank fault does) ends the attempt within
seconds with one line naming the rank and node that stopped first and where the stacks are; the stacks
of a stopped rank come from py-spy; the evidence goes to a local S3 (moto on 127.0.0.1); the exit code
follows the attempt. Every address is loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.local_aws import moto_server
from tests.test_launcher import LAUNCHER, base_env, free_port
from training_constructs.jobs import workloads
from training_constructs.jobs.multi_node_job import RETRY_RULES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import hang_evidence as evidence  # noqa: E402
import progress_signals as signals  # noqa: E402
import watchers  # noqa: E402

BUCKET = "hang-evidence"

TRAINER = """
import os, signal, sys, time
from pathlib import Path

def train_step():
    time.sleep(float(os.environ["FAKE_STEP_SECONDS"]))

def wait_in_collective():
    while True:
        time.sleep(1)

# FAKE_AFTER: a peer's stop file; this rank steps on until the peer has stopped, as a rank of a real job
# does until it blocks in the collective the stopped rank never joins (whatever each node's start took).
after = os.environ.get("FAKE_AFTER")
step = 0
while step < int(os.environ["FAKE_STEPS"]) or (after and not Path(after).exists()):
    step += 1
    train_step()
    if os.environ["FAKE_MODE"] == "heartbeat":
        Path(os.environ["TRAINING_HEARTBEAT_FILE"]).touch()
    else:
        print(f"step {step - 1}", flush=True)
if os.environ.get("FAKE_STOP"):
    Path(os.environ["FAKE_PID_FILE"]).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)
wait_in_collective()
"""


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and text in command:
            found.append(int(entry.name))
    return found


def fake_trainer(tmp_path: Path, rank: int, mode: str, steps: int, stop: bool = False) -> dict[str, str]:
    """A PYTHON for the launcher that runs TRAINER as training rank `rank` (torchrun's variables set)."""
    script = tmp_path / f"trainer-{rank}.py"
    script.write_text(TRAINER)
    shim = tmp_path / f"python-{rank}.sh"
    shim.write_text(f'#!/bin/sh\nRANK={rank} LOCAL_RANK=0 exec "{sys.executable}" "{script}"\n')
    shim.chmod(0o755)
    env = {"PYTHON": str(shim), "CHECKPOINT_PYTHON": sys.executable, "FAKE_MODE": mode, "FAKE_STEPS": str(steps)}
    env |= {"FAKE_STEP_SECONDS": "0.1", "FAKE_STOP": "1" if stop else ""}
    env["FAKE_PID_FILE"] = str(tmp_path / f"rank-{rank}.pid")
    return env


def node_env(tmp_path: Path, name: str, **extra: str) -> dict[str, str]:
    folder = tmp_path / name
    (folder / "state").mkdir(parents=True)
    env = base_env(AWS_BATCH_JOB_NUM_NODES="1", AWS_BATCH_JOB_NODE_INDEX="0", AWS_BATCH_JOB_ID="hj7#0")
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NPROC_PER_NODE": "1"}
    env |= {"HANG_SECONDS": "1", "HANG_POLL_SECONDS": "0.1", "PROGRESS_DIR": str(folder / "progress")}
    env |= {"NODE_STATE_DIR": str(folder / "state"), "NODE_REPORT_GRACE_SECONDS": "0", "XID_SETTLE_SECONDS": "0"}
    env |= {"TORCH_FR_DUMP_TEMP_FILE": str(folder / "progress" / "flight-recorder" / "rank-")}
    env.update(extra)
    return env


def start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(LAUNCHER), "train.py"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def launcher_line(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("distributed_run.sh: node ") and "hang:" in x]
    return line


# --- progress and the limit -------------------------------------------------------------------------


def stamp(path: Path, epoch: float) -> None:
    path.touch()
    os.utime(path, (epoch, epoch))


def test_the_limit_is_never_below_twice_the_longest_silence(tmp_path):
    beat = tmp_path / "heartbeat"
    progress = signals.Progress(5, beat, tmp_path / "output")
    for epoch in (1000, 1001, 1011, 1012):  # one 10 s step among 1 s steps
        stamp(beat, epoch)
        progress.sample(epoch)
    assert progress.slowest == 10 and progress.limit == 20
    assert progress.state(1012 + 19) == signals.PROGRESSING  # HANG_SECONDS (5) alone would call this a hang
    assert progress.state(1012 + 20) == signals.HUNG
    fast = signals.Progress(5, tmp_path / "other", tmp_path / "output")
    stamp(tmp_path / "other", 1000)
    fast.sample(1000)
    assert fast.limit == 5 and fast.state(1005) == signals.HUNG


def test_any_signal_is_progress_the_floor_counts_from_the_first_heartbeat_and_a_silent_trainer_never_hangs(tmp_path):
    beat, output = tmp_path / "heartbeat", tmp_path / "output"
    progress = signals.Progress(5, beat, output)
    progress.sample(1000)
    assert progress.state(10**10) == signals.PROGRESSING
    stamp(output, 1001)
    progress.sample(1001)
    stamp(output, 1031)  # a silent 30 s before training: the floor grows while there is no heartbeat
    progress.sample(1031)
    assert progress.source == "output" and progress.limit == 60
    stamp(beat, 1032)
    progress.sample(1032)
    assert progress.heartbeat_seen and progress.limit == 5  # what came before the first step is no step
    stamp(output, 1040)  # output goes on, the heartbeat does not: output is progress too
    progress.sample(1040)
    assert progress.source == "output" and progress.last == 1040 and progress.limit == 16
    assert progress.state(1055) == signals.PROGRESSING and progress.state(1056) == signals.HUNG


# --- the exit codes against the retry rules ------------------------------------------------------


def retried(code: int) -> bool:
    """Batch's EvaluateOnExit: the first rule whose globs (exact, or a prefix ending in *) all match; no match
    retries (API EvaluateOnExit). The launcher's own exit: reason and status reason are Batch's."""

    def matches(pattern: str | None, value: str) -> bool:
        return pattern is None or (value.startswith(pattern[:-1]) if pattern.endswith("*") else value == pattern)

    for rule in RETRY_RULES:
        reason, status_reason = "", "Essential container in task exited"
        if (
            matches(rule.on_exit_code, str(code))
            and matches(rule.on_reason, reason)
            and matches(rule.on_status_reason, status_reason)
        ):
            return rule.action == "RETRY"
    return True


# --- stacks ------------------------------------------------------------------------------------------


def test_py_spy_reads_the_stacks_of_a_sigstopped_rank(tmp_path):
    """A stopped process runs no faulthandler, but py-spy reads its memory (--nonblocking)."""
    ready = tmp_path / "ready"
    code = (
        f"import time\ndef stuck_in_data_loader():\n    open({str(ready)!r}, 'w').close()\n    time.sleep(60)\n"
        "stuck_in_data_loader()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": "3"})
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(0.1)
        (rank,) = evidence.find_ranks(process.pid)
        assert rank.rank == 3 and rank.state == "T"
        started = time.monotonic()
        text, ok = evidence.dump_stacks(rank)
        print(f"\npy-spy dump of a stopped rank: {time.monotonic() - started:.2f} s")
    finally:
        process.kill()
        process.wait()
    assert ok, text
    assert "stuck_in_data_loader" in text


def test_without_py_spy_the_evidence_says_so_instead_of_hanging(monkeypatch):
    monkeypatch.setattr(evidence, "_py_spy", lambda: None)
    text, ok = evidence.dump_stacks(evidence.Rank(os.getpid(), 0, "S"))
    assert not ok and "py-spy is not installed" in text


# --- through the launcher ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def s3_client(endpoint: str) -> Any:
    secret = "test"  # noqa: S105 - moto accepts any key
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key=secret
    )


def s3_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    return {
        "CHECKPOINT_URI": f"s3://{BUCKET}/runs",
        "CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "CHECKPOINT_SYNC_SECONDS": "0.2",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }


def test_a_stopped_rank_ends_the_attempt_with_its_stacks_in_s3_and_75_then_124(tmp_path, s3_endpoint):
    client = s3_client(s3_endpoint)
    runs = {}
    for attempt in (1, 2):  # two jobs at once, one on its first attempt and one on its second
        folder = tmp_path / f"attempt-{attempt}"
        env = node_env(folder, "node", AWS_BATCH_JOB_ATTEMPT=str(attempt), **s3_env(folder, s3_endpoint))
        env |= fake_trainer(folder, 0, "heartbeat", steps=5, stop=True) | {"AWS_BATCH_JOB_ID": f"hj{attempt}#0"}
        runs[attempt] = (folder, time.monotonic(), start(env))
    for (attempt, (folder, started, node)), expected in zip(runs.items(), (75, 124), strict=True):
        _, err = node.communicate(timeout=60)
        elapsed = time.monotonic() - started
        stopped = (folder / "rank-0.pid").stat().st_mtime
        after_stop = time.time() - stopped
        # What this machine took, now, to start the node and run five 0.1 s steps: the yardstick for the
        # stop's detection, dumps and uploads (the same kinds of process work), whatever else it runs.
        startup = elapsed - after_stop
        assert node.returncode == expected, err
        line = launcher_line(err)
        # By job id under the lineage (here the job's own): a resubmitted job's evidence keeps the original's.
        where = f"s3://{BUCKET}/runs/hj{attempt}/evidence/hj{attempt}/attempt-{attempt}/"
        assert line.startswith("distributed_run.sh: node 0 (")
        assert "rank 0 on node 0 stopped first" in line and "state T" in line and f"stacks at {where}" in line
        if expected == 75:
            assert line.endswith("retried once; ending this job with exit 75 so that Batch retries it on other nodes")
        else:
            assert line.endswith("a hang again on attempt 2; ending this job with exit 124 (not retried)")
        key = f"runs/hj{attempt}/evidence/hj{attempt}/attempt-{attempt}/node-0/stacks-rank-0.txt"
        stacks = client.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
        assert "state T" in stacks and "<module>" in stacks and "trainer-0.py" in stacks
        # No hardware sign: no take-out.
        assert not (folder / "node" / "state" / "take-out").exists()
        print(f"\nattempt {attempt}: rank stopped -> stacks in S3, exit {expected} {after_stop:.1f} s later: {line}")
        # The 1 s limit, the 0.1 s polls and the dumps: seconds on a quiet machine, never minutes.
        assert after_stop < 10 + 2 * startup, (after_stop, startup)


def test_the_main_node_names_the_child_that_stopped_first(tmp_path):
    """Two nodes on one host: the child's rank stops (SIGSTOP) while the main node's rank still steps, then
    waits in its collective; the main node prints its output (no heartbeat). The main node names rank 1 on
    node 1, and its own stacks are in its log (no CHECKPOINT_URI)."""
    report_port = free_port()
    common = {"AWS_BATCH_JOB_NUM_NODES": "2", "NODE_REPORT_PORT": str(report_port), "AWS_BATCH_JOB_ATTEMPT": "1"}
    main_env = node_env(tmp_path, "main", **common) | fake_trainer(tmp_path, 0, "output", steps=12)
    main_env["FAKE_AFTER"] = str(tmp_path / "rank-1.pid")
    child_env = node_env(tmp_path, "child", **common, AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_ID="hj7#1")
    child_env |= fake_trainer(tmp_path, 1, "heartbeat", steps=5, stop=True) | {"MASTER_PORT": main_env["MASTER_PORT"]}
    main = start(main_env)
    child = start(child_env)
    try:
        _, main_err = main.communicate(timeout=60)
        ended = time.time()
    finally:
        # Batch stops the children once the main node ends: SIGTERM, and SIGKILL 30 s later for what a stop
        # cannot end (the stopped rank).
        child.send_signal(signal.SIGTERM)
        os.kill(int((tmp_path / "rank-1.pid").read_text()), signal.SIGKILL)
        _, child_err = child.communicate(timeout=60)
        main.kill()
    assert main.returncode == 75, main_err
    line = launcher_line(main_err)
    assert re.match(r"distributed_run\.sh: node 1 \([^)]+\): hang: no progress on any node for \d+ s", line), line
    assert "rank 1 on node 1 stopped first" in line
    assert "stacks in each node's log" in line
    assert "wait_in_collective" in main_err  # the main node's own rank, dumped into its log
    assert "progress_watch.py: node 1" in child_err and "<module>" in child_err
    # The child's hang watch went with its launcher, as a container's processes go with its first one: it
    # does not linger retrying a report to the main node that is gone (and holding the log open).
    assert not processes_naming(str(tmp_path / "child" / "progress"))
    stopped = (tmp_path / "rank-1.pid").stat().st_mtime
    print(f"\nchild's rank stopped -> main node exit 75 {ended - stopped:.1f} s later (HANG_SECONDS 1): {line}")
    assert ended - stopped < 15


def test_the_launcher_refuses_a_bad_hang_seconds(tmp_path):
    env = node_env(tmp_path, "node", HANG_SECONDS="5m") | fake_trainer(tmp_path, 0, "output", steps=1)
    result = subprocess.run([str(LAUNCHER), "t.py"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "distributed_run.sh: HANG_SECONDS='5m' is not a whole number of seconds (0 turns the hang watch off)"
    )


def test_the_flight_recorder_path_lies_under_the_launchers_progress_folder():
    assert workloads.HANG_ENVIRONMENT["TORCH_FR_DUMP_TEMP_FILE"].startswith(workloads.PROGRESS_DIR + "/")
    assert watchers.DEFAULT_PROGRESS_DIR == workloads.PROGRESS_DIR
