"""The job's code (trainctl submit --workdir, docs/workdir.md): with WORKDIR_URI every node unpacks it
into WORKDIR_DIR (default /tmp/workdir) after its preflight, runs WORKDIR_SETUP, and runs the script
from there; workdir_fetch.py does it with CHECKPOINT_PYTHON's interpreter (boto3)."""

from __future__ import annotations

import os

from ending import exit_status
from node_state import EndNode, NodeState
from node_tools import run_helper

DEFAULT_DIR = "/tmp/workdir"  # noqa: S108 - the container's own scratch space, as documented


def fetch_job_code(node: NodeState) -> None:
    settings = node.settings
    if not (settings.get("WORKDIR_URI") or settings.get("WORKDIR_SETUP")):
        return
    folder = settings.get("WORKDIR_DIR", DEFAULT_DIR)
    os.environ["WORKDIR_DIR"] = folder
    status = exit_status(run_helper(settings.python.checkpoint, "workdir_fetch.py", "--dir", folder).returncode)
    if status != 0:
        node.last_error = f"workdir_fetch.py exited {status} (see the line above)"
        raise EndNode(status)
    if settings.get("WORKDIR_URI"):
        os.chdir(folder)
        os.environ["PWD"] = folder  # as the shell's cd exported it
