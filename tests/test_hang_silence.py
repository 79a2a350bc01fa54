"""Silence is not a hang (container/launcher/progress_signals.py), through the real launcher: a trainer that
goes silent for longer than HANG_SECONDS while a compiler it started burns CPU and then while it saves a
checkpoint finishes untouched, where the same silence spent asleep ends as a hang; and on a real stall, the
rank asleep in user code is named, not its peer waiting for it in a gloo all_reduce, although the sleeper
spoke last. Every address is loopback."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator

import pytest

from tests.local_aws import moto_server
from tests.test_hang_watch import BUCKET, fake_trainer, launcher_line, node_env, s3_client, s3_env, start
from tests.test_launcher import free_port

HANG_SECONDS = 5
# Each silent phase lasts this long: past HANG_SECONDS, so that only a signal other than output keeps the
# node alive (the control run, asleep instead, shows the length alone is a hang).
PHASE_SECONDS = HANG_SECONDS + 2

SILENT = """
import os, subprocess, sys, time
from pathlib import Path

for step in range(5):
    time.sleep(0.1)
    print(f"step {step}", flush=True)
seconds = float(os.environ["FAKE_PHASE_SECONDS"])
if os.environ.get("FAKE_ASLEEP"):
    time.sleep(2 * seconds)
else:
    # A compile: a process the rank started burns CPU while the rank waits for it, printing nothing.
    burn = f"import time\\nend = time.time() + {seconds}\\nwhile time.time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    # A large save into CHECKPOINT_DIR, printing nothing.
    folder = Path(os.environ["CHECKPOINT_DIR"])
    end = time.time() + seconds
    with open(folder / ".model.pt.partial", "wb") as out:
        while time.time() < end:
            out.write(os.urandom(1 << 18))
            out.flush()
            time.sleep(0.1)
    os.replace(folder / ".model.pt.partial", folder / "model.pt")
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def test_a_silent_compile_and_save_longer_than_the_limit_are_left_alone(tmp_path, s3_endpoint):
    runs = {}
    for name, asleep in (("working", ""), ("asleep", "1")):
        folder = tmp_path / name
        env = node_env(folder, "node", HANG_SECONDS=str(HANG_SECONDS), **s3_env(folder, s3_endpoint))
        env |= fake_trainer(folder, 0, "output", steps=0) | {"AWS_BATCH_JOB_ID": f"silent-{name}#0"}
        (folder / "trainer-0.py").write_text(SILENT)
        env |= {"FAKE_PHASE_SECONDS": str(PHASE_SECONDS), "FAKE_ASLEEP": asleep}
        runs[name] = start(env)
    outcomes = {name: (*node.communicate(timeout=120), node.returncode) for name, node in runs.items()}
    out, err, code = outcomes["working"]
    assert code == 0, err
    assert out.endswith("done\n") and "hang:" not in err
    # Not even examined: no stacks dumped, nothing reported.
    assert "no progress for" not in err, err
    _, err, code = outcomes["asleep"]
    assert code == 75, err
    assert "hang: no progress on any node" in launcher_line(err)


GLOO = """
import datetime, os, time
from pathlib import Path
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
timeout = datetime.timedelta(seconds=600)
dist.init_process_group("gloo", init_method=os.environ["FAKE_PG"], rank=rank, world_size=2, timeout=timeout)
for step in range(5):
    dist.all_reduce(torch.ones(1))
    print(f"step {step}", flush=True)
    time.sleep(0.1)


def stalled_in_user_code():
    while True:
        time.sleep(1)


waiting = Path(os.environ["FAKE_WAITING"])
if rank == 0:
    waiting.touch()
    dist.all_reduce(torch.ones(1))  # waits for rank 1, which never comes
else:
    # Rank 1 logs once more after its peer entered the all-reduce: its last progress is the newest.
    while not waiting.exists():
        time.sleep(0.05)
    time.sleep(0.5)
    print("preparing the next batch", flush=True)
    stalled_in_user_code()
"""


def test_the_rank_asleep_in_user_code_is_named_not_its_peer_waiting_in_all_reduce(tmp_path):
    report_port, waiting = free_port(), tmp_path / "rank-0-waiting"
    common = {"AWS_BATCH_JOB_NUM_NODES": "2", "NODE_REPORT_PORT": str(report_port), "AWS_BATCH_JOB_ATTEMPT": "1"}
    common |= {"HANG_SECONDS": "3", "FAKE_PG": f"tcp://127.0.0.1:{free_port()}", "FAKE_WAITING": str(waiting)}
    # torch's import says nothing (its NumPy warning would arm the watch before a torch import that takes
    # longer than this test's 3 s limit on a loaded machine): the first output is the first step.
    common["PYTHONWARNINGS"] = "ignore"
    main_env = node_env(tmp_path, "main", **common) | fake_trainer(tmp_path, 0, "output", steps=0)
    child_env = node_env(tmp_path, "child", **common, AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_ID="hj7#1")
    child_env |= fake_trainer(tmp_path, 1, "output", steps=0) | {"MASTER_PORT": main_env["MASTER_PORT"]}
    for rank in (0, 1):
        (tmp_path / f"trainer-{rank}.py").write_text(GLOO)
    main, child = start(main_env), start(child_env)
    try:
        _, main_err = main.communicate(timeout=120)
        ended = time.time()
    finally:
        child.send_signal(signal.SIGTERM)  # as Batch stops the children once the main node ends
        child.communicate(timeout=60)
        main.kill()
    assert main.returncode == 75, main_err
    line = launcher_line(main_err)
    assert re.match(r"distributed_run\.sh: node 1 \([^)]+\): hang: ", line), line
    assert "rank 1 on node 1 stopped first" in line
    assert "outside any collective while rank 0 waits in one: rank 1 in stalled_in_user_code (trainer-1.py:" in line
    assert "retried" in line and "no word" not in line
    print(f"\nrank 0 waiting -> main node exit 75 {ended - waiting.stat().st_mtime:.1f} s later: {line}")
