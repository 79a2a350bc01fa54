"""One node's cold start as one CloudWatch embedded-metric-format (EMF) line on stdout.

Started in the background by distributed_run.sh just before it launches torchrun, on ECS only (when
ECS_CONTAINER_METADATA_URI_V4 is set). It reports, in seconds:
  ColdStartImagePullSeconds            the task's image pull: PullStoppedAt - PullStartedAt from the
                                       ECS task metadata v4 `/task` response
  ColdStartContainerToLauncherSeconds  the container's StartedAt (task metadata v4, this container)
                                       to the launcher's first line
  ColdStartPreflightSeconds            the launcher's fabric preflight
  ColdStartRendezvousSeconds           torchrun's start to its first worker process: torch elastic
                                       starts workers only once every node has joined the rendezvous
A number it cannot observe is left out; a missing or failing metadata endpoint is not an error.
Dimensions: Fleet (TRAINING_FLEET) and InstanceId (IMDSv2, else the host name). Python 3.10, stdlib.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path

# Repeated from config/metrics.py (a test pins them equal).
NAMESPACE = "TrainingPlatform"
FLEET_DIMENSION = "Fleet"
INSTANCE_DIMENSION = "InstanceId"
FLEET_ENV = "TRAINING_FLEET"
IMAGE_PULL = "ColdStartImagePullSeconds"
CONTAINER_TO_LAUNCHER = "ColdStartContainerToLauncherSeconds"
PREFLIGHT = "ColdStartPreflightSeconds"
RENDEZVOUS = "ColdStartRendezvousSeconds"

METADATA_ENV = "ECS_CONTAINER_METADATA_URI_V4"
# boto3's variable for the instance metadata endpoint; tests point it at 127.0.0.1.
IMDS_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
HTTP_TIMEOUT = 2.0
# Environment torch elastic gives every worker it starts (torch/distributed/elastic/agent/server/
# local_elastic_agent.py, _start_workers), after the rendezvous completed.
WORKER_MARKERS = (b"TORCHELASTIC_RUN_ID=", b"LOCAL_RANK=")


def parse_time(value: str) -> float:
    """ECS timestamps, e.g. 2023-07-14T16:34:21.418093387Z, as epoch seconds. Python 3.10's
    fromisoformat takes neither the Z nor nanoseconds."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", value.strip())
    if not match:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    zone = "+00:00" if match[3] == "Z" else match[3]
    return datetime.fromisoformat(match[1] + zone).timestamp() + float("0." + (match[2] or "0"))


def get_json(url: str) -> Mapping[str, object]:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as response:  # noqa: S310 - ECS-provided URL
        data = json.loads(response.read())
    if not isinstance(data, dict):
        raise ValueError(f"{url} did not return a JSON object")
    return data


def metadata_seconds(uri: str | None, launcher_start: float) -> dict[str, float]:
    """Image pull and container-to-launcher seconds from the ECS task metadata endpoint v4
    (ECS developer guide, "Task metadata endpoint version 4": `${uri}/task` carries PullStartedAt and
    PullStoppedAt; `${uri}` this container's StartedAt)."""
    found: dict[str, float] = {}
    if not uri:
        return found
    try:
        task = get_json(f"{uri.rstrip('/')}/task")
        started, stopped = task.get("PullStartedAt"), task.get("PullStoppedAt")
        if isinstance(started, str) and isinstance(stopped, str):
            found[IMAGE_PULL] = round(parse_time(stopped) - parse_time(started), 3)
        container = get_json(uri.rstrip("/"))
        container_start = container.get("StartedAt")
        if isinstance(container_start, str):
            found[CONTAINER_TO_LAUNCHER] = round(launcher_start - parse_time(container_start), 3)
    except (OSError, ValueError) as error:
        print(f"cold_start.py: task metadata unavailable ({error}); no image pull time", file=sys.stderr)
    return found


