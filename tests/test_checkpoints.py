"""The launcher's checkpoints against a real S3 API on 127.0.0.1 (moto's server mode): restore before
training, upload while and after it runs, resume after a retry, main node only, loud failures."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from tests.test_launcher import LAUNCHER, base_env, free_port

BUCKET = "checkpoints"
URI = f"s3://{BUCKET}/rl"

# A stand-in for the training processes: shows what it was given and what it found, writes a model,
# optionally waits for the test's go-ahead, writes one more file and exits with $FAKE_STATUS.
TRAINER = """#!/bin/sh
echo "ARGS: $*"
for f in "$CHECKPOINT_DIR"/*; do [ -e "$f" ] && echo "HAVE: $(basename "$f")"; done
echo "weights $STEP" > "$CHECKPOINT_DIR/model_$STEP.pt"
if [ -n "$WAIT_FOR" ]; then while [ ! -e "$WAIT_FOR" ]; do sleep 0.1; done; fi
echo "done" > "$CHECKPOINT_DIR/summary_$STEP.txt"
exit "${FAKE_STATUS:-0}"
"""


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint):
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",  # noqa: S106 - moto accepts any key
    )
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def trainer(tmp_path):
    script = tmp_path / "trainer.sh"
    script.write_text(TRAINER)
    script.chmod(0o755)
    return str(script)


def keys(s3) -> set[str]:
    return {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def node_env(s3_endpoint: str, trainer: str, workdir: Path, *, index: int = 0, **extra: str) -> dict[str, str]:
    env = base_env(
        PYTHON=trainer,
        CHECKPOINT_PYTHON=sys.executable,
        NPROC_PER_NODE="1",
        AWS_BATCH_JOB_NUM_NODES="2",
        AWS_BATCH_JOB_NODE_INDEX=str(index),
        AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
        AWS_BATCH_JOB_ID=f"job42#{index}",
        MASTER_ADDR="127.0.0.1",
        CHECKPOINT_URI=URI,
        # A fresh container per attempt: nothing survives locally.
        CHECKPOINT_DIR=str(workdir / "checkpoints"),
        AWS_ENDPOINT_URL=s3_endpoint,
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",  # noqa: S106 - moto accepts any key
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=str(workdir / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(workdir / "none"),
    )
    env.update(extra)
    return env


def run_node(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCHER), "train.py"], env=env, capture_output=True, text=True, timeout=120)


def test_failed_attempt_uploads_and_the_retry_resumes_from_it(s3_endpoint, s3, trainer, tmp_path):
    first = run_node(node_env(s3_endpoint, trainer, tmp_path / "a1", STEP="1", FAKE_STATUS="3", RESUME_ARGS="--resume"))
    assert first.returncode == 3, first.stderr  # the script's status, after the upload
    assert "HAVE:" not in first.stdout and "--resume" not in first.stdout  # nothing to resume from
    assert keys(s3) == {"rl/job42/model_1.pt", "rl/job42/summary_1.txt"}

    # Batch retries with the same job id; the new container starts empty.
    resume = "agent.resume=True --log_root resumed"
    second = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2", STEP="2", RESUME_ARGS=resume))
    assert second.returncode == 0, second.stderr
    assert "HAVE: model_1.pt" in second.stdout and "HAVE: summary_1.txt" in second.stdout
    (args,) = [line for line in second.stdout.splitlines() if line.startswith("ARGS: ")]
    assert args.endswith("train.py agent.resume=True --log_root resumed")
    assert keys(s3) == {f"rl/job42/{name}" for name in ("model_1.pt", "summary_1.txt", "model_2.pt", "summary_2.txt")}
    body = s3.get_object(Bucket=BUCKET, Key="rl/job42/model_2.pt")["Body"].read()
    assert body == b"weights 2\n"


def test_checkpoints_are_uploaded_while_training_runs(s3_endpoint, s3, trainer, tmp_path):
    go = tmp_path / "go"
    env = node_env(s3_endpoint, trainer, tmp_path, STEP="7", WAIT_FOR=str(go), CHECKPOINT_SYNC_MINUTES="0.01")
    process = subprocess.Popen([str(LAUNCHER), "train.py"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while "rl/job42/model_7.pt" not in keys(s3):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no periodic upload within 60 s"
            time.sleep(0.2)
        assert "rl/job42/summary_7.txt" not in keys(s3)  # the script has not written it yet
    finally:
        go.touch()
        process.communicate(timeout=120)
    assert process.returncode == 0
    assert "rl/job42/summary_7.txt" in keys(s3)  # the final upload


def test_children_restore_but_never_upload(s3_endpoint, s3, trainer, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="rl/job42/model_1.pt", Body=b"weights 1\n")
    env = node_env(
        s3_endpoint, trainer, tmp_path, index=1, STEP="9", AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="127.0.0.1"
    )
    result = run_node(env)
    assert result.returncode == 0, result.stderr
    assert "HAVE: model_1.pt" in result.stdout  # every rank can load the checkpoint it resumes from
    assert keys(s3) == {"rl/job42/model_1.pt"}


def test_unreachable_checkpoints_stop_the_node_before_training(s3_endpoint, s3, trainer, tmp_path):
    result = run_node(node_env(s3_endpoint, trainer, tmp_path, STEP="1", CHECKPOINT_URI="s3://no-such-bucket/rl"))
    assert result.returncode == 2 and "ARGS:" not in result.stdout
    assert "cannot restore checkpoints from s3://no-such-bucket/rl/job42/" in result.stderr


def test_a_successful_run_whose_final_upload_fails_is_a_failure(s3_endpoint, s3, trainer, tmp_path):
    go = tmp_path / "go"
    env = node_env(s3_endpoint, trainer, tmp_path, STEP="1", WAIT_FOR=str(go))
    process = subprocess.Popen(
        [str(LAUNCHER), "train.py"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    written = tmp_path / "checkpoints" / "model_1.pt"
    deadline = time.monotonic() + 60
    while not written.exists():  # restored (nothing) and training; the bucket disappears under it
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    s3.delete_bucket(Bucket=BUCKET)
    go.touch()
    _, stderr = process.communicate(timeout=120)
    s3.create_bucket(Bucket=BUCKET)  # for the fixture's clean-up
    assert process.returncode == 1
    assert "final checkpoint upload to s3://checkpoints/rl/job42/ FAILED" in stderr


def test_checkpoint_uri_must_be_s3(trainer, tmp_path):
    result = run_node(node_env("http://127.0.0.1:9", trainer, tmp_path, CHECKPOINT_URI="/mnt/checkpoints"))
    assert result.returncode == 2 and "CHECKPOINT_URI='/mnt/checkpoints' is not an s3:// URI" in result.stderr
