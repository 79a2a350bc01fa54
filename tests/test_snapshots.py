"""Backstop snapshots of every default template (asset hashes scrubbed).

Update after a reviewed change with `make test ARGS=--snapshot-update`.
"""

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.harness import scrub, synth


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("stack", sorted(synth("default").templates))
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
