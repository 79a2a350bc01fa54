"""The job's code, on every node before the rendezvous (distributed_run.sh calls it; docs/workdir.md).

    workdir_fetch.py --dir DIR

WORKDIR_URI (s3://bucket/workdirs/<sha256>.tar.gz, set by `trainctl submit --workdir`): the archive is read
from S3 with the job role, checked against the digest in its name, and unpacked into DIR, which is emptied
first (a retried attempt on the same host starts clean). WORKDIR_SETUP: a shell command run with bash in DIR
(in the current folder without WORKDIR_URI) after the unpack; its output is the job's.

Exits 0, or 2 with one line when the archive cannot be fetched or unpacked or the setup fails: the job's own
problem on every node, which the launcher (and, for a child, the main node) ends the job with, not retried.
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

NAME = "workdir_fetch.py"
# trainctl/workdir.py names every archive by the sha256 of its tar.
DIGEST_NAME = re.compile(r"(?:^|/)([0-9a-f]{64})\.tar\.gz$")


class Refused(Exception):
    pass


def _inside(path: str) -> bool:
    normal = posixpath.normpath(path)
    return not posixpath.isabs(path) and normal != ".." and not normal.startswith("../")


def fetch(uri: str) -> bytes:
    """The archive's tar bytes, checked against the digest its name carries."""
    bucket, _, key = uri[len("s3://") :].partition("/") if uri.startswith("s3://") else ("", "", "")
    if not bucket or not key:
        raise Refused(f"WORKDIR_URI={uri[:120]!r} is not an s3://bucket/key URI")
    import boto3  # only here: the setup alone needs no AWS

    try:
        body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as error:  # botocore's errors: one line, whatever went wrong
        raise Refused(f"cannot read {uri}: {str(error).splitlines()[0][:150]}") from None
    try:
        tar = gzip.decompress(body)
    except (OSError, EOFError) as error:
        raise Refused(f"{uri} is not a gzip archive ({error})") from None
    named = DIGEST_NAME.search(key)
    if named and hashlib.sha256(tar).hexdigest() != named.group(1):
        raise Refused(f"{uri}: its content does not match the digest in its name; submit again")
    return tar


def unpack(tar_bytes: bytes, directory: str) -> int:
    """Regular files and links that stay inside `directory`; links last, so that no file is written through
    one. Returns the number of files."""
    if os.path.lexists(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    links = []
    count = 0
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for member in tar:
            if not _inside(member.name):
                raise Refused(f"archive entry {member.name!r} is outside the workdir")
            target = os.path.join(directory, member.name)
            if member.issym():
                if not _inside(posixpath.join(posixpath.dirname(member.name), member.linkname)):
                    raise Refused(f"archive link {member.name} -> {member.linkname} points outside the workdir")
                links.append((member.linkname, target))
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
    for linkname, target in links:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(linkname, target)
        count += 1
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
        except (Refused, OSError, tarfile.TarError) as error:
            print(f"{NAME}: workdir: {error}", file=sys.stderr)
            return 2
        where = args.dir
        print(f"{NAME}: {count} files from {uri} in {args.dir} ({time.monotonic() - start:.1f} s)", file=sys.stderr)
    if setup:
        print(f"{NAME}: setup: {setup}", file=sys.stderr, flush=True)
        status = subprocess.call(["bash", "-c", setup], cwd=where)  # noqa: S603, S607 - the job's own command
        if status != 0:
            print(f"{NAME}: setup exited {status}: {setup[:120]}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
