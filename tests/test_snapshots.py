"""Backstop snapshots of every default template (asset hashes scrubbed).

Update after a reviewed change with `make test ARGS=--snapshot-update`.
"""

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.harness import scrub, synth


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


# Named here, not read from a synth at import time: every pytest-xdist worker imports this module.
DEFAULT_STACKS = (
    "TrainingCompute",
    "TrainingData",
    "TrainingJobs",
    "TrainingMonitoring",
    "TrainingNetwork",
    "TrainingRegistry",
)


def test_every_default_stack_has_a_snapshot():
    assert tuple(sorted(synth("default").templates)) == DEFAULT_STACKS


@pytest.mark.parametrize("stack", DEFAULT_STACKS)
def test_default_template(stack, snapshot_json):
    assert scrub(synth("default").templates[stack]) == snapshot_json


def test_scrub_replaces_hashes_inside_strings():
    h = "a" * 64
    assert scrub({"S3Key": f"{h}.json", "Image": {"Fn::Sub": f"x:{h}"}}) == {
        "S3Key": "<asset-hash>.json",
        "Image": {"Fn::Sub": "x:<asset-hash>"},
    }


def test_parallelcluster_template(snapshot_json):
    assert scrub(synth("parallelcluster").templates["TrainingParallelCluster"]) == snapshot_json


def test_pcs_template(snapshot_json):
    assert scrub(synth("pcs").templates["TrainingPcs"]) == snapshot_json


# A fleet with fallback placements (tests/harness.py, LLM_FALLBACK): each placement's compute path,
# queue, the resubmitter and the capacity row and alarm.
@pytest.mark.parametrize("stack", ["TrainingCompute", "TrainingJobs", "TrainingMonitoring"])
def test_fallback_template(stack, snapshot_json):
    assert scrub(synth("three-fleets").templates[stack]) == snapshot_json
