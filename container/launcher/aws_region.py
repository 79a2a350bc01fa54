"""The region the container's AWS clients name, for node_watch.py, checkpoint_sync.py, workdir_fetch.py and
hang_evidence.py.

AWS_REGION, else AWS_DEFAULT_REGION (botocore reads only the latter), else the region in this task's ARN from
the ECS task metadata. On EC2 the ECS agent set neither variable until aws/amazon-ecs-agent#4946 (April 2026),
and an S3 client that names no region then goes to us-east-1's endpoint: in aws-cn or GovCloud no bucket of
the job's partition answers there, and elsewhere every call takes a redirect.
Stdlib only, Python 3.10.
"""

from __future__ import annotations

from collections.abc import Mapping

from cold_start import METADATA_ENV, get_json  # beside this file in every image


def region(environ: Mapping[str, str]) -> str | None:
    """AWS_REGION, AWS_DEFAULT_REGION, else the region of this task's ARN (ECS developer guide, "Task metadata
    endpoint version 4": `${ECS_CONTAINER_METADATA_URI_V4}/task` has TaskARN, arn:aws:ecs:<region>:...)."""
    named = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if named:
        return named
    uri = environ.get(METADATA_ENV)
    if not uri:
        return None
    try:
        arn = str(get_json(f"{uri.rstrip('/')}/task").get("TaskARN", ""))
    except (OSError, ValueError):
        return None
    parts = arn.split(":")
    return parts[3] if len(parts) > 5 and parts[3] else None
