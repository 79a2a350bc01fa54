"""How the suite spreads over the machine's cores (pytest-xdist, `-n auto` in pyproject.toml).

Every test that reads synthesized templates runs in one worker, which synthesizes each context
variant once for all of them (tests/harness.py caches per process); the other files, which mostly
wait on subprocesses (the launcher, checkpoints against a local S3, the CDK CLI, the ParallelCluster
schema, linters), go file by file to the other workers meanwhile. xdist's own `loadgroup` cannot
do this with pytest 9 (it renames node ids through an attribute pytest no longer reads), so the
grouping is a scheduler of our own, through xdist's `pytest_xdist_make_scheduler` hook.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

import pytest

# Files whose tests call tests.harness.synth() or synth_with().
SYNTH_FILES = frozenset(
    {
        "test_cfn_lint.py",
        "test_cloud_build.py",
        "test_compute.py",
        "test_data.py",
        "test_fleet_health.py",
        "test_host_check.py",
        "test_jobs.py",
        "test_nag.py",
        "test_node_recovery.py",
        "test_network.py",
        "test_parallelcluster.py",
        "test_monitoring.py",
        "test_registry.py",
        "test_snapshots.py",
    }
)


def work_unit(nodeid: str) -> str:
    """The scope a test is scheduled with: "synth" for the files above, else its own file."""
    path = nodeid.split("::", 1)[0]
    return "synth" if PurePosixPath(path).name in SYNTH_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SynthInOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SynthInOneWorker(config, log)


@pytest.fixture(autouse=True, scope="session")
def node_state_dir(tmp_path_factory: pytest.TempPathFactory):
    """The launcher's node-state directory (NODE_STATE_DIR, /var/lib/training-node on a node) in a
    temporary folder, so that no test run writes a take-out marker onto this machine."""
    path = tmp_path_factory.mktemp("training-node")
    previous = os.environ.get("NODE_STATE_DIR")
    os.environ["NODE_STATE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("NODE_STATE_DIR", None)
    else:
        os.environ["NODE_STATE_DIR"] = previous
