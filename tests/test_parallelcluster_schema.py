"""The generated ParallelCluster configuration through aws-parallelcluster 3.16.1's own schema and
validators, in an environment of its own (it cannot share one with aws-cdk-lib v2). No synth here:
these tests run beside the synthesizing ones (tests/conftest.py)."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config import limits
from tests.harness import ROOT
from tests.test_parallelcluster import configuration

REQUIREMENTS = ROOT / "requirements-pcluster.txt"
PCLUSTER_ENV = ROOT / ".venv" / "pcluster"
CHECK = ROOT / "tests" / "pcluster_check.py"


@pytest.fixture(scope="session")
def pcluster_python() -> str:
    """aws-parallelcluster in its own environment, rebuilt when requirements-pcluster.txt changes."""
    python = PCLUSTER_ENV / "bin" / "python"
    stamp = PCLUSTER_ENV / ".requirements-sha256"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not (python.exists() and stamp.exists() and stamp.read_text() == digest):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(PCLUSTER_ENV)], check=True, timeout=120)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True, timeout=600)
        stamp.write_text(digest)
    return str(python)


# Configurations ParallelCluster must accept: the seed plan and two unusual combinations.
ACCEPTED = {
    "seed-plan": {"pclusterMaxNodes": "80"},
    "reserved-multi-type": {
        "pclusterInstanceType": "p5.48xlarge,trn1.32xlarge,g6.12xlarge",
        "pclusterCapacityReservationId": "cr-0123456789abcdef0",
        "pclusterCapacityReservationType": "capacity-block",
        "pclusterMaxNodes": "4",
        "pclusterSshSource": "203.0.113.0/24",
        "pclusterKeyName": "ops",
        "fsxCapacityGib": "4800",
        "fsxThroughput": "500",
        "pclusterDeletionPolicy": "Delete",
    },
    # Blackwell queues: ParallelCluster 3.16.1 knows p6-b300 (pcluster/constants.py P6_B300, card 0
    # ENA-only in INSTANCE_TYPES_WITH_FIRST_INTERFACE_ENA) and supports it on every OS it supports.
    "blackwell-queues": {"pclusterInstanceType": "p6-b200.48xlarge,p6-b300.48xlarge,g7e.48xlarge"},
    "prefix-list-odcr": {
        "pclusterSshSource": "pl-0123456789abcdef0",
        "pclusterCapacityReservationId": "cr-0123456789abcdef0",
    },
}
# Negative controls: the default configuration broken one way each, and what the check must say.
REFUSED = {
    "old-os": (lambda c: c["Image"].update(Os="alinux2"), "Must be one of: alinux2023"),
    "unknown-key": (lambda c: c["HeadNode"].update(NoSuchKey=1), "Unknown field"),
    "fsx-size": (
        lambda c: c["SharedStorage"][0]["FsxLustreSettings"].update(StorageCapacity=3000),
        "FsxStorageCapacityValidator",
    ),
    "capacity-block-min-count": (
        lambda c: c["Scheduling"]["SlurmQueues"][0].update(CapacityType="CAPACITY_BLOCK"),
        "Min count must be",
    ),
    "gb200-on-rhel8": (
        lambda c: (
            c["Image"].update(Os="rhel8"),
            c["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0].update(
                Instances=[{"InstanceType": "p6e-gb200.36xlarge"}]
            ),
        ),
        "InstanceTypeOSCompatibleValidator",
    ),
    "dra-with-import-path": (
        lambda c: c["SharedStorage"][0]["FsxLustreSettings"].update(ImportPath="s3://legacy-import"),
        "FsxDraValidator",
    ),
}


@pytest.fixture(scope="module")
def pcluster_errors(pcluster_python) -> dict[str, list[str]]:
    """Every configuration above, checked in one process."""
    configurations = {name: configuration(**context) for name, context in ACCEPTED.items()}
    for name, (change, _) in REFUSED.items():
        broken = configuration()
        change(broken)
        configurations[name] = broken
    request = json.dumps({"configurations": configurations, "cluster_name": "training-slurm"})
    result = subprocess.run([pcluster_python, str(CHECK)], input=request, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["errors"]


@pytest.mark.parametrize("name", ACCEPTED)
def test_parallelcluster_accepts_the_generated_configuration(pcluster_errors, name):
    assert pcluster_errors[name] == []


@pytest.mark.parametrize("name", REFUSED)
def test_the_check_catches_what_parallelcluster_refuses(pcluster_errors, name):
    _, expected = REFUSED[name]
    assert any(expected in e for e in pcluster_errors[name]), pcluster_errors[name]


def test_log_retention_list_is_parallelclusters_own(pcluster_python):
    """config/limits.py's list is 3.16.1's CloudWatchLogsSchema, read from the installed package, less
    0 (ParallelCluster's "never expire", which CloudWatch's own list has no value for)."""
    (schema,) = Path(pcluster_python).parent.parent.glob(
        "lib/python3*/site-packages/pcluster/schemas/cluster_schema.py"
    )
    text = schema.read_text()
    block = text[text.index("class CloudWatchLogsSchema") :]
    listed = re.search(r"retention_in_days = fields\.Int\(\s*validate=validate\.OneOf\(\[([\d, ]+)\]", block)
    assert listed, "CloudWatchLogsSchema.retention_in_days moved"
    assert tuple(int(v) for v in listed[1].split(",") if int(v)) == limits.PCLUSTER_LOG_RETENTION_DAYS
