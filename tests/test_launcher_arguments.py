"""The job's command with ${NAME} from the node's environment (container/launcher/arguments.py): Batch hands
the container its command with no shell between, so the launcher expands the paths it knows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness import ROOT
from tests.test_launcher import LAUNCHER, base_env

sys.path.insert(0, str(ROOT / "container" / "launcher"))
from arguments import expand

ENV = {"CHECKPOINT_DIR": "/ckpt/job-1", "WORKDIR_DIR": "/opt/workdir"}


def test_a_set_variable_becomes_its_value_anywhere_in_an_argument() -> None:
    assert expand(["${WORKDIR_DIR}/train.py", "--checkpoint_path", "${CHECKPOINT_DIR}/snapshot.pt"], ENV) == [
        "/opt/workdir/train.py",
        "--checkpoint_path",
        "/ckpt/job-1/snapshot.pt",
    ]
    assert expand(["--out=${CHECKPOINT_DIR}:${CHECKPOINT_DIR}"], ENV) == ["--out=/ckpt/job-1:/ckpt/job-1"]


def test_double_dollar_is_a_literal_dollar_and_protects_a_name() -> None:
    assert expand(["price=$$5", "$${CHECKPOINT_DIR}"], ENV) == ["price=$5", "${CHECKPOINT_DIR}"]


def test_what_is_no_variable_of_the_environment_stays_as_written() -> None:
    notes: list[str] = []
    hydra = ["hydra.run.dir=outputs/${now:%Y-%m-%d}", "model.dim=${model.width}", "seed=${seed}", "$HOME", "${", "a$"]
    assert expand([*hydra, "${seed}"], ENV, note=notes.append) == [*hydra, "${seed}"]
    # One line per unset name, however often it appears; interpolations that are no name say nothing.
    assert notes == ["${seed} in the command: the job's environment does not set seed, so it is passed as written"]


def test_the_launcher_hands_the_trainer_the_expanded_command(tmp_path: Path) -> None:
    fake = tmp_path / "python.sh"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "ARG: $a"; done\n')
    fake.chmod(0o755)
    checkpoints = tmp_path / "checkpoints"
    result = subprocess.run(
        [str(LAUNCHER), "train.py", "--checkpoint_path", "${CHECKPOINT_DIR}/snapshot.pt", "--cost", "$$1"],
        env=base_env(PYTHON=str(fake), NPROC_PER_NODE="1", CHECKPOINT_DIR=str(checkpoints)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    args = [line.removeprefix("ARG: ") for line in result.stdout.splitlines() if line.startswith("ARG: ")]
    assert args[-5:] == ["train.py", "--checkpoint_path", f"{checkpoints}/snapshot.pt", "--cost", "$1"]
