"""The job's code, on every node before the rendezvous (distributed_run.sh calls it; docs/workdir.md).

    workdir_fetch.py --dir DIR

WORKDIR_URI (s3://bucket/workdirs/<sha256>.tar.gz, set by `trainctl submit --workdir`): the archive is read
from S3 with the job role, checked against the digest in its name, and unpacked into DIR, which is emptied
first (a retried attempt on the same host starts clean) when this script made it (its MARKER file), used when
new or empty, and refused otherwise. WORKDIR_SETUP: a shell command run with bash in DIR
(in the current folder without WORKDIR_URI) after the unpack; its output is the job's.

Exits 0, or 2 with one line when the archive cannot be fetched or unpacked or the setup fails: the job's own
problem on every node, which the launcher (and, for a child, the main node) ends the job with, not retried;
75 (TRANSIENT_EXIT, retried by the job definitions) when S3 still fails with a 5xx, throttling or a broken
connection after a few tries.
Stdlib + boto3, Python 3.10 (the oldest interpreter the images ship).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import time

from aws_region import region  # beside this file in every image

NAME = "workdir_fetch.py"
# trainctl/submitting/workdir.py names every archive by the sha256 of its tar.
DIGEST_NAME = re.compile(r"(?:^|/)([0-9a-f]{64})\.tar\.gz$")


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


def _get(bucket: str, key: str, uri: str) -> bytes:
    """The object's bytes; a transient error is tried again after RETRY_DELAYS, then raises Transient."""
    import boto3  # only here: the setup alone needs no AWS

    client = boto3.client("s3", region_name=region(os.environ))
    for delay in (*RETRY_DELAYS, None):
        try:
            return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as error:  # botocore's errors: one line, whatever went wrong
            line = str(error).splitlines()[0][:150] if str(error) else type(error).__name__
            if not _transient(error):
                raise Refused(f"cannot read {uri}: {line}") from None
            if delay is None:
                raise Transient(f"cannot read {uri} after {len(RETRY_DELAYS) + 1} tries: {line}") from None
            print(f"{NAME}: workdir: {line}; trying again in {delay:g} s", file=sys.stderr, flush=True)
            time.sleep(delay)
    raise AssertionError("unreachable")


def fetch(uri: str) -> bytes:
    """The archive's tar bytes, checked against the digest its name carries."""
    bucket, _, key = uri[len("s3://") :].partition("/") if uri.startswith("s3://") else ("", "", "")
    if not bucket or not key:
        raise Refused(f"WORKDIR_URI={uri[:120]!r} is not an s3://bucket/key URI")
    body = _get(bucket, key, uri)
    try:
        tar = gzip.decompress(body)
    except (OSError, EOFError) as error:
        raise Refused(f"{uri} is not a gzip archive ({error})") from None
    named = DIGEST_NAME.search(key)
    if named and hashlib.sha256(tar).hexdigest() != named.group(1):
        raise Refused(f"{uri}: its content does not match the digest in its name; submit again")
    return tar


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


def unpack(tar_bytes: bytes, directory: str) -> int:
    """Regular files and links that stay inside `directory`; links last, so that no file is written through
    one, and each link checked where it really points once made (a chain such as `l -> .`, `x -> l/..` reads as
    inside but is not); none may lie under a link. Returns the number of files."""
    _prepare(directory)
    links = []
    link_names: set[str] = set()
    count = 0
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
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
            elif member.isfile():
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
            count = unpack(fetch(uri), args.dir)
        except Transient as error:
            print(f"{NAME}: workdir: {error}", file=sys.stderr)
            return TRANSIENT_EXIT
        except (Refused, OSError, tarfile.TarError) as error:
            print(f"{NAME}: workdir: {error}", file=sys.stderr)
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
