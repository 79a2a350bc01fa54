"""Code that goes with a job (`workdir:` in a task file, `submit --workdir`, docs/workdir.md): the folder packed
into one deterministic archive (the files its .gitignore files leave in, no .git), stored once per content hash
in the deployment's dataset bucket under workdirs/, and fetched and unpacked by every node's launcher before
the rendezvous (container/launcher/workdir_fetch.py, which runs the task's `setup:` after the unpack)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import shlex
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.exceptions
from pathspec import GitIgnoreSpec

from trainctl.aws import aws_errors
from trainctl.errors import ExitCode, TrainctlError, clip_path
from trainctl.submitting.taskfile import LAUNCHER, Task

# Under the dataset bucket, which the job role reads (stacks/jobs_stack.py) and no job writes.
PREFIX = "workdirs/"
# Code, not data: a folder past this (after .gitignore) is refused; datasets belong in the dataset bucket.
MAX_BYTES = 100 * 1024 * 1024
# What the launcher reads (container/launcher/job_code.py, container/launcher/workdir_fetch.py).
URI_ENV = "WORKDIR_URI"
SETUP_ENV = "WORKDIR_SETUP"
IGNORE_FILE = ".gitignore"


@dataclass(frozen=True)
class Packed:
    folder: Path
    archive: bytes  # tar.gz
    digest: str  # sha256 of the tar: the same files give the same digest
    files: frozenset[str]  # paths inside the folder, '/'-separated

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.digest}.tar.gz"

    def uri(self, bucket: str) -> str:
        return f"s3://{bucket}/{self.key}"


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def _ignored(path: str, is_dir: bool, specs: dict[str, GitIgnoreSpec]) -> bool:
    """git's answer for `path`: the deepest .gitignore with a pattern for it decides (gitignore(5))."""
    parts = path.split("/")
    for depth in range(len(parts) - 1, -1, -1):
        spec = specs.get("/".join(parts[:depth]))
        if spec is None:
            continue
        inner = "/".join(parts[depth:]) + ("/" if is_dir else "")
        decided = spec.check_file(inner).include
        if decided is not None:
            return bool(decided)
    return False


def _entries(folder: Path, limit: int) -> list[tuple[str, Path]]:
    """(path inside the folder, file) for every file and link git would see, sorted; refused past `limit` bytes."""
    specs: dict[str, GitIgnoreSpec] = {}
    found: list[tuple[str, Path]] = []
    size = 0
    for directory, dirnames, filenames in os.walk(folder):
        here = Path(directory)
        rel = here.relative_to(folder).as_posix()
        rel = "" if rel == "." else rel
        ignore_file = here / IGNORE_FILE
        if ignore_file.is_file():
            specs[rel] = GitIgnoreSpec.from_lines(
                ignore_file.read_text(encoding="utf-8", errors="replace").splitlines()
            )
        kept_dirs = []
        for name in dirnames:
            path = posixpath.join(rel, name)
            if name == ".git" or _ignored(path, True, specs):
                continue
            if (here / name).is_symlink():
                found.append((path, here / name))  # a link, kept as one; never followed
            else:
                kept_dirs.append(name)
        dirnames[:] = sorted(kept_dirs)
        for name in filenames:
            path = posixpath.join(rel, name)
            if name == ".git" or _ignored(path, False, specs):
                continue
            found.append((path, here / name))
            size += (here / name).lstat().st_size
    if size > limit:
        raise TrainctlError(
            f"workdir {clip_path(folder)}: {_size(size)} of files after .gitignore, past the {_size(limit)} limit: "
            "leave data and outputs out with .gitignore"
        )
    return sorted(found)


def _link_target(folder: Path, path: str, file: Path) -> str:
    """The link's target, refused unless it stays inside the folder both as written (the node checks the text)
    and once resolved through the links it passes (`l -> .` then `up -> l/..` reads as inside but is not)."""
    target = os.readlink(file)
    shown = f"workdir {clip_path(folder, 32)}: link {clip_path(path, 32)} -> {clip_path(target, 32)}"
    if posixpath.isabs(target):
        raise TrainctlError(f"{shown} is absolute: add it to .gitignore to leave it out, or copy the file in")
    inside = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    real = (file.parent / target).resolve()
    if inside == ".." or inside.startswith("../") or not real.is_relative_to(folder.resolve()):
        raise TrainctlError(f"{shown} points outside the folder; copy the file in or add it to .gitignore")
    return target


def pack(folder: Path, *, limit: int = MAX_BYTES) -> Packed:
    """The folder as a tar.gz whose bytes depend only on the paths, contents, links and executable bits."""
    if not folder.is_dir():
        raise TrainctlError(f"workdir {clip_path(folder)}: not a folder")
    tar_bytes = io.BytesIO()
    files: set[str] = set()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path, file in _entries(folder, limit):
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            mode = file.lstat().st_mode
            if stat.S_ISLNK(mode):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, _link_target(folder, path, file), 0o777
                tar.addfile(info)
            elif stat.S_ISREG(mode):
                data = file.read_bytes()
                info.size, info.mode = len(data), 0o755 if mode & stat.S_IXUSR else 0o644
                tar.addfile(info, io.BytesIO(data))
            else:
                continue  # sockets, fifos: nothing to ship
            files.add(path)
    raw = tar_bytes.getvalue()
    return Packed(
        folder=folder,
        archive=gzip.compress(raw, compresslevel=6, mtime=0),
        digest=hashlib.sha256(raw).hexdigest(),
        files=frozenset(files),
    )


