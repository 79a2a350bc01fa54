"""Restore: with CHECKPOINT_URI (s3://bucket/prefix) every node restores its last complete set (and the
main node's) from CHECKPOINT_URI/<lineage>/ into CHECKPOINT_DIR (default /tmp/checkpoints) before
training, so that a retried attempt (same job id) or the capacity fallback's successor (same lineage)
resumes; RESUME_ARGS are then appended to the script's arguments. checkpoint_sync.py does the copying."""

from __future__ import annotations

import fnmatch
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from node_settings import UINT, BadInput
from node_state import NodeState
from node_tools import run_helper

DEFAULT_DIR = "/tmp/checkpoints"  # noqa: S108 - the container's own scratch space, as documented


@dataclass(frozen=True)
class Restored:
    uri: str  # CHECKPOINT_URI/<lineage>/
    folder: Path  # CHECKPOINT_DIR
    state: Path  # where the launcher and the copier exchange the stop time and the trainer's status
    node_args: tuple[str, ...]  # checkpoint_sync.py's --uri, --node, --main and --state-dir
    resume: tuple[str, ...]  # what the script's arguments gain


def newest_folder(root: Path, pattern: str) -> str | None:
    """The name of the folder holding the newest file (by its restored mtime) whose name matches."""
    newest: tuple[float, str] | None = None
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if fnmatch.fnmatchcase(name, pattern) and not os.path.islink(path):
                candidate = (os.stat(path).st_mtime, folder)
                newest = candidate if newest is None or candidate > newest else newest
    return os.path.basename(newest[1]) if newest else None


def resume_arguments(resume_args: str, glob: str, folder: Path) -> tuple[str, ...]:
    """RESUME_ARGS, split as the shell split it; with RESUME_GLOB (a file-name pattern, e.g. model_*.pt)
    only when a restored file matches it, with {resume_dir} the folder of the newest match. Isaac Lab's
    resume otherwise takes the newest run folder by name, which may hold only the configuration another
    rank wrote, and fails on it."""
    if not glob:
        return tuple(resume_args.split())
    if "/" in glob:
        raise BadInput(f"RESUME_GLOB='{glob}' is a file-name pattern; it cannot name a folder")
    found = newest_folder(folder, glob)
    return tuple(resume_args.replace("{resume_dir}", found).split()) if found else ()


def restore(node: NodeState) -> Restored | None:
    settings = node.settings
    if settings.checkpoints is None:
        return None
    uri = settings.checkpoints.uri
    if not uri.startswith("s3://") or len(uri) <= len("s3://"):
        raise BadInput(f"CHECKPOINT_URI='{uri}' is not an s3:// URI")
    given = settings.get("CHECKPOINT_DIR", DEFAULT_DIR)
    os.environ["CHECKPOINT_DIR"] = given  # exported as given
    folder = Path(given)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint_uri = f"{uri[:-1] if uri.endswith('/') else uri}/{settings.lineage}/"
    state = Path(tempfile.mkdtemp())
    main = settings.batch.main if settings.batch else 0
    # Each node keeps its own files under node-<Batch node index>; the main node's set is restored
    # on every node too.
    node_args = ("--uri", checkpoint_uri, "--node", str(settings.index), "--main", str(main), "--state-dir", str(state))
    result = run_helper(
        settings.python.checkpoint, "checkpoint_sync.py", "restore", *node_args, str(folder), capture=True
    )
    if result.returncode != 0:
        raise BadInput(f"cannot restore checkpoints from {checkpoint_uri} (see the line above)")
    # The count is checkpoint_sync.py's last line: an interpreter wrapper (Isaac Sim's python.sh)
    # may print before it.
    lines = result.stdout.splitlines()
    count = lines[-1] if lines else ""
    if not UINT.fullmatch(count):
        raise BadInput(f"checkpoint_sync.py restore printed '{count}', not a file count")
    resume: tuple[str, ...] = ()
    if int(count) > 0 and settings.get("RESUME_ARGS"):
        resume = resume_arguments(settings.get("RESUME_ARGS"), settings.get("RESUME_GLOB"), folder)
    return Restored(uri=checkpoint_uri, folder=folder, state=state, node_args=node_args, resume=resume)
