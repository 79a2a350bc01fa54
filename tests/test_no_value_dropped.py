"""No value dropped without a word (issue 57, item 4): each input that used to be ignored, replaced or
half-read is refused in one line naming the value given and what is allowed, before any AWS call; the
valid neighbours of each refusal are still taken. The workdir whose command is the job definition's own
script: tests/test_workdir.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from config.context import ConfigError, read_settings
from tests.trainctl_world import moto_environment
from trainctl.cli import app
from trainctl.display import parse_since
from trainctl.errors import ExitCode, TrainctlError
from trainctl.inspecting.checkpoints import ready_folder
from trainctl.submitting.estimate import one_timeout
from trainctl.submitting.taskfile import load_task, make_task

# Nothing answers here: a refusal that reached AWS would exit 3 (ExitCode.AWS), not 2.
OFFLINE = moto_environment("http://127.0.0.1:9")


def refusal(*args: str) -> str:
    """trainctl's one line for `args`, which must be refused as bad input before any AWS call."""
    result = CliRunner().invoke(app, list(args), env=OFFLINE)
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainctl: "), result.stderr
    assert len(lines[0]) <= 200, lines[0]
    return str(lines[0])


def task_refusal(tmp_path: Path, text: str) -> str:
    task = tmp_path / "task.yaml"
    task.write_text(text)
    with pytest.raises(TrainctlError) as refused:
        load_task(task)
    return refused.value.message


# ----------------------------------------------------------------------------------------------- --hours
def test_hours_beside_timeout_is_refused_naming_both(tmp_path: Path) -> None:
    line = refusal("submit", "gpu", "--hours", "2", "--timeout", "3600", "--dry-run")
    assert "--hours 2 and --timeout 3600 both set the attempt timeout: give one of them" in line
    assert "(--hours in hours, or the timeout in seconds)" in line

    task = tmp_path / "task.yaml"
    task.write_text("fleet: gpu\ntimeout: 3600\n")
    line = refusal("run", str(task), "--hours", "1.5", "--dry-run")
    assert "--hours 1.5 and " in line and "task.yaml's timeout: 3600 both set the attempt timeout" in line


def test_hours_alone_or_timeout_alone_is_taken() -> None:
    one_timeout(2, None, named="--timeout")
    one_timeout(None, 3600, named="--timeout")
    with pytest.raises(TrainctlError, match=r"--hours 0: an attempt may run 1/60"):
        one_timeout(0, None, named="--timeout")


# ----------------------------------------------------------------------------------------------- task files
@pytest.mark.parametrize(
    ("written", "shown"),
    [("true", "true"), ("2.5", "2.5"), ('"2"', "'2'"), ("two", "'two'")],
)
def test_nodes_that_is_not_a_whole_number_is_refused(tmp_path: Path, written: str, shown: str) -> None:
    line = task_refusal(tmp_path, f"fleet: gpu\nnodes: {written}\n")
    assert line.endswith(f"task.yaml: field nodes: a whole number of nodes, 1 to 1000 (given {shown})"), line


def test_attempts_true_is_refused_too_and_whole_numbers_are_taken(tmp_path: Path) -> None:
    line = task_refusal(tmp_path, "fleet: gpu\nattempts: true\n")
    assert line.endswith("field attempts: a whole number of attempts, 1 to 10 (given true)"), line
    (tmp_path / "task.yaml").write_text("fleet: gpu\nnodes: 2\nattempts: 3\ntimeout: 7200\n")
    task = load_task(tmp_path / "task.yaml")
    assert (task.nodes, task.attempts, task.timeout) == (2, 3, 7200)


@pytest.mark.parametrize("written", ["workdir:\n", 'workdir: ""\n', "workdir: '  '\n"])
def test_an_empty_workdir_is_refused(tmp_path: Path, written: str) -> None:
    line = task_refusal(tmp_path, "fleet: gpu\ncommand: train.py\n" + written)
    assert "task.yaml: field workdir: empty: give the folder to send (. for the task file's own)" in line, line


