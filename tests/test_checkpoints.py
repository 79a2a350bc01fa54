"""The launcher's checkpoints against a real S3 API on 127.0.0.1 (moto's server mode, a versioned
bucket), with faults injected: SIGTERM while a file is half written, SIGKILL during an upload, a
crash right after a save, a child node's shard, a restore followed by a sync with nothing changed,
loud failures. Plus the commit rule's pieces (/proc, inotify) in this process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from boto3.exceptions import S3UploadFailedError

from tests.harness import ROOT
from tests.local_aws import moto_server
from tests.test_launcher import LAUNCHER, base_env

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import checkpoint_sync
from checkpoint_commit import ArrivalWatch, Rule, open_for_writing, process_tree

BUCKET = "checkpoints"
URI = f"s3://{BUCKET}/rl"
JOB = "rl/job42"
FAULTS = Path(__file__).with_name("checkpoint_faults.py")
# The interpreter that runs the copier; CHECKPOINT_TEST_PYTHON=<a Python 3.10 with boto3> checks it
# on the oldest interpreter the images ship.
COPIER_PYTHON = os.environ.get("CHECKPOINT_TEST_PYTHON", sys.executable)

# A stand-in for torchrun and its workers: prints its arguments and the files it found, then runs
# TRAIN_PLAN, steps separated by ";":
#   put:NAME:TEXT   write NAME in place          swap:NAME:TEXT  write NAME.tmp, rename it to NAME
#   touch:PATH      create PATH (a milestone)    wait:PATH       wait until PATH exists
#   rm:NAME         remove NAME (a file, or a folder and what is in it)
#   nap:SECONDS     sleep (the time a save takes between two files)
#   slow:NAME       keep writing NAME in place, a chunk every 20 ms, until killed
#   inplace:NAME    save NAME in place every 0.15 s, as torch.save does (same inode), until killed: "epoch N
#                   begin", 50 ms, "epoch N end"
#   exit:N          exit with status N (default: 0 after the last step)
TRAINER = """#!{python}
import os, shutil, sys, time
print("ARGS:", " ".join(sys.argv[1:]), flush=True)
directory = os.environ["CHECKPOINT_DIR"]
for name in sorted(os.listdir(directory)):
    print("HAVE:", name, flush=True)
for step in filter(None, os.environ.get("TRAIN_PLAN", "").split(";")):
    verb, _, rest = step.partition(":")
    name, _, text = rest.partition(":")
    target = os.path.join(directory, name)
    if verb in ("put", "swap", "slow", "inplace"):
        os.makedirs(os.path.dirname(target), exist_ok=True)
    if verb == "put":
        with open(target, "w") as f:
            f.write(text)
    elif verb == "swap":
        with open(target + ".tmp", "w") as f:
            f.write(text)
        os.replace(target + ".tmp", target)
    elif verb == "touch":
        open(name, "w").close()
    elif verb == "nap":
        time.sleep(float(name))
    elif verb == "rm":
        if os.path.isdir(target):
            shutil.rmtree(target)
        else:
            os.remove(target)
    elif verb == "wait":
        while not os.path.exists(name):
            time.sleep(0.02)
    elif verb == "slow":
        with open(target, "w") as f:
            while True:
                f.write("x" * 1000)
                f.flush()
                time.sleep(0.02)
    elif verb == "inplace":
        epoch = 0
        while True:
            epoch += 1
            with open(target, "w") as f:
                f.write("epoch %d begin\\n" % epoch)
                f.flush()
                time.sleep(0.05)
                f.write("epoch %d end\\n" % epoch)
            time.sleep(0.1)
    elif verb == "exit":
        sys.exit(int(name))
"""


@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_server() as endpoint:
        yield endpoint


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
    # Versioned, as the stack's checkpoint bucket is.
    client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    yield client
    versions = client.list_object_versions(Bucket=BUCKET)
    for item in versions.get("Versions", []) + versions.get("DeleteMarkers", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"], VersionId=item["VersionId"])
    client.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def trainer(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(python=sys.executable))
    script.chmod(0o755)
    return str(script)


def keys(s3) -> set[str]:
    return {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def versions(s3) -> list[tuple[str, str]]:
    """Every version of every checkpoint file (not of the manifests, which every sync writes with its time)."""
    found = s3.list_object_versions(Bucket=BUCKET).get("Versions", [])
    return sorted((v["Key"], v["VersionId"]) for v in found if not v["Key"].endswith(".manifest.json"))


def manifest(s3, node: int = 0) -> dict:
    return document(s3, node).get("files", {})


def document(s3, node: int = 0) -> dict:
    """A node's whole manifest: its files and its word (checkpoint_sets.py)."""
    try:
        body = s3.get_object(Bucket=BUCKET, Key=f"{JOB}/node-{node}.manifest.json")["Body"].read()
    except s3.exceptions.NoSuchKey:
        return {}
    return json.loads(body)


