"""Registry stack: images staged from container/ without Docker, or replaced by URIs; the team repository."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk.assertions import Annotations, Match

from tests.harness import ROOT, VARIANTS, fleet_name, resources, synth, synth_with

STACK = "TrainingRegistry"
URI = "123456789012.dkr.ecr.us-east-1.amazonaws.com/isaaclab-batch:latest"


def docker_assets(result, stack=STACK):
    manifest = Path(result.assembly.directory) / f"{stack}.assets.json"
    return json.loads(manifest.read_text()).get("dockerImages", {})


def test_both_images_are_staged_from_container_without_docker():
    result = synth("default")
    assets = docker_assets(result)
    files = sorted(a["source"]["dockerFile"] for a in assets.values())
    assert files == ["gpu/Dockerfile", "trainium/Dockerfile"]
    for asset in assets.values():
        staged = Path(result.assembly.directory) / asset["source"]["directory"]
        for name in ("distributed_run.sh", "allreduce_bench.py", "checkpoint_sync.py", "preflight.py"):
            assert (staged / name).exists(), name
        assert asset["source"]["platform"] == "linux/amd64"


def test_image_uris_replace_the_assets_and_reach_the_job_definitions():
    result = synth("existing-images")
    assert docker_assets(result) == {}
    assert not result.app.node.find_child(STACK).images
    images = {
        k: r["Properties"]["NodeProperties"]["NodeRangeProperties"][0]["Container"]["Image"]
        for k, r in resources(result.templates["TrainingJobs"], "AWS::Batch::JobDefinition").items()
    }
    variant = VARIANTS["existing-images"]
    # A Docker Hub short name synthesizes and reaches Batch as written (issue 32).
    assert variant["gpuImage"] == "ubuntu:22.04" and "ubuntu:22.04" in images.values()
    for logical_id, image in images.items():
        assert image == (variant["gpuImage"] if logical_id.startswith("Gpu") else variant["trainiumImage"])


def test_one_image_per_accelerator_kind_that_a_fleet_needs():
    # GPU only: no Neuron image is staged or built.
    assert [a["source"]["dockerFile"] for a in docker_assets(synth("gpu-only")).values()] == ["gpu/Dockerfile"]
    # Three fleets, two of them GPU: still one GPU image.
    files = sorted(a["source"]["dockerFile"] for a in docker_assets(synth("three-fleets")).values())
    assert files == ["gpu/Dockerfile", "trainium/Dockerfile"]


def test_a_fleet_with_its_own_image_needs_no_build():
    result = synth_with({"trainiumInstanceType": "none", "gpuImage": URI})
    assert docker_assets(result) == {}


def test_team_repository_is_scanned_immutable_and_retained():
    template = synth("default").templates[STACK]
    (repo,) = resources(template, "AWS::ECR::Repository").values()
    props = repo["Properties"]
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert props["ImageTagMutability"] == "IMMUTABLE"
    assert repo["DeletionPolicy"] == "Retain" and repo["UpdateReplacePolicy"] == "Retain"
    rules = json.loads(props["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert {r["selection"]["tagStatus"] for r in rules} == {"untagged", "any"}


def test_registry_stack_has_termination_protection():
    stack = synth("default").app.node.find_child(STACK)
    assert stack.termination_protection is True


DOCKERFILES = sorted((ROOT / "container").glob("*/Dockerfile"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfiles_pass_hadolint(dockerfile):
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint is installed by `make test` (requirements-test.txt)")
    result = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfiles_pin_their_base_and_copy_the_launcher(dockerfile):
    text = dockerfile.read_text()
    base_arg = next(line for line in text.splitlines() if line.startswith("ARG ") and "IMAGE=" in line)
    assert ":" in base_arg.split("=", 1)[1] and not base_arg.endswith(":latest")
    assert "COPY distributed_run.sh allreduce_bench.py checkpoint_sync.py preflight.py /opt/training/" in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_every_launcher_file_is_copied_into_the_image(dockerfile):
    copied = set()
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1] == "/opt/training/":
            copied.update(words[1:-1])
    # The launcher runs its Python modules from beside it; one left out fails only on a node. The
    # NVIDIA driver check has nothing to check on a Neuron node.
    beside = {p.name for p in (ROOT / "container").iterdir() if p.suffix in (".py", ".sh")}
    if dockerfile.parent.name != "gpu":
        beside -= {"driver_check.py"}
    assert beside <= copied, beside - copied
    # .dockerignore lets through only what it names: a copied file it leaves out fails the build.
    allowed = {line[1:] for line in (ROOT / "container" / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    assert copied <= allowed, copied - allowed


def dockerfile_lines(name):
    return [line.strip() for line in (ROOT / "container" / name / "Dockerfile").read_text().splitlines()]


@pytest.mark.parametrize("image", ["gpu", "trainium"])
def test_image_resets_the_base_entrypoint_as_its_last_word(image):
    # Isaac Sim's starts the streaming app; the Neuron DLC's runs the command under a PID-1 bash
    # that never passes on SIGTERM. Batch sets the command only, so both images reset it.
    lines = [line for line in dockerfile_lines(image) if line.startswith(("ENTRYPOINT", "FROM"))]
    # After the FROM, the only ENTRYPOINT is the reset, so Batch's command runs as given.
    assert lines[-1] == "ENTRYPOINT []" and lines.count("ENTRYPOINT []") == 1


def test_gpu_image_puts_both_plugin_layouts_on_the_loader_path_and_fails_without_it():
    text = (ROOT / "container" / "gpu" / "Dockerfile").read_text()
    env = next(line for line in text.splitlines() if line.startswith("ENV LD_LIBRARY_PATH="))
    assert "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:" in env and "/opt/amazon/ofi-nccl/lib:" in env
    assert "/etc/ld.so.conf.d/" in text and "ldconfig" in text
    assert "grep -q 'libnccl-net'" in text and "exit 1" in text


def test_blackwell_fleets_on_the_built_gpu_image_are_warned():
    # The all-types variant has a fleet of every catalog type, none with an image of its own.
    stack = synth("all-types").app.node.find_child("TrainingRegistry")
    warnings = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("no kernels for Blackwell"))
    warned = {str(w.entry.data).split()[1] for w in warnings}
    # B200, B300, RTX PRO 6000 (g7e) and RTX PRO 4500 (g7): every Blackwell type of the catalog.
    blackwell = {"p6-b200.48xlarge", "p6-b300.48xlarge"}
    blackwell |= {
        f"{family}.{size}" for family in ("g7e", "g7") for size in ("8xlarge", "12xlarge", "24xlarge", "48xlarge")
    }
    assert warned == {fleet_name(name) for name in blackwell}
    # The default deployment (g6.12xlarge, trn1.32xlarge) has no warning at all.
    assert (
        Annotations.from_stack(synth("default").app.node.find_child("TrainingRegistry")).find_warning(
            "*", Match.any_value()
        )
        == []
    )
