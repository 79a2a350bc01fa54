"""The launcher's side of a Capacity Block's end: the expiry function's TerminateJob reaches the container as
SIGTERM (ECS stops the task) 40 minutes before the block ends. The training script saves a last checkpoint
when it gets the TERM; the node uploads it to S3 (here moto's on 127.0.0.1) before it exits, in seconds, well
inside ECS_CONTAINER_STOP_TIMEOUT and so before EC2 starts terminating the block's instances at T-30."""

from __future__ import annotations

import signal
import sys
import time

from tests.test_checkpoints import JOB, body, manifest, node_env, s3, s3_endpoint, start_node, until

__all__ = ["s3", "s3_endpoint"]  # fixtures

# A stand-in for torchrun and a script that checkpoints on SIGTERM, as a training script for preemptible
# capacity does: it saves step 100, says so, and trains until stopped; on the TERM it saves step 120
# (written aside, then renamed into place) and exits with the TERM's status.
SAVES_ON_TERM = """#!{python}
import os, signal, sys, time
directory = os.environ["CHECKPOINT_DIR"]
os.makedirs(directory, exist_ok=True)
def save(name, text):
    with open(os.path.join(directory, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))
def stop(signum, frame):
    save("step_120.pt", "weights at the stop")
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
save("step_100.pt", "weights 100")
while True:
    time.sleep(0.05)
"""


def test_the_stop_at_the_blocks_warning_uploads_the_checkpoint_saved_on_the_term(s3_endpoint, s3, tmp_path):
    trainer = tmp_path / "trainer.py"
    trainer.write_text(SAVES_ON_TERM.format(python=sys.executable))
    trainer.chmod(0o755)
    node = start_node(node_env(s3_endpoint, str(trainer), tmp_path / "a1"))
    until(lambda: "step_100.pt" in manifest(s3), node, "the upload of step 100")
    stopped = time.monotonic()
    node.send_signal(signal.SIGTERM)  # what ECS sends the container's first process on TerminateJob
    _, stderr = node.communicate(timeout=60)
    took = time.monotonic() - stopped
    assert node.returncode == 128 + signal.SIGTERM, stderr
    assert set(manifest(s3)) == {"step_100.pt", "step_120.pt"}, stderr
    assert body(s3, f"{JOB}/node-0/step_120.pt") == b"weights at the stop"
    # Seconds, against the ten minutes ECS waits before SIGKILL and the ten before EC2 terminates.
    assert took < 60