def body(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def node_env(s3_endpoint: str, trainer: str, workdir: Path, *, index: int = 0, **extra: str) -> dict[str, str]:
    env = base_env(
        PYTHON=trainer,
        CHECKPOINT_PYTHON=COPIER_PYTHON,
        NPROC_PER_NODE="1",
        AWS_BATCH_JOB_NUM_NODES="2",
        AWS_BATCH_JOB_NODE_INDEX=str(index),
        AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
        AWS_BATCH_JOB_ID=f"job42#{index}",
        MASTER_ADDR="127.0.0.1",
        CHECKPOINT_URI=URI,
        # A fresh container per attempt: nothing survives locally.
        CHECKPOINT_DIR=str(workdir / "checkpoints"),
        CHECKPOINT_SYNC_SECONDS="0.2",
        CHECKPOINT_SETTLE_SECONDS="0.5",
        # A crash here is the trainer's own: no child reports and no Xid to wait for (the launcher's
        # grace for them is tests/test_node_faults.py's subject), so the node exits at once.
        NODE_VERDICT_SECONDS="0",
        XID_SETTLE_SECONDS="0",
        AWS_ENDPOINT_URL=s3_endpoint,
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",  # noqa: S106 - moto accepts any key
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=str(workdir / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(workdir / "none"),
    )
    env.update(extra)
    return env


def start_node(env: dict[str, str]) -> subprocess.Popen:
    # Its own process group, as a container is: a fault can kill all of it at once.
    return subprocess.Popen(
        [str(LAUNCHER), "train.py"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_node(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCHER), "train.py"], env=env, capture_output=True, text=True, timeout=120)


def until(condition, process: subprocess.Popen, what: str, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no {what} within {limit} s"
        time.sleep(0.05)


def lose_host(node: subprocess.Popen, tmp_path: Path) -> None:
    """SIGKILL all of a node, as a lost host ends it: its process group, and the stand-in trainer, which the
    launcher starts in a session of its own (found by its path under `tmp_path`)."""
    os.killpg(node.pid, signal.SIGKILL)
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(tmp_path).encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def have(result) -> set[str]:
    return {line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("HAVE: ")}


def test_sigterm_while_a_file_is_half_written_restores_the_previous_checkpoint(s3_endpoint, s3, trainer, tmp_path):
    plan = "put:model_1.pt:weights 1;touch:{ready};slow:model_2.pt".format(ready=tmp_path / "ready")
    # A settle time that a stalled writer on a busy test machine does not outlast.
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan, CHECKPOINT_SETTLE_SECONDS="1")
    node = start_node(env)
    until(lambda: "model_1.pt" in manifest(s3), node, "upload of model_1.pt")
    until(lambda: (tmp_path / "a1/checkpoints/model_2.pt").exists(), node, "start of model_2.pt")
    node.send_signal(signal.SIGTERM)  # what ECS sends the container's first process
    _, stderr = node.communicate(timeout=60)
    assert node.returncode == 128 + signal.SIGTERM, stderr  # the trainer's status: killed by the TERM
    assert set(manifest(s3)) == {"model_1.pt"}
    assert f"{JOB}/node-0/model_2.pt" not in keys(s3)  # torn: never uploaded
    before, listed = versions(s3), manifest(s3)

    # The retry (same job id, empty container) gets the last complete checkpoint.
    retry = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2", RESUME_ARGS="--resume", RESUME_GLOB="model_*.pt"))
    assert retry.returncode == 0, retry.stderr
    assert have(retry) == {"model_1.pt"} and "train.py --resume" in retry.stdout
    restored = tmp_path / "a2/checkpoints/model_1.pt"
    assert restored.read_text() == "weights 1"
    # Its mtime is the one it was uploaded with, so the retry's syncs found nothing to upload.
    assert restored.stat().st_mtime_ns == (tmp_path / "a1/checkpoints/model_1.pt").stat().st_mtime_ns
    assert versions(s3) == before, retry.stderr  # nothing uploaded again
    assert manifest(s3) == listed  # the same versions listed, with the times they were first listed

    # Through an interpreter wrapper that prints first (Isaac Sim's python.sh can), and with a
    # RESUME_GLOB that no restored file matches: the files come back, the script does not resume.
    chatty = tmp_path / "chatty-python"
    chatty.write_text(f'#!/bin/sh\necho "Isaac Sim python environment"\nexec {COPIER_PYTHON} "$@"\n')
    chatty.chmod(0o755)
    env = node_env(s3_endpoint, trainer, tmp_path / "a3", RESUME_ARGS="--resume", RESUME_GLOB="*.ckpt")
    third = run_node({**env, "CHECKPOINT_PYTHON": str(chatty)})
    assert third.returncode == 0, third.stderr
    assert have(third) == {"model_1.pt"} and "--resume" not in third.stdout


def test_a_file_rewritten_in_place_reaches_s3_while_training_and_a_stop_leaves_a_whole_copy(
    s3_endpoint, s3, trainer, tmp_path
):
    """PyTorch's DDP tutorial saves snapshot.pt in place every epoch: with the default 30 s settle it is
    never unchanged long enough, and its copy taken at a close is what reaches S3 (checkpoint_snapshots.py).
    The stop kills the writer mid-save as often as not: the kernel's close of a torn file is not trusted."""
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN="inplace:snapshot.pt")
    node = start_node({**env, "CHECKPOINT_SETTLE_SECONDS": "30", "CHECKPOINT_SYNC_SECONDS": "1"})
    until(lambda: "snapshot.pt" in manifest(s3), node, "upload of snapshot.pt while it is rewritten")
    uploaded = body(s3, f"{JOB}/node-0/snapshot.pt").decode()
    assert re.fullmatch(r"epoch (\d+) begin\nepoch \1 end\n", uploaded), uploaded
    time.sleep(1.0)
    node.send_signal(signal.SIGTERM)
    _, stderr = node.communicate(timeout=60)
    assert node.returncode == 128 + signal.SIGTERM, stderr

    retry = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2"))
    assert retry.returncode == 0, retry.stderr
    restored = (tmp_path / "a2/checkpoints/snapshot.pt").read_text()
    whole = re.fullmatch(r"epoch (\d+) begin\nepoch \1 end\n", restored)
    assert whole, restored
    assert int(whole.group(1)) >= int(uploaded.split()[1])  # the stop's upload is not older than the first


def test_a_checkpoint_rotated_away_stays_restorable_until_the_next_one_is_committed(s3_endpoint, s3, trainer, tmp_path):
    """Trainer's save_total_limit=1: the new folder is written in place and, once it is saved, the old one is
    removed. Until every file of the new one is committed, the manifest keeps the old one, so a node lost in
    that window still has a checkpoint to resume from; once it is, the old one leaves the manifest."""
    go, hold = tmp_path / "go", tmp_path / "hold"
    plan = (
        f"put:checkpoint-1/model.safetensors:m1;put:checkpoint-1/trainer_state.json:s1;wait:{go};"
        f"put:checkpoint-2/model.safetensors:m2;put:checkpoint-2/trainer_state.json:s2;rm:checkpoint-1;wait:{hold}"
    )
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan, CHECKPOINT_SETTLE_SECONDS="3")
    node = start_node(env)
    first = {"checkpoint-1/model.safetensors", "checkpoint-1/trainer_state.json"}
    until(lambda: set(manifest(s3)) == first, node, "the first checkpoint's upload")
    go.touch()
    until(lambda: not (tmp_path / "a1/checkpoints/checkpoint-1").exists(), node, "the rotation")
    time.sleep(1.0)  # syncs every 0.2 s; checkpoint-2 settles 3 s after its writes
    assert set(manifest(s3)) == first  # the old one is still the restorable one
    second = {"checkpoint-2/model.safetensors", "checkpoint-2/trainer_state.json"}
    until(lambda: set(manifest(s3)) == second, node, "the second checkpoint, and the first one gone")
    hold.touch()
    _, stderr = node.communicate(timeout=60)
    assert node.returncode == 0, stderr


