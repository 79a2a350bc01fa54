"""Code that goes with a job (`workdir:` in a task file, `submit --workdir`, docs/workdir.md): the folder packed
into one deterministic archive (the files its .gitignore files leave in, no .git), stored once per content hash
in the deployment's dataset bucket under workdirs/, pinned in the job by the version it was stored as and the
archive's own checksum, and fetched and unpacked by every node's launcher before the rendezvous
(container/launcher/workdir_fetch.py, which runs the task's `setup:` after the unpack)."""

from __future__ import annotations

import base64
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
from urllib.parse import urlencode

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
# WORKDIR_URI's query: s3://bucket/workdirs/<digest>.tar.gz?versionId=<version>&sha256=<hex of the archive>.
# versionId is S3's own name for a version (its REST API's `?versionId=` subresource); the node gets that
# version and refuses bytes whose sha256 is not this one (container/launcher/workdir_fetch.py reads both).
VERSION_PARAM = "versionId"
CHECKSUM_PARAM = "sha256"
# A conditional write that meets a concurrent one is answered 409 ConditionalRequestConflict, to be tried
# again (S3 API Reference, PutObject, If-None-Match).
CONFLICT_TRIES = 3


@dataclass(frozen=True)
class Packed:
    folder: Path
    archive: bytes  # tar.gz
    digest: str  # sha256 of the tar: the same files give the same digest
    files: frozenset[str]  # paths inside the folder, '/'-separated
    checksum: str  # sha256 of the archive itself (hex): what S3 stores and the node reads

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.digest}.tar.gz"

    def location(self, bucket: str) -> str:
        return f"s3://{bucket}/{self.key}"

    def uri(self, bucket: str, version: str | None = None) -> str:
        """WORKDIR_URI: the key, the version stored (when the bucket keeps versions) and the archive's sha256."""
        query = {VERSION_PARAM: version} if version else {}
        return f"{self.location(bucket)}?{urlencode({**query, CHECKSUM_PARAM: self.checksum})}"

    @property
    def s3_checksum(self) -> str:
        """The archive's sha256 as S3 keeps it (x-amz-checksum-sha256: base64 of the digest)."""
        return base64.b64encode(bytes.fromhex(self.checksum)).decode()


