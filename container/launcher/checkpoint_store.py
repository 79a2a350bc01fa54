"""One node's checkpoint files and manifest under a job's URI in S3, for checkpoint_sync.py: the layout, the
manifest's format, uploads and version-pinned downloads, and which S3 errors are worth another try.
Python 3.10, stdlib + boto3."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from boto3.exceptions import Boto3Error
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from checkpoint_commit import PARTIAL_SUFFIX
from checkpoint_sets import NodeWord

MANIFEST_FORMAT = 1
# boto3's transfers wrap refusals in their own errors (S3UploadFailedError, RetriesExceededError).
ERRORS = (BotoCoreError, ClientError, Boto3Error, OSError, ValueError)
# What S3 answers when it wants the client to slow down or try again (S3 API reference, "Error responses";
# S3 user guide, "Best practices design patterns": back off and retry on 503 Slow Down). Botocore's own
# retries last seconds; a throttled final upload would leave the attempt's files on the node alone.
TRANSIENT_CODES = ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "503", "500")


def transient(error: BaseException) -> bool:
    """An error worth another try: a throttle or a 5xx from S3, or no connection, anywhere in the chain
    (boto3's transfer manager wraps the ClientError in its own error, sometimes only in the message)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError)):
            return True
        if isinstance(seen, ClientError) and str(seen.response.get("Error", {}).get("Code", "")) in TRANSIENT_CODES:
            return True
        seen = seen.__cause__ or seen.__context__
    return any(f"({code})" in str(error) for code in TRANSIENT_CODES)


@dataclass(frozen=True)
class Entry:
    size: int
    mtime_ns: int
    version_id: str | None  # None where the bucket is not versioned
    listed_at: float | None = None  # when this node's manifest first listed this state of the file

    def matches(self, stat: os.stat_result) -> bool:
        return self.size == stat.st_size and self.mtime_ns == stat.st_mtime_ns


Manifest = dict[str, Entry]


def entries(files: object, where: str) -> Manifest:
    """A manifest's files, or ValueError naming where it came from: a manifest another release (or a
    person) wrote with other fields must stop with one line, not a traceback."""
    try:
        return {str(name): Entry(**fields) for name, fields in files.items()}  # type: ignore[attr-defined]
    except (AttributeError, TypeError) as error:
        raise ValueError(f"{where}: not a list of files this release can read ({error})") from error


def word_of(document: dict[str, Any], where: str) -> NodeWord:
    """What a manifest says besides its files (checkpoint_sets.py); ValueError naming where it came from."""
    try:
        written_at, final = document.get("written_at"), document.get("final", False)
        if not isinstance(final, bool):
            raise TypeError(f"final is {final!r}, not true or false")
        return NodeWord(
            None if written_at is None else float(written_at),
            final,
            {str(unit): float(since) for unit, since in document.get("pending", {}).items()},
            tuple((float(start), float(end)) for start, end in document.get("blind", [])),
            tuple((str(unit), float(since), float(began)) for unit, since, began in document.get("unfinished", [])),
        )
    except (AttributeError, TypeError, ValueError) as error:
        raise ValueError(f"{where}: not a node's word this release can read ({error})") from error


class NodeStore:
    """One node's files and manifest under a job's URI."""

    def __init__(self, client: Any, uri: str, node: int) -> None:
        self.node = node
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
        base = parsed.path.strip("/")
        base = f"{base}/" if base else ""
        self.client = client
        self.bucket = parsed.netloc
        self.files_prefix = f"{base}node-{node}/"
        self.manifest_key = f"{base}node-{node}.manifest.json"

    def read_document(self) -> tuple[Manifest, NodeWord | None]:
        """The node's files and its word; None for the word where it has written no manifest."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.manifest_key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return {}, None
            raise
        document = json.loads(body)
        if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"{self.manifest_key}: not a format-{MANIFEST_FORMAT} manifest")
        files = entries(document.get("files"), self.manifest_key)
        listed = document.get("listed", {})
        if not isinstance(listed, dict):
            raise ValueError(f"{self.manifest_key}: its listing times are not a map")
        try:
            times = {str(name): None if at is None else float(at) for name, at in listed.items()}
        except (TypeError, ValueError) as error:
            raise ValueError(f"{self.manifest_key}: a listing time is not a number ({error})") from error
        files = {name: replace(e, listed_at=times.get(name)) for name, e in files.items()}
        return files, word_of(document, self.manifest_key)

    def write_manifest(self, manifest: Manifest, word: NodeWord | None = None) -> None:
        # The files keep the fields every format-1 reader knows (an older release on the same lineage reads
        # them); when each was listed, and the node's word, sit beside them, where such a reader looks not.
        files = {
            name: {"size": e.size, "mtime_ns": e.mtime_ns, "version_id": e.version_id} for name, e in manifest.items()
        }
        document: dict[str, Any] = {"format": MANIFEST_FORMAT, "files": dict(sorted(files.items()))}
        document["listed"] = {name: e.listed_at for name, e in sorted(manifest.items()) if e.listed_at is not None}
        if word is not None and word.written_at is not None:
            document["written_at"] = word.written_at
            document["final"] = word.final
            document["pending"] = dict(sorted(word.pending.items()))
            document["blind"] = [list(span) for span in word.blind]
            document["unfinished"] = [list(item) for item in word.unfinished]
        self.client.put_object(Bucket=self.bucket, Key=self.manifest_key, Body=json.dumps(document, indent=1).encode())

    def download(self, name: str, entry: Entry, target: Path) -> None:
        extra = {"VersionId": entry.version_id} if entry.version_id else None
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        self.client.download_file(self.bucket, self.files_prefix + name, str(partial), ExtraArgs=extra)
        if partial.stat().st_size != entry.size:
            partial.unlink()
            raise ValueError(f"{self.files_prefix + name}: expected {entry.size} bytes as the manifest says")
        os.utime(partial, ns=(entry.mtime_ns, entry.mtime_ns))
        partial.replace(target)

    def upload(self, path: Path, name: str) -> Entry | None:
        """Upload one file; None if it changed while being read (it is tried again next time)."""
        before = path.stat()
        key = self.files_prefix + name
        self.client.upload_file(str(path), self.bucket, key)
        after = path.stat()
        if (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns, after.st_ino):
            return None
        # Only this node writes under its prefix, so the newest version is the one just uploaded.
        head = self.client.head_object(Bucket=self.bucket, Key=key)
        return Entry(after.st_size, after.st_mtime_ns, head.get("VersionId"))


MANIFEST_KEY = re.compile(r"node-(\d+)\.manifest\.json")


def restore_order(client: Any, uri: str, node: int, main: int) -> list[NodeStore]:
    """Every node's store that has a manifest under `uri`, in the order a restore applies them, a name found
    in a later one replacing the earlier: the other nodes (the lowest index last), the main node, this node.
    Training ranks land on nodes in the order they join the rendezvous, so rank 0's files (what rank-0-only
    savers write) may be on any node, and a rank may read another rank's files. Listing needs s3:ListBucket on
    the bucket (S3 API reference, ListObjectsV2), which the job role has (tests/test_job_queues.py)."""
    parsed = urlparse(uri)
    base = parsed.path.strip("/")
    base = f"{base}/" if base else ""
    found: set[int] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=base, Delimiter="/"):
        for item in page.get("Contents", []):
            match = MANIFEST_KEY.fullmatch(str(item["Key"])[len(base) :])
            if match:
                found.add(int(match.group(1)))
    order = [*sorted(found - {node, main}, reverse=True), *dict.fromkeys((main, node))]
    return [NodeStore(client, uri, index) for index in order]


def local_path(directory: Path, name: str) -> Path:
    target = (directory / name).resolve()
    if directory.resolve() not in target.parents:
        raise ValueError(f"manifest entry {name!r} would land outside {directory}")
    return target
