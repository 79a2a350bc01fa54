"""The launcher's side of a Capacity Block's end: the expiry function's TerminateJob reaches the container as
SIGTERM (ECS stops the task), 40 minutes before the block ends; the node uploads its final checkpoint to S3
(here moto's on 127.0.0.1) before it exits, well inside ECS_CONTAINER_STOP_TIMEOUT and so before EC2 starts
terminating the block's instances at T-30."""

from __future__ import annotations

import signal
import time

from tests.test_checkpoints import JOB, body, manifest, node_env, s3, s3_endpoint, start_node, trainer, until

__all__ = ["s3", "s3_endpoint", "trainer"]  # fixtures


def test_the_stop_at_the_blocks_warning_uploads_the_final_checkpoint(s3_endpoint, s3, trainer, tmp_path):
    ready = tmp_path / "ready"
    # The last checkpoint is written after the last periodic sync could take it: only the stop's final
    # upload can (the sync period is an hour).
    plan = f"swap:model_7.pt:weights 7;touch:{ready};wait:{tmp_path / 'never'}"
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan, CHECKPOINT_SYNC_SECONDS="3600")
    node = start_node(env)
    until(ready.exists, node, "the trainer's last checkpoint")
    time.sleep(1)  # past the settle time (0.5 s): the file is whole
    assert manifest(s3) == {}  # nothing uploaded before the stop
    stopped = time.monotonic()
    node.send_signal(signal.SIGTERM)  # what ECS sends the container's first process on TerminateJob
    _, stderr = node.communicate(timeout=60)
    took = time.monotonic() - stopped
    assert node.returncode == 128 + signal.SIGTERM, stderr
    assert set(manifest(s3)) == {"model_7.pt"}, stderr
    assert body(s3, f"{JOB}/node-0/model_7.pt") == b"weights 7"
    # Seconds, against the ten minutes ECS waits before SIGKILL and the ten before EC2 terminates.
    assert took < 60