def test_an_empty_field_is_refused_rather_than_left_out(tmp_path: Path) -> None:
    line = task_refusal(tmp_path, "fleet: gpu\nnodes:\n")
    assert line.endswith("task.yaml: field nodes: empty: give a value, or leave the field out"), line


def test_a_workdir_without_a_command_is_refused_in_a_file_and_in_flags(tmp_path: Path) -> None:
    line = task_refusal(tmp_path, "fleet: gpu\nworkdir: .\n")
    assert line.endswith(
        "task.yaml: field workdir: needs a command, a script of that folder (train.py --lr 0.1): "
        "the job definition's own is not in it (given '.')"
    ), line
    with pytest.raises(TrainctlError, match=r"^--workdir: needs a command"):
        make_task({"fleet": "gpu", "workdir": tmp_path}, where="--")
    # With its command, the same folder is taken, relative to the task file.
    (tmp_path / "task.yaml").write_text("fleet: gpu\nworkdir: .\ncommand: train.py --lr 0.1\n")
    task = load_task(tmp_path / "task.yaml")
    assert task.workdir == tmp_path / "." and task.command == ["train.py", "--lr", "0.1"]


# ----------------------------------------------------------------------------------------------- JSON context values
def test_a_key_repeated_in_a_json_context_value_is_refused() -> None:
    with pytest.raises(ConfigError) as budgets:
        read_settings({"budgets": '{"llama":1,"llama":2}'})
    line = str(budgets.value)
    assert line.startswith("""context key budgets='{"llama":1,"llama":2}': key "llama" is given twice""")
    assert line.endswith(
        'give each key once; allowed: empty, or a JSON object of team: monthly US dollars ({"llama": 20000})'
    )
    # At any depth, in every JSON key: a fleet's field given twice.
    with pytest.raises(ConfigError) as fleets:
        read_settings({"fleets": '{"rl": {"instanceType": "p5.48xlarge", "nodes": 2, "nodes": 4}}'})
    assert "context key fleets=" in str(fleets.value) and 'key "nodes" is given twice' in str(fleets.value)


def test_a_json_context_value_without_repeats_still_parses() -> None:
    settings = read_settings({"budgets": json.dumps({"llama": 20000, "vision": 5000})})
    budgets = settings.jobs.budgets
    assert budgets is not None
    assert {(t.team, t.monthly_usd) for t in budgets.teams} == {("llama", 20000), ("vision", 5000)}


# ----------------------------------------------------------------------------------------------- checkpoints --download
def test_download_into_a_folder_that_cannot_be_made_is_refused_before_listing(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    line = refusal("checkpoints", "0123abcd", "--download", str(tmp_path / "a-file" / "ckpt"))
    assert "--download " in line and "a-file/ckpt: cannot create or write that folder (Not a directory)" in line
    assert "give a folder you can write (a missing one is made)" in line


def test_a_folder_that_can_be_written_is_made_and_left_empty(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "ckpt"
    ready_folder(folder)
    assert folder.is_dir() and list(folder.iterdir()) == []
    ready_folder(folder)  # an existing one is taken as it is


# ----------------------------------------------------------------------------------------------- --since
@pytest.mark.parametrize("span", ["0d", "0h", "0m", "0w", "00d"])
def test_a_zero_length_since_is_refused(span: str) -> None:
    with pytest.raises(TrainctlError) as refused:
        parse_since(span, default=timedelta(days=7))
    assert refused.value.message == (
        f"--since {span}: a span of zero covers no time; give one of at least 1m (30m, 12h, 7d, 2w) or a date"
    )


def test_cost_since_0d_is_refused_and_a_span_of_a_minute_is_taken() -> None:
    assert refusal("cost", "--since", "0d").startswith("trainctl: --since 0d: a span of zero covers no time")
    now = datetime(2026, 11, 28, 12, tzinfo=UTC)
    assert parse_since("1m", default=timedelta(days=7), now=now) == now - timedelta(minutes=1)
