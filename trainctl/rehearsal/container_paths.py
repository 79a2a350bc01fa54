"""The checkpoint folder at the path a container has it: every rehearsal node sees `/tmp/checkpoints` (the
launcher's default CHECKPOINT_DIR on Batch, container/launcher/restore_phase.py) as a folder of its own,
so a script that writes there literally, or takes `${CHECKPOINT_DIR}`, behaves as in a container.

The nodes of a rehearsal share this machine's /tmp, so each node's command runs in a mount namespace of its
own (unshare(1) of util-linux; `--map-root-user` when not run as root), where the node's folder is bound
onto that path; nothing outside the namespace sees the binding, and the folder the rehearsal reads stays
where it was. unshare without `--fork` executes the command in its own process, so the node's first
process keeps the pid the rehearsal started. Where the machine cannot (no unshare, or a kernel that
refuses namespaces to this user), each node's CHECKPOINT_DIR is another folder, and the report says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CONTAINER_CHECKPOINT_DIR = "/tmp/checkpoints"  # noqa: S108 - the container's own scratch path, as on Batch
# `sh -c` binds $1 onto $2, then becomes the node's command.
_BIND = 'mount --bind "$1" "$2" || exit 126; shift 2; exec "$@"'


def _unshare() -> list[str]:
    flags = ["--mount", "--propagation", "private"]
    return ["unshare", *flags] if os.geteuid() == 0 else ["unshare", "--map-root-user", *flags]


@functools.cache
def unavailable() -> str | None:
    """Why nodes cannot have the container's checkpoint path here, or None when they can (tried once)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare(1) or mount(8) is not installed (util-linux)"
    try:
        Path(CONTAINER_CHECKPOINT_DIR).mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            probe = subprocess.run(  # noqa: S603 - fixed arguments
                [*_unshare(), "sh", "-c", _BIND, "probe", folder, CONTAINER_CHECKPOINT_DIR, "true"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
    except (OSError, subprocess.SubprocessError) as error:
        return f"{CONTAINER_CHECKPOINT_DIR} cannot be a mount point here ({error})"
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        return f"unshare --mount failed: {lines[-1] if lines else f'exit {probe.returncode}'}"
    return None


def in_own_folder(command: list[str], folder: Path) -> list[str]:
    """`command`, run with `folder` at the container's checkpoint path (call only when available)."""
    folder.mkdir(parents=True, exist_ok=True)
    return [*_unshare(), "sh", "-c", _BIND, "rehearsal-node", str(folder), CONTAINER_CHECKPOINT_DIR, *command]