def test_a_node_lost_between_a_rotation_and_the_next_commit_resumes_from_the_rotated_checkpoint(
    s3_endpoint, s3, trainer, tmp_path
):
    go = tmp_path / "go"
    plan = (
        f"put:checkpoint-1/model.pt:m1;wait:{go};put:checkpoint-2/model.pt:m2;rm:checkpoint-1;"
        f"touch:{tmp_path / 'rotated'};wait:{tmp_path / 'never'}"
    )
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan, CHECKPOINT_SETTLE_SECONDS="5")
    node = start_node(env)
    until(lambda: "checkpoint-1/model.pt" in manifest(s3), node, "the first checkpoint's upload")
    go.touch()
    until(lambda: (tmp_path / "rotated").exists(), node, "the rotation")
    time.sleep(1.0)  # a few syncs (every 0.2 s), all before checkpoint-2 settles
    lose_host(node, tmp_path)
    node.communicate(timeout=60)
    retry = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2"))
    assert retry.returncode == 0, retry.stderr
    assert (tmp_path / "a2/checkpoints/checkpoint-1/model.pt").read_text() == "m1"


def test_a_folder_a_lost_host_left_half_written_is_never_restored(s3_endpoint, s3, trainer, tmp_path):
    """Trainer's checkpoint-N/: the weights are written and settle while the optimizer state is still being
    written; the host is lost then. The retry gets the last whole folder, not the weights alone."""
    go = tmp_path / "go"
    plan = (
        f"put:checkpoint-1/model.safetensors:m1;put:checkpoint-1/trainer_state.json:s1;wait:{go};"
        "put:checkpoint-2/model.safetensors:m2;nap:0.5;slow:checkpoint-2/optimizer.pt"
    )
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan, CHECKPOINT_SETTLE_SECONDS="1")
    node = start_node(env)
    first = {"checkpoint-1/model.safetensors", "checkpoint-1/trainer_state.json"}
    until(lambda: set(manifest(s3)) == first, node, "the first checkpoint's upload")
    go.touch()
    until(lambda: (tmp_path / "a1/checkpoints/checkpoint-2/optimizer.pt").exists(), node, "the second save")
    time.sleep(3.0)  # the weights settled 1 s after they were written; syncs every 0.2 s
    assert set(manifest(s3)) == first
    lose_host(node, tmp_path)  # mid-save
    node.communicate(timeout=60)
    # Its last word says it was still writing checkpoint-2/, and when it last looked.
    lost = document(s3)
    assert list(lost["pending"]) == ["checkpoint-2"] and 0 < time.time() - lost["written_at"] < 5
    # Since when, at the latest: the look before the one that first found its first file (the weights) in
    # progress, a sync period (0.2 s here) or so before they were written.
    weights = (tmp_path / "a1/checkpoints/checkpoint-2/model.safetensors").stat().st_mtime
    assert weights - 2 <= lost["pending"]["checkpoint-2"] <= weights and lost["final"] is False
    # Each file keeps the fields a format-1 reader of an older release knows; when it was listed sits beside.
    assert all(set(entry) == {"size", "mtime_ns", "version_id"} for entry in lost["files"].values())
    assert set(lost["listed"]) == set(first)
    retry = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2"))
    assert retry.returncode == 0, retry.stderr
    restored = tmp_path / "a2/checkpoints"
    assert sorted(p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()) == sorted(first)
    # The retry's word: nothing in progress, the span from that last word to its own first sync unseen, and
    # checkpoint-2/ unfinished until then.
    after = document(s3)
    began = after["blind"][0][1]
    assert after["pending"] == {} and after["blind"] == [[lost["written_at"], began]]
    assert after["unfinished"] == [["checkpoint-2", lost["pending"]["checkpoint-2"], began]]
    assert lost["written_at"] < began <= after["written_at"]
    assert after["final"] is True  # its trainer had ended when the last walk began: no blind span follows


