"""container/isaaclab/exec_python.sh, the Isaac Lab image's build step that turns Isaac Sim's python.sh into an
interpreter wrapper that execs: against stand-in python.sh files with the real scripts' shapes (they set
up the environment, then run `$python_exe "$@" $args || error_exit` as a child of their bash, or from
Isaac Sim 5.1 on `$python_exe "${filtered_args[@]}" $args || error_exit` in an if/else)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ROOT

SCRIPT = ROOT / "container" / "isaaclab" / "exec_python.sh"
PYTHON_SH = """#!/bin/bash
error_exit()
{{
    echo "There was an error running python"
    exit 1
}}
SCRIPT_DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")"; pwd)"
export ISAAC_PATH=$SCRIPT_DIR
python_exe=${{PYTHONEXE:-"{python}"}}
$python_exe "$@" $args || error_exit
"""
# Isaac Sim 5.1 and 6.0 (isaac-sim/IsaacSim, source/scripts/python/linux-x86_64/python.sh at v5.1.0,
# v6.0.1): --lldb-debug is filtered out of the arguments, the interpreter runs in the else branch.
PYTHON_SH_51 = """#!/bin/bash
error_exit()
{{
    echo "There was an error running python"
    exit 1
}}
SCRIPT_DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")"; pwd)"
export ISAAC_PATH=$SCRIPT_DIR
python_exe=${{PYTHONEXE:-"{python}"}}
use_lldb=false
filtered_args=()
for arg in "$@"; do
    if [[ "$arg" == "--lldb-debug" ]]; then
        use_lldb=true
    else
        filtered_args+=("$arg")
    fi
done
if [[ "$use_lldb" == true ]]; then
    lldb -o run $python_exe -- "${{filtered_args[@]}}" $args || error_exit
else
    $python_exe "${{filtered_args[@]}}" $args || error_exit
fi
"""
# On SIGTERM: say so and exit 0, as a trainer that saves and stops would.
TRAINER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('TERM', flush=True), sys.exit(0)))\n"
    "print(os.getpid(), os.environ['ISAAC_PATH'], flush=True)\n"
    "time.sleep(30)\n"
)


@pytest.fixture(params=[PYTHON_SH, PYTHON_SH_51], ids=["isaac-sim-4", "isaac-sim-5.1"])
def isaac_sim(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    (tmp_path / "python.sh").write_text(request.param.format(python=sys.executable))
    (tmp_path / "python.sh").chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "python.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tmp_path


def test_the_wrapper_becomes_the_interpreter_and_passes_sigterm_on(isaac_sim: Path) -> None:
    wrapper = subprocess.Popen([str(isaac_sim / "python_exec.sh"), "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    pid, isaac_path = wrapper.stdout.readline().split()
    # Same process: the shell exec'd the interpreter, after setting up python.sh's environment.
    assert int(pid) == wrapper.pid and isaac_path == str(isaac_sim)
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.stdout.readline().strip() == "TERM"
    assert wrapper.wait(timeout=10) == 0


def test_the_original_would_have_kept_the_signal_from_the_trainer(isaac_sim: Path) -> None:
    # The control: python.sh as shipped runs the interpreter as a child, so the PIDs differ and a
    # SIGTERM to the wrapper ends the bash, never the trainer.
    wrapper = subprocess.Popen([str(isaac_sim / "python.sh"), "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    pid, _ = wrapper.stdout.readline().split()
    assert int(pid) != wrapper.pid
    wrapper.send_signal(signal.SIGTERM)
    wrapper.wait(timeout=10)
    time.sleep(0.2)
    trainer = Path(f"/proc/{pid}")
    assert trainer.exists()  # still running, unsignalled
    subprocess.run(["kill", "-KILL", pid], check=False)


def test_the_exit_status_is_the_interpreters(isaac_sim: Path) -> None:
    assert subprocess.run([str(isaac_sim / "python_exec.sh"), "-c", "raise SystemExit(7)"]).returncode == 7
    assert subprocess.run([str(isaac_sim / "python.sh"), "-c", "raise SystemExit(7)"]).returncode == 1


@pytest.mark.parametrize("shape", [PYTHON_SH, PYTHON_SH_51], ids=["isaac-sim-4", "isaac-sim-5.1"])
def test_a_python_sh_without_that_line_fails_the_build(tmp_path: Path, shape: str) -> None:
    # Every `|| error_exit` gone: no call left to turn into an exec.
    (tmp_path / "python.sh").write_text(shape.format(python=sys.executable).replace("|| error_exit", ""))
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "python.sh")], capture_output=True, text=True)
    assert done.returncode == 1 and "does not end in exactly one" in done.stderr
    assert not (tmp_path / "python_exec.sh").exists()


def test_the_gpu_image_runs_the_launcher_through_the_exec_wrapper() -> None:
    dockerfile = (ROOT / "container" / "isaaclab" / "Dockerfile").read_text()
    assert "RUN bash /tmp/exec_python.sh /workspace/isaaclab/_isaac_sim/python.sh" in dockerfile
    (python,) = [line for line in dockerfile.splitlines() if line.startswith("ENV PYTHON=")]
    assert python == "ENV PYTHON=/workspace/isaaclab/_isaac_sim/python_exec.sh"


def test_two_calls_fail_the_build(tmp_path: Path) -> None:
    # Both forms in one script: which one runs is not knowable here, so the build refuses.
    both = PYTHON_SH.format(python=sys.executable) + '    $python_exe "${filtered_args[@]}" $args || error_exit\n'
    (tmp_path / "python.sh").write_text(both)
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "python.sh")], capture_output=True, text=True)
    assert done.returncode == 1 and "does not end in exactly one" in done.stderr
