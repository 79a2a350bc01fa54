"""The job's code, on every node before the rendezvous (distributed_run.sh calls it; docs/workdir.md).

    workdir_fetch.py --dir DIR

WORKDIR_URI (s3://bucket/workdirs/<sha256 of the tar>.tar.gz?versionId=<version>&sha256=<sha256 of the
object>, set by `trainctl submit --workdir`): the pinned version of the archive is read from S3 with the job role,
hashed and gunzipped as it streams in (to a temporary file, never whole in memory, and no more than
MAX_TAR_BYTES), and checked twice before anything is unpacked: the bytes read against the sha256 the URI pins,
the tar against the digest its name must carry. A URI without versionId (a bucket that keeps no versions) reads
the key's current object, still checked against its sha256; one without a query at all (an older trainctl's)
is read and checked against the digest in its name only. The archive is unpacked into DIR, which is
emptied first (a retried attempt on the same host starts clean) when this script made it (its MARKER file),
used when new or empty, and refused otherwise. Only regular files, folders and symbolic links are unpacked
(no sparse files, hard links or devices), and no more than MAX_FILE_BYTES of files, the most
`trainctl submit` packs: an archive that anyone with write access to the bucket replaced cannot fill the
node's disk or memory. WORKDIR_SETUP: a shell command run with bash in DIR
(in the current folder without WORKDIR_URI) after the unpack; its output is the job's.

Exits 0, or 2 with one line when the archive cannot be fetched or unpacked or the setup fails: the job's own
problem on every node, which the launcher (and, for a child, the main node) ends the job with, not retried;
75 (TRANSIENT_EXIT, retried by the job definitions) when S3 still fails with a 5xx, throttling or a broken
connection after a few tries.
Stdlib + boto3, Python 3.10 (the oldest interpreter the images ship).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from typing import IO, Any, NamedTuple
from urllib.parse import parse_qs

from aws_region import region  # beside this file in every image

NAME = "workdir_fetch.py"
# trainctl/submitting/workdir.py names every archive by the sha256 of its tar.
DIGEST_NAME = re.compile(r"(?:^|/)([0-9a-f]{64})\.tar\.gz$")
# The query that pins it (trainctl/submitting/workdir.py VERSION_PARAM, CHECKSUM_PARAM): S3's version id and
# the sha256 of the object's bytes, in hex.
VERSION_PARAM = "versionId"
CHECKSUM_PARAM = "sha256"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


# What `trainctl submit` packs at most (trainctl/submitting/workdir.py MAX_BYTES; a test keeps them equal), and
# the tar of it: those bytes plus a 512-byte header and up to 511 bytes of padding per file, with room to spare.
MAX_FILE_BYTES = 100 * 1024 * 1024
MAX_TAR_BYTES = 2 * MAX_FILE_BYTES
CHUNK_BYTES = 1 << 20
# A name that cannot be a training file's: marks WORKDIR_DIR as this script's to empty.
MARKER = ".workdir_fetch"
# Exit code for an S3 error still there after the retries: the code the job definitions retry
# (training_constructs/jobs/multi_node_job.py RETRY_RULES; docs/health.md), without taking the node out.
TRANSIENT_EXIT = 75
RETRY_DELAYS = (2.0, 5.0, 10.0)
# S3's throttling and server-side codes (S3 API Reference, "Error responses"), besides any 5xx status.
TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "ThrottlingException"}
)


class Refused(Exception):
    """The job's own problem, the same on every node: exit 2, not retried."""


class Transient(Exception):
    """S3 could not answer for a while: exit TRANSIENT_EXIT, retried."""


def _inside(path: str) -> bool:
    normal = posixpath.normpath(path)
    return not posixpath.isabs(path) and normal != ".." and not normal.startswith("../")