def test_resume_names_the_run_folder_of_the_newest_model(s3_endpoint, s3, trainer, tmp_path):
    # As Isaac Lab writes them: every rank a run folder of its own (named by the second it started),
    # the model only in rank 0's. The newest folder by name holds no model.
    plan = "swap:2026-11-23_10-00-01/model_1.pt:weights 1;swap:2026-11-23_10-00-02/params/agent.yaml:cfg"
    first = run_node(node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan))
    assert first.returncode == 0, first.stderr
    resume = {"RESUME_ARGS": "--resume --load_run={resume_dir}", "RESUME_GLOB": "model_*.pt"}
    retry = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2", **resume))
    assert retry.returncode == 0, retry.stderr
    assert "train.py --resume --load_run=2026-11-23_10-00-01" in retry.stdout
    # A folder in the pattern would never match a file name: refused, not silently never resuming.
    bad = run_node(node_env(s3_endpoint, trainer, tmp_path / "a3", **resume | {"RESUME_GLOB": "*/model_*.pt"}))
    assert bad.returncode == 2 and "is a file-name pattern" in bad.stderr


def test_sigkill_during_an_upload_leaves_the_last_complete_set(s3_endpoint, s3, trainer, tmp_path):
    go = tmp_path / "go"
    plan = f"put:latest.pt:v1;put:model_1.pt:m1;wait:{go};put:latest.pt:v2;put:model_2.pt:m2;wait:{tmp_path}/never"
    # The 3rd upload is latest.pt v2: the whole container dies right after it reached S3.
    faulty = tmp_path / "faulty_python.sh"
    faulty.write_text(f'#!/bin/sh\nexec "{COPIER_PYTHON}" "{FAULTS}" "$@"\n')
    faulty.chmod(0o755)
    env = node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN=plan, CHECKPOINT_PYTHON=str(faulty))
    # A closed file is uploaded once it has settled, not at the next poll (ten minutes away here).
    node = start_node({**env, "KILL_AFTER_UPLOADS": "3", "CHECKPOINT_SYNC_SECONDS": "600"})
    until(lambda: set(manifest(s3)) == {"latest.pt", "model_1.pt"}, node, "first set", limit=60)
    go.touch()
    node.communicate(timeout=60)
    assert node.returncode == -signal.SIGKILL
    assert body(s3, f"{JOB}/node-0/latest.pt") == b"v2"  # the newest object: uploaded, never listed

    retry = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2"))
    assert retry.returncode == 0, retry.stderr
    assert have(retry) == {"latest.pt", "model_1.pt"}
    assert (tmp_path / "a2/checkpoints/latest.pt").read_text() == "v1"  # the version the manifest names


