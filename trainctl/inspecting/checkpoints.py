"""A training job's checkpoints, in container/launcher/checkpoint_sync.py's layout: under
<CHECKPOINT_URI>/<lineage>/ (the job's CHECKPOINT_LINEAGE, which the capacity fallback gives a job it
resubmits, else its id; container/launcher/restore_phase.py) node I keeps its files under `node-I/` and,
written after them, the manifest `node-I.manifest.json` ({"format": 1, "files": {name: {size,
mtime_ns, version_id}}}) naming every complete file and the S3 version that holds it. Only what a
manifest names is a checkpoint: other objects under `node-I/` are uploads a kill cut short or files
deleted since. CHECKPOINT_URI is s3://<checkpoint bucket>/<fleet> by default."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.aws import aws_errors
from trainctl.deployment import Deployment, Fleet
from trainctl.errors import TrainctlError, clip_path
from trainctl.jobs import job_environment

# checkpoint_sync.py's MANIFEST_FORMAT and manifest name.
MANIFEST_FORMAT = 1
_MANIFEST = re.compile(r"node-(\d+)\.manifest\.json")
_PARTIAL_SUFFIX = ".partial"
# The launcher's variable (container/launcher/node_settings.py), set by the capacity fallback's resubmitter.
LINEAGE_VARIABLE = "CHECKPOINT_LINEAGE"


@dataclass(frozen=True)
class CheckpointFile:
    node: int
    name: str  # the path below node-<i>/, as the manifest names it
    size: int
    mtime_ns: int
    version_id: str | None  # None where the bucket is not versioned

    @property
    def path(self) -> str:
        return f"node-{self.node}/{self.name}"


def lineage_id(job: dict[str, Any]) -> str:
    """The prefix the job's launcher keeps its checkpoints under, as the launcher chooses it."""
    return job_environment(job).get(LINEAGE_VARIABLE) or str(job["jobId"])


def checkpoint_location(job: dict[str, Any], fleet: Fleet, deployment: Deployment) -> tuple[str, str]:
    """(bucket, key prefix) of the job's checkpoints: its lineage's, shared by every job of it."""
    uri = job_environment(job).get("CHECKPOINT_URI")
    if not uri:
        if not deployment.checkpoint_bucket:
            raise TrainctlError(
                "the job has no CHECKPOINT_URI and no TrainingData stack names a checkpoint bucket: nothing to list"
            )
        uri = f"s3://{deployment.checkpoint_bucket}/{fleet.name}"
    if not uri.startswith("s3://"):
        raise TrainctlError(f"the job's CHECKPOINT_URI {uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    prefix = prefix.strip("/")
    lineage = lineage_id(job)
    return bucket, f"{prefix}/{lineage}/" if prefix else f"{lineage}/"


def list_checkpoints(s3: Any, bucket: str, prefix: str) -> list[CheckpointFile]:
    """Every file the nodes' manifests name, by node then name."""
    files: list[CheckpointFile] = []
    with aws_errors():
        manifests = []
        # The manifests sit directly under the prefix; "/" keeps the node-<i>/ files out of the listing.
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            for item in page.get("Contents", []):
                match = _MANIFEST.fullmatch(str(item["Key"])[len(prefix) :])
                if match:
                    manifests.append((int(match.group(1)), str(item["Key"])))
        for node, key in sorted(manifests):
            files += _manifest_files(node, key, s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    return files


def _manifest_files(node: int, key: str, body: bytes) -> list[CheckpointFile]:
    try:
        document = json.loads(body)
        if document.get("format") != MANIFEST_FORMAT:
            raise TrainctlError(f"{key}: manifest format {document.get('format')!r}; this trainctl reads format 1")
        return [
            CheckpointFile(node, str(name), int(e["size"]), int(e["mtime_ns"]), e.get("version_id"))
            for name, e in sorted(document["files"].items())
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        writer = "container/launcher/checkpoint_sync.py"
        raise TrainctlError(f"{key} is not a checkpoint manifest ({writer} writes them)") from None


def ready_folder(directory: Path) -> None:
    """`checkpoints --download DIR`: the folder made (with its parents) and a file written and removed in it,
    before anything is listed, so that a folder that cannot hold the files is refused in one line."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise TrainctlError(
            f"--download {clip_path(directory)}: cannot create or write that folder ({error.strerror or error}); "
            "give a folder you can write (a missing one is made)"
        ) from None


def download(
    s3: Any,
    bucket: str,
    prefix: str,
    files: list[CheckpointFile],
    directory: Path,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Fetch exactly the versions the manifests name into directory/node-<i>/<name>, with the mtime the
    file had when uploaded (as checkpoint_sync.py's restore does); never outside directory/node-<i>."""
    root = directory.resolve()
    try:
        _download_all(s3, bucket, prefix, files, root, on_bytes)
    except OSError as error:
        raise TrainctlError(f"cannot write under {directory}: {error.strerror or error}") from error


def _download_all(
    s3: Any, bucket: str, prefix: str, files: list[CheckpointFile], root: Path, on_bytes: Callable[[int], None] | None
) -> None:
    for item in files:
        node_root = root / f"node-{item.node}"
        target = (node_root / item.name).resolve()
        if not target.is_relative_to(node_root) or target == node_root:
            raise TrainctlError(
                f"refusing to write manifest entry {item.name!r} of node {item.node} outside {node_root}"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + _PARTIAL_SUFFIX)
        extra = {"VersionId": item.version_id} if item.version_id else None
        with aws_errors():
            # Callback: boto3's transfer reports each chunk's bytes as it lands (progress bar).
            s3.download_file(bucket, f"{prefix}{item.path}", str(partial), ExtraArgs=extra, Callback=on_bytes)
        if partial.stat().st_size != item.size:
            partial.unlink()
            raise TrainctlError(f"s3://{bucket}/{prefix}{item.path}: {item.size} bytes expected as the manifest says")
        os.utime(partial, ns=(item.mtime_ns, item.mtime_ns))
        partial.replace(target)