def _transient(error: Exception) -> bool:
    """An S3 error that may pass on its own: a 5xx, throttling, a connection or read that broke. A missing
    object, a 403 or a bad request is the job's own and is not."""
    import botocore.exceptions

    if isinstance(error, botocore.exceptions.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return status >= 500 or code in TRANSIENT_CODES
    return isinstance(
        error,
        (
            botocore.exceptions.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError
            botocore.exceptions.ResponseStreamingError,
            botocore.exceptions.IncompleteReadError,
        ),
    )


class Source(NamedTuple):
    """What WORKDIR_URI names: the object, the version and sha256 it pins (None when it pins none), the
    tar's digest its name carries, and how a line shows it."""

    bucket: str
    key: str
    version: str | None
    checksum: str | None
    digest: str
    shown: str


def parse(uri: str) -> Source:
    """WORKDIR_URI read, or refused in one line naming the form trainctl submit writes."""
    location, _, query = uri.partition("?")
    bucket, _, key = location[len("s3://") :].partition("/") if location.startswith("s3://") else ("", "", "")
    if not bucket or not key:
        raise Refused(f"WORKDIR_URI={uri[:120]!r} is not an s3://bucket/key URI")
    named = DIGEST_NAME.search(key)
    if not named:
        raise Refused(f"WORKDIR_URI={uri[:120]!r} is not named <sha256>.tar.gz, as trainctl submit names a workdir")
    version = checksum = None
    if query:
        try:
            fields = parse_qs(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            fields = {}
        checksum = "".join(fields.get(CHECKSUM_PARAM, []))
        version = "".join(fields.get(VERSION_PARAM, [])) or None
        if (
            set(fields) - {VERSION_PARAM, CHECKSUM_PARAM}
            or any(len(values) != 1 or not values[0] for values in fields.values())
            or not SHA256_HEX.fullmatch(checksum)
        ):
            raise Refused(
                f"WORKDIR_URI={uri[:160]!r}: its query is {VERSION_PARAM}=<S3 version id>&{CHECKSUM_PARAM}=<64 "
                "lowercase hex digits>, as trainctl submit writes it"
            )
    shown = f"{location} (version {version})" if version else location
    return Source(bucket, key, version, checksum or None, named.group(1), shown)


class _Hashed:
    """An object's body, hashed as it is read."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.sha256 = hashlib.sha256()

    def read(self, size: int) -> bytes:
        data: bytes = self.body.read(size)
        self.sha256.update(data)
        return data


def _size(count: int) -> str:
    return f"{count / 2**20:g} MiB" if count >= 2**20 else f"{count} bytes"


def _gunzip(body: Any, out: IO[bytes], uri: str) -> str:
    """Inflate the gzip stream `body` into `out`, refusing past MAX_TAR_BYTES; the tar's sha256."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing (zlib manual, inflateInit2)
    digest = hashlib.sha256()
    size = 0

    def keep(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > MAX_TAR_BYTES:
            raise Refused(f"{uri} unpacks to more than {_size(MAX_TAR_BYTES)}: not a workdir trainctl packed")
        digest.update(data)
        out.write(data)

    try:
        while chunk := body.read(CHUNK_BYTES):
            # max_length bounds each piece: a small archive that inflates hugely never sits in memory.
            keep(inflate.decompress(chunk, CHUNK_BYTES))
            while inflate.unconsumed_tail:
                keep(inflate.decompress(inflate.unconsumed_tail, CHUNK_BYTES))
            if inflate.unused_data:  # bytes after the end: refused now, not gathered in memory
                break
        keep(inflate.flush())
    except zlib.error as error:
        raise Refused(f"{uri} is not a gzip archive ({error})") from None
    if not inflate.eof or inflate.unused_data:
        raise Refused(f"{uri} is not one whole gzip archive")
    return digest.hexdigest()


def _get(bucket: str, key: str, uri: str, out: IO[bytes], version: str | None = None) -> tuple[str, str]:
    """The object (that version of it, when given), gunzipped into `out`: the sha256 of its tar and of its own
    bytes. A transient error is tried again (from the start) after RETRY_DELAYS, then raises Transient."""
    import boto3  # only here: the setup alone needs no AWS

    client = boto3.client("s3", region_name=region(os.environ))
    for delay in (*RETRY_DELAYS, None):
        try:
            out.seek(0)
            out.truncate()
            pinned = {"VersionId": version} if version else {}
            body = _Hashed(client.get_object(Bucket=bucket, Key=key, **pinned)["Body"])
            return _gunzip(body, out, uri), body.sha256.hexdigest()
        except Refused:
            raise
        except Exception as error:  # botocore's errors: one line, whatever went wrong
            line = str(error).splitlines()[0][:150] if str(error) else type(error).__name__
            if not _transient(error):
                raise Refused(f"cannot read {uri}: {line}") from None
            if delay is None:
                raise Transient(f"cannot read {uri} after {len(RETRY_DELAYS) + 1} tries: {line}") from None
            print(f"{NAME}: workdir: {line}; trying again in {delay:g} s", file=sys.stderr, flush=True)
            time.sleep(delay)
    raise AssertionError("unreachable")


def fetch(uri: str) -> IO[bytes]:
    """The archive's tar, in a temporary file read from its start, checked against the sha256 the URI pins
    and the digest its name carries (trainctl names every workdir by it: a key without one is not a workdir
    it uploaded)."""
    source = parse(uri)
    out = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller, who closes it
    try:
        digest, checksum = _get(source.bucket, source.key, source.shown, out, source.version)
        if source.checksum and checksum != source.checksum:
            raise Refused(
                f"{source.shown}: its bytes are not the archive trainctl submit pinned (sha256 {checksum[:12]}..., "
                f"not {source.checksum[:12]}...): it was written over; submit again"
            )
        if digest != source.digest:
            raise Refused(f"{source.shown}: its content does not match the digest in its name; submit again")
    except BaseException:
        out.close()
        raise
    out.seek(0)
    return out


def _prepare(directory: str) -> None:
    """An empty `directory` marked as this script's: one it made before is emptied (a retried attempt on the
    same host starts clean); a folder with files it did not make (WORKDIR_DIR=/workspace) is refused."""
    marker = os.path.join(directory, MARKER)
    if os.path.lexists(directory):
        if os.path.islink(directory) or not os.path.isdir(directory):
            raise Refused(f"WORKDIR_DIR={directory[-80:]} is not a folder: name a new or empty folder")
        if os.path.exists(marker):  # its contents, not the folder: it may be a mount point
            for entry in os.scandir(directory):
                shutil.rmtree(entry.path) if entry.is_dir(follow_symlinks=False) else os.unlink(entry.path)
        elif os.listdir(directory):
            raise Refused(
                f"WORKDIR_DIR={directory[-80:]} has files this script did not unpack: "
                "name a new or empty folder (it is emptied on every attempt)"
            )
    os.makedirs(directory, exist_ok=True)
    with open(marker, "w", encoding="utf-8") as out:
        out.write(f"unpacked by {NAME}: emptied on every attempt\n")


def unpack(tar_file: bytes | IO[bytes], directory: str) -> int:
    """Regular files, folders and links that stay inside `directory`; links last, so that no file is written
    through one, and each link checked where it really points once made (a chain such as `l -> .`, `x -> l/..`
    reads as inside but is not); none may lie under a link. No more than MAX_FILE_BYTES of files. Returns the
    number of files."""
    _prepare(directory)
    links = []
    link_names: set[str] = set()
    count = 0
    size = 0
    source_file = io.BytesIO(tar_file) if isinstance(tar_file, bytes) else tar_file
    with tarfile.open(fileobj=source_file, mode="r:") as tar:
        for member in tar:
            if not _inside(member.name):
                raise Refused(f"archive entry {member.name!r} is outside the workdir")
            name = posixpath.normpath(member.name)
            parents = name.split("/")[:-1]
            if any("/".join(parents[: i + 1]) in link_names for i in range(len(parents))):
                raise Refused(f"archive entry {member.name!r} lies under a link")
            target = os.path.join(directory, name)
            if member.issym():
                if not _inside(posixpath.join(posixpath.dirname(name), member.linkname)):
                    raise Refused(f"archive link {member.name} -> {member.linkname} points outside the workdir")
                links.append((member.name, member.linkname, target))
                link_names.add(name)
            elif member.issparse():
                # tarfile counts a GNU sparse member as a file and writes it whole: 228 bytes can be 256 MiB.
                raise Refused(f"archive entry {member.name!r} is a sparse file, which trainctl never packs")
            elif member.isfile():
                size += member.size
                if size > MAX_FILE_BYTES:
                    raise Refused(
                        f"archive files pass {_size(MAX_FILE_BYTES)} at {member.name!r}: more than trainctl packs"
                    )
                source = tar.extractfile(member)
                assert source is not None
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
                os.chmod(target, 0o755 if member.mode & 0o100 else 0o644)
                count += 1
            elif not member.isdir():
                raise Refused(f"archive entry {member.name!r} is neither a file nor a link")
    for _, linkname, target in links:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(linkname, target)
        count += 1
    # Once all exist, where each really leads: a link may pass through one made after it.
    root = os.path.realpath(directory)
    escaping = [(n, t) for n, t, path in links if os.path.commonpath([root, os.path.realpath(path)]) != root]
    if escaping:
        for _, _, path in links:
            os.unlink(path)
        name, linkname = escaping[0]
        raise Refused(f"archive link {name} -> {linkname} leads outside the workdir through another link")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=NAME)
    parser.add_argument("--dir", required=True, help="where to unpack the workdir")
    args = parser.parse_args(argv)
    uri = os.environ.get("WORKDIR_URI", "")
    setup = os.environ.get("WORKDIR_SETUP", "")
    where = None
    if uri:
        start = time.monotonic()
        try:
            with fetch(uri) as tar_file:
                count = unpack(tar_file, args.dir)
        except Transient as error:
            print(f"{NAME}: workdir: {error}", file=sys.stderr)
            return TRANSIENT_EXIT
        except (Refused, OSError, tarfile.TarError) as error:
            print(f"{NAME}: workdir: {error}", file=sys.stderr)
            return 2
        except MemoryError:
            print(f"{NAME}: workdir: {uri} needs more memory than the container has to unpack", file=sys.stderr)
            return 2
        where = args.dir
        print(f"{NAME}: {count} files from {uri} in {args.dir} ({time.monotonic() - start:.1f} s)", file=sys.stderr)
    if setup:
        print(f"{NAME}: setup: {setup}", file=sys.stderr, flush=True)
        status = subprocess.call(["bash", "-c", setup], cwd=where)  # noqa: S607 - the job's own command
        if status != 0:
            print(f"{NAME}: setup exited {status}: {setup[:120]}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