def test_after_a_crash_renamed_files_count_and_fresh_in_place_writes_do_not(s3_endpoint, s3, trainer, tmp_path):
    go = tmp_path / "go"
    plan = f"put:first.pt:1;wait:{go};swap:renamed.pt:2;put:inplace.pt:3;exit:3"
    # The old variable still sets the interval: 0.005 minutes = 0.3 s.
    env = node_env(s3_endpoint, trainer, tmp_path, TRAIN_PLAN=plan, CHECKPOINT_SYNC_MINUTES="0.005")
    del env["CHECKPOINT_SYNC_SECONDS"]
    node = start_node(env)
    until(lambda: "first.pt" in manifest(s3), node, "periodic upload while training runs")
    go.touch()
    _, stderr = node.communicate(timeout=60)
    assert node.returncode == 3, stderr  # the trainer's status
    # Written in place within the settle time before the crash: maybe torn, not trusted.
    assert set(manifest(s3)) == {"first.pt", "renamed.pt"}
    assert f"{JOB}/node-0/inplace.pt" not in keys(s3)


def test_each_node_uploads_its_own_files_and_restores_every_nodes(s3_endpoint, s3, trainer, tmp_path):
    child_env = {"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "127.0.0.1"}

    def attempt(name: str, plan: str = "") -> list[subprocess.Popen]:
        return [
            start_node(node_env(s3_endpoint, trainer, tmp_path / f"{name}-0", TRAIN_PLAN=plan.format(i=0))),
            start_node(
                node_env(
                    s3_endpoint, trainer, tmp_path / f"{name}-1", index=1, TRAIN_PLAN=plan.format(i=1), **child_env
                )
            ),
        ]

    first = attempt("a1", "put:shard_{i}.pt:rank {i};put:model_{i}.pt:model;put:snapshot.pt:node {i}")
    for node in first:
        node.communicate(timeout=60)
        assert node.returncode == 0
    assert set(manifest(s3, 0)) == {"shard_0.pt", "model_0.pt", "snapshot.pt"}
    assert set(manifest(s3, 1)) == {"shard_1.pt", "model_1.pt", "snapshot.pt"}
    assert body(s3, f"{JOB}/node-1/shard_1.pt") == b"rank 1"

    main, child = attempt("a2")
    main_out, _ = main.communicate(timeout=60)
    child_out, _ = child.communicate(timeout=60)
    assert main.returncode == 0 and child.returncode == 0
    # Every node gets every node's files back: ranks join the rendezvous in any order, so rank 0's files (what
    # rank-0-only savers write) may be on a child, and a rank may read another rank's shard.
    everything = {f"HAVE: {name}" for name in ("model_0.pt", "shard_0.pt", "model_1.pt", "shard_1.pt", "snapshot.pt")}
    assert {line for line in main_out.splitlines() if line.startswith("HAVE")} == everything
    assert {line for line in child_out.splitlines() if line.startswith("HAVE")} == everything
    assert (tmp_path / "a2-0/checkpoints/shard_1.pt").read_text() == "rank 1"
    # A name every node saved (each node's local rank 0): each node gets its own version.
    assert (tmp_path / "a2-0/checkpoints/snapshot.pt").read_text() == "node 0"
    assert (tmp_path / "a2-1/checkpoints/snapshot.pt").read_text() == "node 1"
    assert set(manifest(s3, 1)) == {"shard_1.pt", "model_1.pt", "snapshot.pt"}  # others' files not copied
    assert set(manifest(s3, 0)) == {"shard_0.pt", "model_0.pt", "snapshot.pt"}


def test_a_resubmitted_job_resumes_its_lineage_under_a_new_job_id(s3_endpoint, s3, trainer, tmp_path):
    """The capacity fallback resubmits a job under a new id with CHECKPOINT_LINEAGE = the original's id
    (training_constructs/jobs/capacity_fallback/resubmit.py): the successor restores and extends the
    original's set; without the lineage it would start from nothing."""
    first = run_node(node_env(s3_endpoint, trainer, tmp_path / "a1", TRAIN_PLAN="swap:model_1.pt:weights 1"))
    assert first.returncode == 0, first.stderr

    successor = {"AWS_BATCH_JOB_ID": "job77#0", "RESUME_ARGS": "--resume"}
    alone = run_node(node_env(s3_endpoint, trainer, tmp_path / "alone", **successor))
    assert alone.returncode == 0 and have(alone) == set() and "--resume" not in alone.stdout
    before = versions(s3)

    plan = {"TRAIN_PLAN": "swap:model_2.pt:weights 2"}
    resumed = run_node(node_env(s3_endpoint, trainer, tmp_path / "a2", CHECKPOINT_LINEAGE="job42", **successor, **plan))
    assert resumed.returncode == 0, resumed.stderr
    assert have(resumed) == {"model_1.pt"} and "train.py --resume" in resumed.stdout
    assert (tmp_path / "a2/checkpoints/model_1.pt").read_text() == "weights 1"
    # It keeps writing the lineage's manifest: one new file, the restored one not uploaded again.
    assert set(manifest(s3)) == {"model_1.pt", "model_2.pt"}
    added = sorted(set(versions(s3)) - set(before))
    assert [key for key, _ in added] == [f"{JOB}/node-0/model_2.pt"]


@pytest.mark.parametrize("lineage", ["job42/../other", "a b", "x" * 129, "job42\nnext"])
def test_a_lineage_that_is_no_plain_id_is_refused_in_one_line(trainer, tmp_path, lineage):
    result = run_node(node_env("http://127.0.0.1:9", trainer, tmp_path, CHECKPOINT_LINEAGE=lineage))
    assert result.returncode == 2 and "ARGS:" not in result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith("distributed_run.sh: CHECKPOINT_LINEAGE=") and len(line) <= 200
    assert "is not a lineage id: 1 to 128 letters, digits, '-' or '_'" in line


def test_unreachable_checkpoints_stop_the_node_before_training(s3_endpoint, s3, trainer, tmp_path):
    result = run_node(node_env(s3_endpoint, trainer, tmp_path, CHECKPOINT_URI="s3://no-such-bucket/rl"))
    assert result.returncode == 2 and "ARGS:" not in result.stdout
    assert "cannot restore checkpoints from s3://no-such-bucket/rl/job42/" in result.stderr


def test_a_successful_run_whose_final_upload_fails_is_a_failure(s3_endpoint, s3, trainer, tmp_path):
    go, started = tmp_path / "go", tmp_path / "started"
    plan = f"touch:{started};wait:{go};put:model_1.pt:1"
    node = start_node(node_env(s3_endpoint, trainer, tmp_path, TRAIN_PLAN=plan, CHECKPOINT_SYNC_SECONDS="60"))
    until(started.exists, node, "training")  # restored (nothing); the bucket disappears under it
    s3.delete_bucket(Bucket=BUCKET)
    go.touch()
    _, stderr = node.communicate(timeout=60)
    s3.create_bucket(Bucket=BUCKET)  # for the fixture's clean-up
    assert node.returncode == 1, stderr
    assert "final checkpoint upload to s3://checkpoints/rl/job42/ FAILED" in stderr


def test_checkpoint_uri_must_be_s3(trainer, tmp_path):
    result = run_node(node_env("http://127.0.0.1:9", trainer, tmp_path, CHECKPOINT_URI="/mnt/checkpoints"))
    assert result.returncode == 2 and "CHECKPOINT_URI='/mnt/checkpoints' is not an s3:// URI" in result.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"CHECKPOINT_SYNC_SECONDS": "0"}, "CHECKPOINT_SYNC_SECONDS='0' is not a positive number"),
        ({"CHECKPOINT_SYNC_SECONDS": "", "CHECKPOINT_SYNC_MINUTES": "soon"}, "CHECKPOINT_SYNC_MINUTES='soon'"),
        ({"CHECKPOINT_SETTLE_SECONDS": "-1"}, "CHECKPOINT_SETTLE_SECONDS='-1' is not a number of seconds"),
    ],
)
def test_bad_sync_settings_are_refused_before_anything_runs(trainer, tmp_path, setting, message):
    result = run_node(node_env("http://127.0.0.1:9", trainer, tmp_path, **setting))
    assert result.returncode == 2 and message in result.stderr and "ARGS:" not in result.stdout