def instance_id() -> str:
    """The EC2 instance id through IMDSv2; the host name where IMDS is blocked or absent
    (ECS_AWSVPC_BLOCK_IMDS, outside EC2)."""
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        base = os.environ.get(IMDS_ENV, "http://169.254.169.254").rstrip("/")
        try:
            token_request = urllib.request.Request(  # noqa: S310 - fixed or test endpoint
                f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
            )
            with urllib.request.urlopen(token_request, timeout=1) as response:  # noqa: S310
                token = response.read().decode()
            id_request = urllib.request.Request(  # noqa: S310
                f"{base}/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
            )
            with urllib.request.urlopen(id_request, timeout=1) as response:  # noqa: S310
                found = str(response.read().decode()).strip()
            if re.fullmatch(r"i-[0-9a-f]{8,17}", found):
                return found
        except OSError:
            pass
    return socket.gethostname()


def _parent(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may hold spaces and parentheses: state, ppid, ...
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root: int, proc: Path = Path("/proc")) -> Iterator[int]:
    pids = [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    parents = {pid: _parent(pid, proc) for pid in pids}
    for pid in pids:
        seen, current = 0, parents.get(pid)
        while current and seen < 64:
            if current == root:
                yield pid
                break
            current, seen = parents.get(current), seen + 1


def worker_started(root: int, proc: Path = Path("/proc")) -> bool:
    for pid in descendants(root, proc):
        try:
            environ = (proc / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        variables = environ.split(b"\0")
        if all(any(v.startswith(marker) for v in variables) for marker in WORKER_MARKERS):
            return True
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # A zombie (exited, not yet reaped) still answers signal 0: field 3 of /proc/<pid>/stat is Z.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False  # gone between the signal and the read
    except (OSError, IndexError):
        return True


def rendezvous_seconds(pid: int, started: float, timeout: float, poll: float = 0.5) -> float | None:
    """Seconds from `started` until a worker appears under `pid`; None if it exits or time runs out."""
    deadline = started + timeout
    while time.time() < deadline and alive(pid):
        if worker_started(pid):
            return round(time.time() - started, 3)
        time.sleep(poll)
    return None


def emf_line(values: Mapping[str, float], properties: Mapping[str, str], fleet: str, node: str) -> str:
    """The embedded metric format: `_aws` names the metrics, the same keys hold their values
    (CloudWatch user guide, "Specification: Embedded metric format")."""
    document: dict[str, object] = {
        "_aws": {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [[FLEET_DIMENSION], [FLEET_DIMENSION, INSTANCE_DIMENSION]],
                    "Metrics": [{"Name": name, "Unit": "Seconds"} for name in values],
                }
            ],
        },
        FLEET_DIMENSION: fleet,
        INSTANCE_DIMENSION: node,
        **properties,
        **values,
    }
    return json.dumps(document, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher-start", type=float, required=True, help="epoch seconds of the launcher's start")
    parser.add_argument("--preflight-seconds", type=float, default=None)
    parser.add_argument("--watch-pid", type=int, default=None, help="torchrun's pid (the launcher's, after exec)")
    parser.add_argument("--rendezvous-start", type=float, default=None, help="epoch seconds torchrun started")
    parser.add_argument("--rendezvous-timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)

    values = metadata_seconds(os.environ.get(METADATA_ENV), args.launcher_start)
    if args.preflight_seconds is not None:
        values[PREFLIGHT] = round(args.preflight_seconds, 3)
    if args.watch_pid is not None:
        started = args.rendezvous_start or time.time()
        # Join timeout plus a minute: torchrun gives up by then and exits, which ends the watch too.
        seconds = rendezvous_seconds(args.watch_pid, started, args.rendezvous_timeout + 60)
        if seconds is not None:
            values[RENDEZVOUS] = seconds
    properties = {
        "JobId": os.environ.get("AWS_BATCH_JOB_ID", "local"),
        "NodeIndex": os.environ.get("AWS_BATCH_JOB_NODE_INDEX", "0"),
    }
    print(emf_line(values, properties, os.environ.get(FLEET_ENV, "unknown"), instance_id()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
