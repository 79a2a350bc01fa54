"""How the suite spreads over the machine's cores (pytest-xdist, `-n auto` in pyproject.toml).

Every test that reads synthesized templates runs in one worker, which synthesizes each context
variant once for all of them (tests/harness.py caches per process); the other files, which mostly
wait on subprocesses (the launcher, checkpoints against a local S3, the CDK CLI, the ParallelCluster
schema, linters), go file by file to the other workers meanwhile. xdist's own `loadgroup` cannot
do this with pytest 9 (it renames node ids through an attribute pytest no longer reads), so the
grouping is a scheduler of our own, through xdist's `pytest_xdist_make_scheduler` hook.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import PurePosixPath
from typing import Any

import pytest
from jsii._kernel.providers import process as jsii_process


def _one_jsii_thread() -> None:
    """jsii's Python kernel is not safe to call from two threads (FIELD_NOTES: a reply read by the
    wrong thread hangs the process forever), nor from a forked child, which shares the parent's pipes
    to Node. Every call into jsii must come from the thread and process that made the first one;
    any other fails at once with the reason, instead of hanging the suite."""
    send = jsii_process._NodeProcess.send  # the one place every request to Node goes through
    owner: dict[str, Any] = {}

    def checked_send(self: Any, request: Any, response_type: Any) -> Any:
        here = (os.getpid(), threading.get_ident())
        first = owner.setdefault("caller", here)
        if here != first:
            raise RuntimeError(
                f"jsii called from thread {threading.current_thread().name} (pid {here[0]}); the first call came "
                f"from another thread or process, and jsii's kernel serves one: read CDK values before starting "
                "threads or processes, and hand them plain values"
            )
        return send(self, request, response_type)

    jsii_process._NodeProcess.send = checked_send


_one_jsii_thread()


def _scratch_folder() -> None:
    """Synths, replays and the processes tests start (torchrun, the CDK CLI) write temporary folders,
    tens of MB a session: they go into a scratch folder, removed when its process ends. Processes
    started later find it as TMPDIR, the synths through tests.harness.scratch_dir, so the xdist
    workers' folders nest inside the controller's, which removes the whole tree last. Where pytest
    runs in one process, its tmp_path stays in the system's folder (read before TMPDIR changes), so
    that paths in messages keep their length."""
    tempfile.gettempdir()
    scratch = tempfile.mkdtemp(prefix="training-tests-")
    os.environ["TMPDIR"] = scratch
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)


_scratch_folder()

# Files whose tests call tests.harness.synth() or synth_with().
SYNTH_FILES = frozenset(
    {
        "test_architecture.py",
        "test_budgets_synth.py",
        "test_cfn_lint.py",
        "test_cloud_build.py",
        "test_compute.py",
        "test_data.py",
        "test_fleet_health.py",
        "test_host_check.py",
        "test_jobs.py",
        "test_job_fallback.py",
        "test_job_queues.py",
        "test_nag.py",
        "test_node_recovery.py",
        "test_network.py",
        "test_parallelcluster.py",
        "test_pcs.py",
        "test_monitoring.py",
        "test_registry.py",
        "test_shapes.py",
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


# Every refusal of a context value, however a test produces it, is one line of at most about 200
# characters (issue 32): ConfigError records each message it is built with, and every test checks
# the ones it produced. The recording lives here so that no test file can forget it.
MAX_REFUSAL = 200
REFUSALS: list[str] = []


def _record_refusals() -> None:
    from config.context import ConfigError

    if getattr(ConfigError, "_recorded", False):
        return
    plain_init = ConfigError.__init__

    def recording_init(self: ConfigError, *args: object) -> None:
        REFUSALS.append(str(args[0]) if args else "")
        plain_init(self, *args)

    ConfigError.__init__ = recording_init  # type: ignore[method-assign]
    ConfigError._recorded = True  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def refusals_stay_short() -> object:
    _record_refusals()
    start = len(REFUSALS)
    yield
    made = REFUSALS[start:]
    too_long = [m for m in made if len(m) > MAX_REFUSAL or "\n" in m]
    assert not too_long, f"refusal over {MAX_REFUSAL} characters or lines: {too_long[0]!r} ({len(too_long[0])})"


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
