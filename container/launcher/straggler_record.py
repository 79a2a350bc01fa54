"""What the straggler watch (straggler_watch.py) says and keeps: where a node runs (its instance and AZ), the
metric line of a slow window, the straggler's line, and the record of a replacement beside the checkpoints,
which the next attempt reads. Stdlib only, Python 3.10; boto3 for the record (as checkpoint_sync.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import node_fault  # beside this file in every image
from straggler_score import NodeScore, Thresholds

STRAGGLER_WINDOWS = "StragglerWindows"  # config/metrics.py (a test keeps them equal)
INSTANCE_FILE = "instance"  # in NODE_STATE_DIR: "<instance id> <AZ>", written by the host's boot check


def where(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """This node's instance id and AZ as its host's boot check wrote them (jobs run with IMDS blocked), else
    the host name and "unknown"."""
    with contextlib.suppress(OSError, ValueError):
        text = (node_fault.state_dir(environ) / INSTANCE_FILE).read_text()[:200].split()
        if len(text) == 2:
            return text[0], text[1]
    return socket.gethostname(), "unknown"


def emf_line(fleet: str, job: str, result: NodeScore, instance: str, az: str) -> str:
    """StragglerWindows as an embedded-metric-format line (CloudWatch user guide, "Specification: Embedded
    metric format"), the node's particulars as properties: the Fleet dimension alone keeps the count bounded."""
    document = {
        "_aws": {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": node_fault.NAMESPACE,
                    "Dimensions": [[node_fault.FLEET_DIMENSION]],
                    "Metrics": [{"Name": STRAGGLER_WINDOWS}],
                }
            ],
        },
        node_fault.FLEET_DIMENSION: fleet,
        STRAGGLER_WINDOWS: 1,
        "JobId": job,
        "Node": result.node,
        "Rank": result.rank,
        "Instance": instance,
        "AvailabilityZone": az,
        "Ratio": round(result.ratio, 3),
    }
    return json.dumps(document, separators=(",", ":"))


def describe(result: NodeScore, instance: str, az: str, thresholds: Thresholds, window: float) -> str:
    return (
        f"node {result.node} (instance {instance}, AZ {az}), rank {result.rank}: {result.seconds * 1000:.1f} ms of "
        f"work before its first gradient collective per step, {result.ratio:.2f}x the other nodes' "
        f"{result.others * 1000:.1f} ms, for {thresholds.windows} windows of {window:g} s"
    )


def previous_replacement(uri: str, attempt: int) -> str | None:
    """What MARKER_URI says when the attempt before this one replaced a node; None otherwise (or unreadable,
    said once: the watch then reports only, as if it had)."""
    if attempt <= 1:
        return None
    try:
        import boto3
        from aws_region import region

        bucket, _, key = uri.removeprefix("s3://").partition("/")
        body = boto3.client("s3", region_name=region(os.environ)).get_object(Bucket=bucket, Key=key)["Body"].read()
        record = json.loads(body)
    except Exception as error:
        if "NoSuchKey" in str(error) or "404" in str(error):
            return None
        return f"cannot read {uri} ({error.__class__.__name__}), so cannot tell whether the last attempt replaced one"
    if int(record.get("attempt", 0)) == attempt - 1:
        return f"this job's attempt {attempt - 1} replaced node {record.get('node')} ({record.get('instance')})"
    return None


def write_marker(uri: str, record: dict[str, Any]) -> str | None:
    try:
        import boto3
        from aws_region import region

        bucket, _, key = uri.removeprefix("s3://").partition("/")
        client = boto3.client("s3", region_name=region(os.environ))
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(record).encode())
    except Exception as error:
        return f"{error.__class__.__name__}: {str(error)[:160]}"
    return None
