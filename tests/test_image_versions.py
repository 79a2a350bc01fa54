"""container/versions.toml: every pin of the training images, dated and sourced, and the Dockerfiles
agreeing with it; CDK passes the same values to both builds."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from tests.harness import ROOT, synth
from training_constructs.images.image_versions import UNMEASURED, dockerfile_drift, load_versions

VERSIONS = load_versions()
DOCKERFILES = sorted((ROOT / "container").glob("*/Dockerfile"))


def test_every_pin_has_a_date_a_source_and_an_image_that_uses_it():
    images = {path.parent.name for path in DOCKERFILES}
    assert VERSIONS.pins
    for pin in VERSIONS.pins.values():
        assert isinstance(pin.checked, datetime.date) and pin.checked <= VERSIONS.checked, pin.name
        assert len(pin.source) > 20, pin.name
        assert pin.images and set(pin.images) <= images, pin.name
        if pin.name.endswith("_IMAGE"):
            # A base image: pinned by tag (or digest), with its size or the word that it was not read.
            assert ":" in pin.value.split("/")[-1] and not pin.value.endswith(":latest"), pin.name
            assert pin.compressed_size, pin.name
            if pin.compressed_size != UNMEASURED:
                assert pin.compressed_size.endswith(("GB", "MB")), pin.name


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_dockerfiles_agree_with_the_versions_file(dockerfile):
    assert dockerfile_drift(dockerfile.read_text(), dockerfile.parent.name, VERSIONS) == []


def test_a_drifted_dockerfile_is_caught():
    text = (ROOT / "container" / "pytorch" / "Dockerfile").read_text()
    assert "ARG EFA_INSTALLER_VERSION=1.51.0" in text
    problems = dockerfile_drift(text.replace("ARG EFA_INSTALLER_VERSION=1.51.0", "ARG EFA_INSTALLER_VERSION=1.50.0"),
                                "pytorch", VERSIONS)  # fmt: skip
    assert problems == ["ARG EFA_INSTALLER_VERSION=1.50.0 differs from versions.toml: 1.51.0"]
    # A pin the file does not list, a version written into an install line, a base named outright,
    # and a pin of the file the Dockerfile no longer declares.
    extra = text.replace("SHELL [", "ARG CUDNN_VERSION=9.24\nSHELL [", 1)
    assert dockerfile_drift(extra, "pytorch", VERSIONS) == [
        "ARG CUDNN_VERSION=9.24 is not a pin of image pytorch in versions.toml"
    ]
    literal = text.replace('"boto3==${BOTO3_VERSION}"', '"boto3==1.44.5"')
    assert any("pins a version of its own" in p for p in dockerfile_drift(literal, "pytorch", VERSIONS))
    named = text.replace("FROM ${PYTORCH_BASE_IMAGE}", "FROM public.ecr.aws/docker/library/ubuntu:24.04")
    assert any("names its base image" in p for p in dockerfile_drift(named, "pytorch", VERSIONS))
    dropped = text.replace("ARG NCCL_VERSION=2.30.7\n", "")
    assert dockerfile_drift(dropped, "pytorch", VERSIONS) == [
        "versions.toml pins NCCL_VERSION for image pytorch, but the Dockerfile has no ARG NCCL_VERSION=..."
    ]


def test_the_local_build_gets_the_pins_as_build_arguments():
    result = synth("three-fleets")
    manifest = Path(result.assembly.directory) / "TrainingRegistry.assets.json"
    assets = json.loads(manifest.read_text())["dockerImages"].values()
    by_file = {a["source"]["dockerFile"].split("/")[0]: a["source"].get("dockerBuildArgs", {}) for a in assets}
    assert set(by_file) == {"isaaclab", "pytorch", "trainium"}
    for image, args in by_file.items():
        assert args == VERSIONS.build_args(image), image
    assert by_file["pytorch"]["EFA_INSTALLER_VERSION"] == VERSIONS.pins["EFA_INSTALLER_VERSION"].value


def test_versions_the_issue_asks_for():
    # Issue 44, "Done when": EFA installer >= 1.50 (1.51.0 brings aws-ofi-nccl 1.22.0), NCCL >= 2.30,
    # Isaac Lab >= 2.3, the Neuron image on SDK >= 2.30.
    def version(name: str) -> tuple[int, ...]:
        value = VERSIONS.pins[name].value
        return tuple(int(part) for part in value.rsplit(":", 1)[-1].split("-")[0].split("."))

    assert version("EFA_INSTALLER_VERSION") >= (1, 50)
    assert version("NCCL_VERSION") >= (2, 30) and version("ISAACLAB_NCCL_VERSION") >= (2, 30)
    assert version("ISAACLAB_IMAGE") >= (2, 3)
    assert "-sdk2.30.0-" in VERSIONS.pins["NEURON_DLC_IMAGE"].value
