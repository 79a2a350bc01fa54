"""shellcheck over every shell script the repository ships (the launcher, the image build steps, the
cluster scripts, the Slurm example): found through git, so a new script is checked without a new test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

SCRIPTS = subprocess.run(
    ["git", "ls-files", "*.sh", "*.sbatch"], cwd=ROOT, capture_output=True, text=True, check=True
).stdout.split()


def test_the_known_scripts_are_found():
    known = {
        "container/distributed_run.sh",
        "container/isaaclab/exec_python.sh",
        "container/common/install_efa.sh",
        "training_constructs/images/build_image.sh",
    }
    assert known <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck_is_clean(script):
    shellcheck = Path(sys.executable).parent / "shellcheck"
    result = subprocess.run(
        [str(shellcheck), "--severity=style", str(ROOT / script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout
