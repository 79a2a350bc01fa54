"""`make deploy` without a working Docker engine: one line naming -c imageBuild=cloud, within seconds,
before any build or AWS call; nothing stops a deploy that builds nothing locally."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ROOT

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/isaaclab-batch:v1"
TRAINIUM_IMAGE = "public.ecr.aws/neuron/pytorch-training-neuronx:2.5.1-neuronx-py310-sdk2.21.0-ubuntu22.04"


def stub_docker(tmp_path: Path, status: int, message: str) -> Path:
    """A `docker` whose `info` fails like a laptop's with Docker Desktop stopped, or answers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'calls'}\necho '{message}' >&2\nexit {status}\n")
    docker.chmod(0o755)
    return bin_dir


def check(path: str, *arguments: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env["PATH"] = path
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "config.image_build_check", *arguments],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return result, time.monotonic() - started


def assert_stops(result: subprocess.CompletedProcess[str], why: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert why in lines[0] and "-c imageBuild=cloud" in lines[0] and "Traceback" not in result.stderr


def test_a_docker_that_cannot_reach_an_engine_stops_the_deploy_within_seconds(tmp_path):
    bin_dir = stub_docker(tmp_path, 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    result, seconds = check(f"{bin_dir}:/usr/bin:/bin")
    assert_stops(result, "docker cannot reach an engine (Cannot connect to the Docker daemon")
    assert seconds < 10
    assert (tmp_path / "calls").read_text().startswith("info")


def test_no_docker_at_all_stops_the_deploy(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result, _ = check(str(empty))
    assert_stops(result, "there is no docker command on PATH")


@pytest.mark.parametrize(
    "arguments",
    [
        ("-c", "imageBuild=cloud"),
        ("--context=imageBuild=cloud", "TrainingRegistry"),
        ("-c", f"gpuImage={IMAGE}", "--context", f"trainiumImage={TRAINIUM_IMAGE}"),
        ("-c", "trainiumInstanceType=none", "-c", f"gpuImage={IMAGE}"),
    ],
    ids=["cloud", "cloud-equals-form", "every-fleet-has-an-image", "one-fleet-with-an-image"],
)
def test_nothing_to_build_locally_needs_no_docker(tmp_path, arguments):
    bin_dir = stub_docker(tmp_path, 1, "Cannot connect to the Docker daemon")
    result, _ = check(f"{bin_dir}:/usr/bin:/bin", *arguments)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "calls").exists()


def test_one_fleet_without_an_image_still_needs_docker(tmp_path):
    bin_dir = stub_docker(tmp_path, 1, "Cannot connect to the Docker daemon")
    result, _ = check(f"{bin_dir}:/usr/bin:/bin", "-c", f"gpuImage={IMAGE}")
    assert_stops(result, "docker cannot reach an engine")


def test_a_working_engine_passes(tmp_path):
    bin_dir = stub_docker(tmp_path, 0, "")
    result, _ = check(f"{bin_dir}:/usr/bin:/bin")
    assert result.returncode == 0 and result.stderr == ""


def test_make_deploy_checks_before_cdk_deploy():
    recipe = subprocess.run(
        ["make", "-n", "deploy", "ARGS=-c imageBuild=cloud"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    check_line = next(i for i, line in enumerate(recipe) if "-m config.image_build_check -c imageBuild=cloud" in line)
    deploy_line = next(i for i, line in enumerate(recipe) if " deploy --all" in line)
    assert check_line < deploy_line


def test_a_docker_that_cannot_be_run_stops_the_deploy(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("not a program")
    (bin_dir / "docker").chmod(0o755)
    result, _ = check(f"{bin_dir}:/usr/bin:/bin")
    assert_stops(result, "cannot be run")


def test_a_context_file_that_is_not_json_is_one_line(tmp_path):
    from config import image_build_check

    (tmp_path / "cdk.context.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"cdk\.context\.json is not JSON"):
        image_build_check.context_from([], root=tmp_path)