def check_script(packed: Packed, command: list[str] | None) -> None:
    """The script the launcher runs (the command's first word) is in the packed folder, when it is a relative
    path: refused in one line before anything is submitted."""
    if not command or command[0].startswith(("-", "/")):
        return
    script = posixpath.normpath(command[0])
    if script in packed.files:
        return
    hint = (
        "the launcher runs the script itself: start the command with it (train.py --lr 0.1)"
        if script.startswith("python")
        else f"paths are relative to the workdir; {IGNORE_FILE} may leave it out"
    )
    raise TrainctlError(f"command: {clip_path(command[0])} is not in workdir {clip_path(packed.folder)} ({hint})")


def definition_script(definition: dict[str, Any]) -> str | None:
    """The script the job definition's own command gives the launcher: `LAUNCHER script ...`, or the word
    after `exec LAUNCHER` in a `bash -c` line, a `$NAME` there read from the definition's environment
    (training_constructs/jobs/workloads.py writes both forms); None for a command that runs no launcher."""
    ranges = definition.get("nodeProperties", {}).get("nodeRangeProperties") or [{}]
    container = ranges[0].get("container", {})
    command = [str(word) for word in container.get("command", [])]
    words = command[1:] if command[:1] == [LAUNCHER] else []
    line = command[2] if len(command) == 3 and command[1] == "-c" else ""
    after_exec = re.search(rf"\bexec {re.escape(LAUNCHER)}\s+(.*)", line)
    if after_exec:
        try:
            words = shlex.split(after_exec.group(1))
        except ValueError:
            return None
    if not words or words[0].startswith("-"):
        return None
    script = words[0]
    if script.startswith("$"):
        environment = {str(e.get("name")): str(e.get("value")) for e in container.get("environment", [])}
        script = environment.get(script.strip("${}"), "")
    return posixpath.normpath(script) if script else None


def check_definition_script(packed: Packed, command: list[str], definition: dict[str, Any]) -> None:
    """A workdir's command runs a script of the folder: one that is the job definition's own script and not in
    the folder (an image's script, such as the all-reduce benchmark) is refused, as the folder would be packed
    and sent for nothing."""
    own = definition_script(definition)
    if not command or own is None:
        return
    script = posixpath.normpath(command[0])
    if script == own and script not in packed.files:
        raise TrainctlError(
            f"command: {clip_path(command[0])} is the job definition's own script: run one of workdir "
            f"{clip_path(packed.folder)} (train.py --lr 0.1) or drop the workdir"
        )


def upload(s3: Any, bucket: str, packed: Packed) -> bool:
    """Store the archive under its digest unless it is there already; True when it was uploaded."""
    with aws_errors():
        try:
            s3.head_object(Bucket=bucket, Key=packed.key)
            return False
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            # A missing key answers 404 only to a caller with s3:ListBucket on the bucket, 403 to one without
            # (S3 API Reference, HeadObject, Permissions).
            if code == "403":
                raise TrainctlError(
                    f"S3 refused HeadObject on the workdir (403): your credentials need s3:ListBucket and "
                    f"s3:GetObject on {bucket}, and s3:PutObject on {PREFIX}*",
                    ExitCode.AWS,
                ) from None
            if code not in ("404", "NoSuchKey", "NotFound"):
                raise
        s3.put_object(
            Bucket=bucket,
            Key=packed.key,
            Body=packed.archive,
            ContentType="application/gzip",
            ChecksumAlgorithm="SHA256",
        )
    return True


def environment(bucket: str, packed: Packed | None, setup: str | None) -> dict[str, str]:
    """The job's environment overrides that make every node's launcher fetch the folder and run the setup."""
    env = {URI_ENV: packed.uri(bucket)} if packed else {}
    if setup:
        env[SETUP_ENV] = setup
    return env


def prepare(task: Task) -> Packed | None:
    """The task's workdir, packed and its script checked: before any AWS call."""
    if task.workdir is None:
        return None
    packed = pack(task.workdir)
    check_script(packed, task.command)
    return packed


def stage(packed: Packed, *, bucket: str | None, s3: Any, dry_run: bool) -> str:
    """Upload the archive unless the bucket has it (or this is a dry run); one line saying which."""
    if not bucket:
        raise TrainctlError(
            "workdir: the TrainingData stack has no DatasetBucket output to upload it to: `make deploy`"
        )
    what = f"workdir {packed.folder}: {len(packed.files)} files, {_size(len(packed.archive))} packed"
    if dry_run:
        return f"{what}, would be stored as {packed.uri(bucket)} (dry run: nothing uploaded)"
    if upload(s3, bucket, packed):
        return f"{what}, uploaded to {packed.uri(bucket)}"
    return f"{what}, already stored as {packed.uri(bucket)}: nothing uploaded"
