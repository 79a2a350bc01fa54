"""What each rehearsal node's container is given of its own (trainctl/rehearsal/runtime.py node_command):
nodes on one machine must not share what each container has alone on Batch."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.hosts import Devices, Host
from trainctl.rehearsal.nodes import NodeRun
from trainctl.rehearsal.runtime import Runtime


def test_each_node_has_its_own_progress_folder_and_flight_recorder_files(tmp_path: Path) -> None:
    spec = JobSpec(fleet="gpu", definition="test", nodes=2, main_node=0, command=("train.py",),
                   environment={"TORCH_FR_DUMP_TEMP_FILE": "/tmp/training-progress/flight-recorder/rank-"},  # noqa: S108
                   attempts=1, retry_rules=(), timeout_seconds=None, name="t")  # fmt: skip
    job = SimpleNamespace(spec=spec, job_id="j", placement=0)
    runtime = Runtime(checkout=tmp_path, s3=SimpleNamespace(endpoint="http://127.0.0.1:1"), python=sys.executable,
                      procs=1)  # type: ignore[arg-type]  # fmt: skip
    envs = []
    for index in (0, 1):
        host = Host(tmp_path / "hosts", index, f"127.0.0.{index + 2}", Devices())
        run = NodeRun(index=index, host=host, folder=tmp_path / f"node-{index}", log_path=tmp_path / f"{index}.log",
                      is_main=index == 0)  # fmt: skip
        envs.append(runtime.node_command(job, 1, run, "127.0.0.2")[1])
    progress = [Path(env["PROGRESS_DIR"]) for env in envs]
    assert progress[0] != progress[1] and all(p.is_relative_to(tmp_path) for p in progress)
    recorders = [env["TORCH_FR_DUMP_TEMP_FILE"] for env in envs]
    assert recorders[0] != recorders[1] and recorders[0].startswith(str(progress[0]))