@dataclass(frozen=True)
class Stored:
    """Where the archive is, after upload: the version to pin (None where the bucket keeps none)."""

    version: str | None
    uploaded: bool
    # What the key held was not this archive (someone else wrote it): ours was stored over it.
    replaced: bool = False


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
    archive = gzip.compress(raw, compresslevel=6, mtime=0)
    return Packed(
        folder=folder,
        archive=archive,
        digest=hashlib.sha256(raw).hexdigest(),
        files=frozenset(files),
        checksum=hashlib.sha256(archive).hexdigest(),
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


def _code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _refused(operation: str, bucket: str) -> TrainctlError:
    return TrainctlError(
        f"S3 refused {operation} on the workdir (403): your credentials need s3:PutObject and s3:GetObject "
        f"on {bucket}/{PREFIX}*",
        ExitCode.AWS,
    )


def _version(answer: dict[str, Any]) -> str | None:
    """The version S3 stored or holds; None in a bucket that keeps none ("null": versioning suspended)."""
    version = answer.get("VersionId")
    return str(version) if version and version != "null" else None


def _put(s3: Any, bucket: str, packed: Packed, *, if_absent: bool) -> dict[str, Any]:
    # boto3 sends the body's sha256, which S3 checks against the bytes and keeps for HeadObject to answer.
    condition = {"IfNoneMatch": "*"} if if_absent else {}
    answer: dict[str, Any] = s3.put_object(
        Bucket=bucket,
        Key=packed.key,
        Body=packed.archive,
        ContentType="application/gzip",
        ChecksumAlgorithm="SHA256",
        **condition,
    )
    return answer


def _held(s3: Any, bucket: str, packed: Packed) -> tuple[str | None, bool] | None:
    """What the key holds now: (its version, whether it is this archive); None when it holds nothing."""
    try:
        head = s3.head_object(Bucket=bucket, Key=packed.key, ChecksumMode="ENABLED")
    except botocore.exceptions.ClientError as error:
        if _code(error) in ("404", "NoSuchKey", "NotFound"):
            return None
        if _code(error) in ("403", "AccessDenied"):
            raise _refused("HeadObject", bucket) from None
        raise
    # The whole object's sha256, which S3 checked against the bytes when they were written. An object with
    # none, or with a multipart upload's checksum of checksums, is not what trainctl's single PUT stores.
    same = head.get("ChecksumSHA256") == packed.s3_checksum and head.get("ContentLength") == len(packed.archive)
    return _version(head), same


def upload(s3: Any, bucket: str, packed: Packed) -> Stored:
    """Store the archive under its digest only where the key holds nothing: a conditional write (S3 User
    Guide, "How to prevent object overwrites with conditional writes",
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html: PutObject with
    If-None-Match: *, refused with 412 Precondition Failed while the key has a current version, in a versioned
    bucket too). Refused, the key's current object is looked at: this archive (its sha256) is used as it is;
    anything else (someone else wrote the key) gets this archive stored over it, as a new version in the
    dataset bucket, which keeps versions (training_constructs/data/training_data.py), so that the job pins its
    own bytes whatever the key holds."""
    with aws_errors():
        for _ in range(CONFLICT_TRIES):
            try:
                return Stored(_version(_put(s3, bucket, packed, if_absent=True)), uploaded=True)
            except botocore.exceptions.ClientError as error:
                code = _code(error)
                if code in ("403", "AccessDenied"):
                    raise _refused("PutObject", bucket) from None
                if code == "ConditionalRequestConflict":
                    continue
                if code != "PreconditionFailed":
                    raise
            held = _held(s3, bucket, packed)
            if held is None:
                continue  # deleted since the refusal: written again, still only where nothing is
            version, same = held
            if same:
                return Stored(version, uploaded=False)
            return Stored(_version(_put(s3, bucket, packed, if_absent=False)), uploaded=True, replaced=True)
    raise TrainctlError(
        f"workdir: {packed.location(bucket)} kept changing while trainctl stored it ({CONFLICT_TRIES} tries): "
        "submit again",
        ExitCode.AWS,
    )


def environment(bucket: str, packed: Packed | None, setup: str | None) -> dict[str, str]:
    """The job's environment overrides that make every node's launcher fetch the folder and run the setup.
    WORKDIR_URI carries the archive's sha256 here; stage() adds the version once it is stored."""
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


def _pin(uri: str, environment: dict[str, str] | None, request: dict[str, Any] | None) -> None:
    """WORKDIR_URI replaced by `uri` in `environment` and in the SubmitJob request's container overrides."""
    if environment is not None and URI_ENV in environment:
        environment[URI_ENV] = uri
    for override in (request or {}).get("nodeOverrides", {}).get("nodePropertyOverrides", []):
        for entry in override.get("containerOverrides", {}).get("environment", []):
            if entry.get("name") == URI_ENV:
                entry["value"] = uri


def stage(
    packed: Packed,
    *,
    bucket: str | None,
    s3: Any,
    dry_run: bool,
    environment: dict[str, str] | None = None,
    request: dict[str, Any] | None = None,
) -> str:
    """Upload the archive unless the bucket holds it (or this is a dry run); one line saying which. The URI
    that pins what is stored (version and sha256) replaces WORKDIR_URI in `environment` and in `request`'s
    overrides when given: stage before registering a revision that carries them."""
    if not bucket:
        raise TrainctlError(
            "workdir: the TrainingData stack has no DatasetBucket output to upload it to: `make deploy`"
        )
    what = f"workdir {packed.folder}: {len(packed.files)} files, {_size(len(packed.archive))} packed"
    where = packed.location(bucket)
    if dry_run:
        return f"{what}, would be stored as {where} (dry run: nothing uploaded)"
    stored = upload(s3, bucket, packed)
    _pin(packed.uri(bucket, stored.version), environment, request)
    pinned = (
        f"pinned to version {stored.version}" if stored.version else "pinned by sha256 (the bucket keeps no versions)"
    )
    if stored.replaced:
        return f"{what}: {where} held other bytes (written by someone else): stored this archive over it, {pinned}"
    if stored.uploaded:
        return f"{what}, uploaded to {where}, {pinned}"
    return f"{what}, already stored as {where}: nothing uploaded, {pinned}"