# The commit rule's pieces, in this process.


def test_files_open_for_writing_are_found_in_the_process_tree(tmp_path):
    (tmp_path / "reading").write_text("x")
    script = f"exec 3>'{tmp_path}/writing'; exec 4<'{tmp_path}/reading'; touch '{tmp_path}/ready'; exec sleep 30"
    child = subprocess.Popen(["/bin/sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "ready").exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert child.pid in process_tree(os.getpid())
        # Open for reading ("reading") or closed ("ready") is not writing.
        assert open_for_writing(process_tree(os.getpid()), tmp_path.resolve()) == {tmp_path.resolve() / "writing"}
        assert open_for_writing(process_tree(child.pid), tmp_path.resolve() / "elsewhere") == set()
    finally:
        child.kill()
        child.wait()
    assert open_for_writing(process_tree(child.pid), tmp_path.resolve()) == set()


def test_a_file_renamed_into_place_appeared_whole_and_one_written_in_place_did_not(tmp_path):
    (tmp_path / "run").mkdir()
    watch = ArrivalWatch(tmp_path)
    assert watch.active
    (tmp_path / "run" / "model.tmp").write_text("complete")
    os.replace(tmp_path / "run" / "model.tmp", tmp_path / "run" / "model.pt")
    (tmp_path / "inplace.pt").write_text("maybe torn")
    (tmp_path / "new").mkdir()  # created after the watch started: watched too
    (tmp_path / "new" / "a.tmp").write_text("a")
    assert watch.drain() == (1, 2)  # model.pt arrived; model.tmp and inplace.pt were closed after writing
    os.replace(tmp_path / "new" / "a.tmp", tmp_path / "new" / "a.pt")
    assert watch.drain() == (1, 0)
    for path, whole in (
        (tmp_path / "run/model.pt", True),
        (tmp_path / "inplace.pt", False),
        (tmp_path / "new/a.pt", True),
    ):
        assert watch.appeared_whole(path, path.stat()) is whole, path
    # A whole directory written elsewhere and moved in (the tmp-dir-then-rename savers): all of it.
    (tmp_path.parent / f"{tmp_path.name}-staging").mkdir()
    (tmp_path.parent / f"{tmp_path.name}-staging" / "shard.pt").write_text("s")
    (tmp_path.parent / f"{tmp_path.name}-staging").rename(tmp_path / "step_2")
    watch.drain()
    assert watch.appeared_whole(tmp_path / "step_2/shard.pt", (tmp_path / "step_2/shard.pt").stat())
    (tmp_path / "run" / "model.pt").write_text("rewritten in place, longer")  # no longer what arrived
    assert not watch.appeared_whole(tmp_path / "run/model.pt", (tmp_path / "run/model.pt").stat())


def test_the_watch_orders_files_by_creation_and_forgets_what_left(tmp_path):
    watch = ArrivalWatch(tmp_path)
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "model.safetensors").write_text("w")  # before the folder's watch exists
    watch.drain()
    (tmp_path / "checkpoint-5" / "optimizer.pt").write_text("o")
    (tmp_path / "log.txt").write_text("l")
    watch.drain()
    created = watch.created
    model, optimizer = tmp_path / "checkpoint-5/model.safetensors", tmp_path / "checkpoint-5/optimizer.pt"
    assert created[model] < created[optimizer] < created[tmp_path / "log.txt"]
    (tmp_path / "log.txt").unlink()
    (tmp_path / "checkpoint-5").rename(tmp_path.parent / f"{tmp_path.name}-elsewhere")  # moved away whole
    watch.drain()
    assert watch.created == {}
    assert watch.take()[1] == [tmp_path / "log.txt"]


def test_the_settle_time_counts_back_from_the_stop(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    stat = path.stat()
    written = stat.st_mtime_ns / 1e9
    running = Rule(settle_seconds=30)
    assert not running.complete(stat, open_now=False, whole=False, now=written + 29)
    assert running.complete(stat, open_now=False, whole=False, now=written + 31)
    assert not running.complete(stat, open_now=True, whole=False, now=written + 3600)
    assert running.complete(stat, open_now=False, whole=True, now=written)
    stopped = Rule(settle_seconds=30, stopped_at=written + 10)
    assert not stopped.complete(stat, open_now=False, whole=False, now=written + 3600)
    assert stopped.complete(stat, open_now=False, whole=True, now=written + 3600)
    assert Rule(settle_seconds=30, stopped_at=written + 31).complete(stat, open_now=False, whole=False, now=0)
    assert Rule(settle_seconds=30, clean_exit=True).complete(stat, open_now=True, whole=False, now=written)


def test_a_manifest_this_release_cannot_read_is_one_line_not_a_traceback(
    s3_endpoint, s3, tmp_path, monkeypatch, capsys
):
    import checkpoint_sync

    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    args = ["restore", "--uri", f"{URI}/job42/", "--node", "0", "--main", "0", "--state-dir", str(tmp_path)]
    for document in ({"format": 1, "files": {"model_1.pt": {"size": 1, "sha256": "x"}}}, {"format": 1}, [1]):
        s3.put_object(Bucket=BUCKET, Key=f"{JOB}/node-0.manifest.json", Body=json.dumps(document).encode())
        assert checkpoint_sync.main([*args, str(tmp_path / "restore")]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("checkpoint_sync: restore failed: ") and "manifest" in line


def test_a_refused_upload_is_an_error_the_copier_handles():
    # boto3's transfers wrap a refused upload in S3UploadFailedError, which is no botocore error.
    assert issubclass(S3UploadFailedError, checkpoint_sync.ERRORS)


def test_a_final_upload_that_s3_throttles_is_tried_again_until_it_lands(trainer, tmp_path):
    # S3 answers 503 SlowDown to every request for a while (the rehearsal's local S3 can): the last upload
    # backs off and retries instead of failing the attempt. (The catalog's s3-slowdown entry found it.)
    from trainctl.rehearsal.local_s3 import LocalS3

    local = LocalS3()
    local.start()
    try:
        local.create_bucket(BUCKET)
        go, started = tmp_path / "go", tmp_path / "started"
        plan = f"touch:{started};wait:{go};put:model_1.pt:1"
        env = node_env(local.endpoint, trainer, tmp_path, TRAIN_PLAN=plan, CHECKPOINT_SYNC_SECONDS="60")
        node = start_node(env)
        until(started.exists, node, "training")
        time.sleep(1.5)  # the copier has read the manifests and waits for files
        local.slow_down(3)
        go.touch()
        _, stderr = node.communicate(timeout=60)
        assert node.returncode == 0, stderr
        assert "S3 asked to retry; final upload again in 1 s" in stderr and local.throttled > 0
        assert "final upload: 1 files" in stderr
        assert local.manifest_files(BUCKET, "rl/job42/") == ["model_1.pt"]
    finally:
        local.stop()


def test_the_rehearsal_counts_a_checkpoint_folder_once_whichever_nodes_list_its_files():
    """`checkpoint:K` counts checkpoints, not files: a DCP step every rank writes a file of is one."""
    from trainctl.rehearsal.local_s3 import LocalS3

    local = LocalS3()
    local.start()
    try:
        local.create_bucket(BUCKET)
        for node, files in (
            (0, ["step-10/.metadata", "step-10/__0_0.distcp", "snapshot.pt"]),
            (1, ["step-10/__1_0.distcp"]),
        ):
            document = {"format": 1, "files": {name: {"size": 1, "mtime_ns": 1, "version_id": None} for name in files}}
            local.client().put_object(Bucket=BUCKET, Key=f"{JOB}/node-{node}.manifest.json", Body=json.dumps(document))
        assert local.manifest_files(BUCKET, f"{JOB}/") == ["snapshot.pt", "step-10/"]
    finally:
        local.stop()


def test_the_rehearsal_counts_each_save_of_a_file_saved_again_in_place(tmp_path):
    """`checkpoint:K` on a file saved in place (PyTorch's DDP tutorial) fires at its K-th save in S3."""
    from types import SimpleNamespace

    from trainctl.rehearsal.local_s3 import LocalS3
    from trainctl.rehearsal.runtime import Runtime

    local = LocalS3()
    local.start()
    try:
        local.create_bucket(BUCKET)
        runtime = Runtime(checkout=tmp_path, s3=local, python=sys.executable, procs=1)
        job = SimpleNamespace(
            spec=SimpleNamespace(environment={"CHECKPOINT_URI": URI}), job_id="job43", checkpoint_saves={}
        )

        def save(mtime_ns: int) -> list[str]:
            files = {
                "snapshot.pt": {"size": 1, "mtime_ns": mtime_ns, "version_id": None},
                "step-1/a": {"size": 1, "mtime_ns": mtime_ns, "version_id": None},
            }
            body = json.dumps({"format": 1, "files": files})
            # Moto's buckets outlive a server in this process: a lineage no other test writes.
            local.client().put_object(Bucket=BUCKET, Key="rl/job43/node-0.manifest.json", Body=body)
            return runtime.checkpoints(job)

        assert save(100) == ["snapshot.pt", "step-1/"]
        assert save(100) == ["snapshot.pt", "step-1/"]  # the same save, looked at again
        assert save(200) == ["snapshot.pt", "snapshot.pt (save 2)", "step-1/"]
        assert save(300)[:3] == ["snapshot.pt", "snapshot.pt (save 2)", "snapshot.pt (save 3)"]
    finally:
        local.stop()
