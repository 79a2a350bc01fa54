"""The small things that each cost a newcomer minutes (issue 43, Why 6), and `exec --port`, on moto's
AWS APIs on 127.0.0.1: a job name explained in words, refusals that name what `run` takes, duplicated
keys, an empty command, `logs -f` on a finished job, a --since in the future, --new-share alone, exec's
order of checks, --env-file, and port forwarding through Session Manager."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_trainctl import ok_json, one_error_line  # fixtures
from tests.test_trainctl import trainctl as trainctl
from tests.test_trainctl import world as world
from tests.trainctl_world import World
from trainctl.errors import ExitCode
from trainctl.requests import JOB_NAME_RULE
from trainctl.taskfile import LAUNCHER, load_task

ROOT = Path(__file__).resolve().parents[1]
# Nothing listens on port 9: a command that asked AWS first would exit 3, not 2.
OFFLINE = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}


def task_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------------- job names
def test_the_docs_task_file_loads_and_a_bad_name_is_explained_in_words_in_both(trainctl: Any, tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "jobs.md").read_text(), re.S)
    (documented,) = [b for b in blocks if b.startswith("fleet: gpu")]
    assert load_task(task_file(tmp_path, documented)).name  # the page's own example is a valid task

    line = one_error_line(
        trainctl("run", str(task_file(tmp_path, "fleet: gpu\nname: h1-lr-0.1\n")), env=OFFLINE), ExitCode.USAGE
    )
    assert JOB_NAME_RULE in line and "field name" in line and "pattern" not in line
    flag = one_error_line(trainctl("submit", "gpu", "--name", "h1-lr-0.1", env=OFFLINE), ExitCode.USAGE)
    assert JOB_NAME_RULE in flag and "--name 'h1-lr-0.1'" in flag


# ----------------------------------------------------------------------------------------------- run's refusals
def test_runs_refusals_name_the_task_files_field_not_a_flag(world: World, trainctl: Any, tmp_path: Path) -> None:
    too_many = task_file(tmp_path, "fleet: gpu\nnodes: 1000\n")
    line = one_error_line(trainctl("run", str(too_many)), ExitCode.USAGE)
    # The gpu fleet holds 2 nodes.
    assert f"set nodes: 2 or fewer in {too_many}" in line and "--nodes" not in line

    fifo = one_error_line(trainctl("run", str(task_file(tmp_path, "fleet: gpu\nshare: llama\n"))), ExitCode.USAGE)
    assert "remove share: from" in fifo and "--share" not in fifo
    missing = one_error_line(trainctl("run", str(task_file(tmp_path, "fleet: trainium\n"))), ExitCode.USAGE)
    assert "fair share: set share: ID in" in missing and "--share" not in missing
    unknown = one_error_line(
        trainctl("run", str(task_file(tmp_path, "fleet: trainium\nshare: lama\n"))), ExitCode.USAGE
    )
    assert "task.yaml: share: lama" in unknown and "set share: one of them in" in unknown
    # submit has the flags, and says so.
    assert "pass --nodes 2 or fewer" in one_error_line(trainctl("submit", "gpu", "--nodes", "9"), ExitCode.USAGE)


def test_new_share_without_a_share_is_refused(trainctl: Any, tmp_path: Path) -> None:
    flag = one_error_line(trainctl("submit", "trainium", "--new-share", "--dry-run"), ExitCode.USAGE)
    assert "--new-share without a share: pass --share ID" in flag
    task = task_file(tmp_path, "fleet: trainium\n")
    line = one_error_line(trainctl("run", str(task), "--new-share", "--dry-run"), ExitCode.USAGE)
    assert f"--new-share without a share: set share: ID in {task}" in line
    assert "--new-share" in one_error_line(trainctl("sweep", "gpu", "--grid", "A=1", "--new-share"), ExitCode.USAGE)


# ----------------------------------------------------------------------------------------------- task files
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("fleet: gpu\nnodes: 2\nname: a\nnodes: 4\n", "field nodes is given twice (lines 2 and 4): keep one"),
        ("fleet: gpu\nenv:\n  LR: 1\n  LR: 2\n", "field env.LR is given twice (lines 3 and 4)"),
        ("fleet: gpu\ncommand: ''\n", "field command: empty: give the script and its arguments"),
        ("fleet: gpu\ncommand: []\n", "field command: empty"),
    ],
)
def test_a_repeated_key_or_an_empty_command_in_a_task_file_is_one_line(
    trainctl: Any, tmp_path: Path, text: str, says: str
) -> None:
    line = one_error_line(trainctl("run", str(task_file(tmp_path, text)), env=OFFLINE), ExitCode.USAGE)
    assert says in line and len(line) <= 200


def test_submit_refuses_an_empty_command(trainctl: Any) -> None:
    for command in ("", "   "):
        line = one_error_line(trainctl("submit", "gpu", "--command", command, env=OFFLINE), ExitCode.USAGE)
        assert "--command: empty" in line
    planned = ok_json(trainctl("submit", "gpu", "--command", "python train.py", "--dry-run"))
    (override,) = planned["nodeOverrides"]["nodePropertyOverrides"]
    assert override["containerOverrides"]["command"] == [LAUNCHER, "python", "train.py"]


# ----------------------------------------------------------------------------------------------- logs -f
def test_logs_follow_on_a_finished_job_prints_its_logs_and_exits_with_its_outcome(
    world: World, trainctl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = world.submit("gpu", name="done-before")
    world.add_node_streams(done, "gpu", {0: [(1_000, "epoch 1"), (2_000, "saved")], 1: [(1_500, "joined")]})
    world.set_job(done, "SUCCEEDED")
    result = trainctl("logs", done, "-f")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[n0] epoch 1", "[n1] joined", "[n0] saved"]
    assert f"job {done} already ended SUCCEEDED: its logs are above" in result.stderr

    silent = world.submit("gpu", name="failed-silent")
    world.add_node_streams(silent, "gpu", {0: [], 1: []})
    world.set_job(silent, "FAILED", reason="Essential container in task exited")
    failed = trainctl("logs", silent, "--follow")
    assert failed.exit_code == ExitCode.JOB_FAILED and failed.stdout == ""
    assert f"job {silent} already ended FAILED: its nodes wrote no log lines" in failed.stderr

    # Followed to its end, a job that fails sets the exit status too.
    running = world.submit("gpu", name="fails-later")
    world.add_node_streams(running, "gpu", {0: [(1_000, "step 1")], 1: []})
    world.set_job(running, "RUNNING")
    monkeypatch.setattr("trainctl.commands.base.sleep", lambda _s: world.set_job(running, "FAILED"))
    followed = trainctl("logs", running, "-f")
    assert followed.exit_code == ExitCode.JOB_FAILED and followed.stdout.splitlines() == ["[n0] step 1"]


# ----------------------------------------------------------------------------------------------- --since
def test_a_since_in_the_future_is_refused(trainctl: Any) -> None:
    for command in ("cost", "jobs"):
        line = one_error_line(trainctl(command, "--since", "2031-01-01", env=OFFLINE), ExitCode.USAGE)
        assert "--since 2031-01-01: that is after now" in line and "7d" in line


# ----------------------------------------------------------------------------------------------- --env-file
def test_env_file_on_submit_run_and_sweep(trainctl: Any, tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text('# shared settings\n\nDATA=s3://bucket/set\nLR=0.1\nNOTE="two words"\nEMPTY=\n')

    planned = ok_json(trainctl("submit", "gpu", "--env-file", str(env_file), "--env", "LR=0.2", "--dry-run"))
    (override,) = planned["nodeOverrides"]["nodePropertyOverrides"]
    environment = {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}
    # --env wins over the file; comments and blank lines are skipped; one pair of quotes is dropped.
    assert environment == {"DATA": "s3://bucket/set", "LR": "0.2", "NOTE": "two words", "EMPTY": ""}

    task = task_file(tmp_path, "fleet: gpu\nenv:\n  LR: 0.3\n")
    (override,) = ok_json(trainctl("run", str(task), "--env-file", str(env_file), "--dry-run"))["nodeOverrides"][
        "nodePropertyOverrides"
    ]
    environment = {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}
    assert environment["LR"] == "0.3" and environment["DATA"] == "s3://bucket/set"

    requests = ok_json(trainctl("sweep", "gpu", "--grid", "LR=1,2", "--env-file", str(env_file), "--dry-run"))
    swept = [{e["name"]: e["value"] for e in r["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"][
        "environment"]} for r in requests]  # fmt: skip
    assert [(e["LR"], e["DATA"]) for e in swept] == [("1", "s3://bucket/set"), ("2", "s3://bucket/set")]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("A=1\n# fine\nnot a pair\n", "line 3: 'not a pair' is not NAME=VALUE"),
        ("\n1BAD=x\n", "line 2: '1BAD=x' is not NAME=VALUE"),
        ("AWS_BATCH_JOB_ID=x\n", "line 1: AWS_BATCH_JOB_ID: names starting with AWS_BATCH are reserved"),
    ],
)
def test_a_bad_env_file_line_is_refused_with_its_number(trainctl: Any, tmp_path: Path, text: str, says: str) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_text(text)
    for command in (
        ("submit", "gpu"),
        ("run", str(task_file(tmp_path, "fleet: gpu\n"))),
        ("sweep", "gpu", "--grid", "A=1"),
    ):
        line = one_error_line(trainctl(*command, "--env-file", str(env_file), env=OFFLINE), ExitCode.USAGE)
        assert f"--env-file {env_file} {says}" in line, command
    missing = one_error_line(
        trainctl("submit", "gpu", "--env-file", str(tmp_path / "none.env"), env=OFFLINE), ExitCode.USAGE
    )
    assert "none.env: cannot read it" in missing
