"""Copy a training job's checkpoint directory to and from S3. Called by distributed_run.sh.

    checkpoint_sync.py restore s3://bucket/prefix/ DIR   # prints how many files it restored
    checkpoint_sync.py upload DIR s3://bucket/prefix/    # prints how many files it uploaded

`upload` sends the files that S3 does not have yet, or has with another size or an older time;
it never deletes anything in S3 (the checkpoint bucket is versioned, and a node's partial view
must not erase what another attempt wrote). Credentials and region come from the usual AWS
sources (on Batch: the job role); AWS_ENDPOINT_URL points it elsewhere (the tests use a local S3).
A failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlparse

import boto3
from botocore.exceptions import BotoCoreError, ClientError


def split(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
    prefix = parsed.path.strip("/")
    return parsed.netloc, f"{prefix}/" if prefix else ""


def remote_objects(client, bucket: str, prefix: str) -> dict[str, dict]:
    objects: dict[str, dict] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"]] = item
    return objects


def restore(client, uri: str, directory: Path) -> int:
    bucket, prefix = split(uri)
    count = 0
    for key in remote_objects(client, bucket, prefix):
        relative = key[len(prefix) :]
        if not relative or relative.endswith("/"):
            continue
        target = (directory / relative).resolve()
        if directory.resolve() not in target.parents:
            raise ValueError(f"object {key!r} would land outside {directory}")
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target))
        count += 1
    return count


def upload(client, directory: Path, uri: str) -> int:
    bucket, prefix = split(uri)
    remote = remote_objects(client, bucket, prefix)
    count = 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        key = prefix + path.relative_to(directory).as_posix()
        stat = path.stat()
        known = remote.get(key)
        if known and known["Size"] == stat.st_size and known["LastModified"].timestamp() >= stat.st_mtime:
            continue
        client.upload_file(str(path), bucket, key)
        count += 1
    return count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    restore_cmd = commands.add_parser("restore")
    restore_cmd.add_argument("uri")
    restore_cmd.add_argument("directory", type=Path)
    upload_cmd = commands.add_parser("upload")
    upload_cmd.add_argument("directory", type=Path)
    upload_cmd.add_argument("uri")
    args = parser.parse_args(argv)

    client = boto3.client("s3")
    try:
        if args.command == "restore":
            count = restore(client, args.uri, args.directory)
            print(f"checkpoint_sync: restored {count} files from {args.uri}", file=sys.stderr)
        else:
            count = upload(client, args.directory, args.uri)
            print(f"checkpoint_sync: uploaded {count} files to {args.uri}", file=sys.stderr)
    except (BotoCoreError, ClientError, OSError, ValueError) as error:
        print(f"checkpoint_sync: {args.command} failed: {error}", file=sys.stderr)
        return 1
    print(count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
