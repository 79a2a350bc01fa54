"""A training job's checkpoints: the launcher keeps them under <CHECKPOINT_URI>/<job id>/
(container/distributed_run.sh); CHECKPOINT_URI is s3://<checkpoint bucket>/<fleet> by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainctl.aws import aws_errors
from trainctl.deployment import Deployment, Fleet
from trainctl.errors import TrainctlError
from trainctl.jobs import job_environment


def checkpoint_location(job: dict[str, Any], fleet: Fleet, deployment: Deployment) -> tuple[str, str]:
    """(bucket, key prefix) of the job's checkpoints."""
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
    return bucket, f"{prefix}/{job['jobId']}/" if prefix else f"{job['jobId']}/"


def list_checkpoints(s3: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    with aws_errors():
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            objects += page.get("Contents", [])
    return objects


def download(s3: Any, bucket: str, prefix: str, objects: list[dict[str, Any]], directory: Path) -> None:
    """Copy every object into `directory`, keeping the paths below the prefix; never outside it."""
    root = directory.resolve()
    for item in objects:
        target = (root / item["Key"][len(prefix) :]).resolve()
        if not target.is_relative_to(root):
            raise TrainctlError(f"refusing to write {item['Key']!r} outside {root}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with aws_errors():
            s3.download_file(bucket, item["Key"], str(target))
