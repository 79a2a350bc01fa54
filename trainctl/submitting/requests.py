"""SubmitJob requests, built from the command line without calling AWS (what --dry-run prints)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trainctl.errors import TrainctlError

# SubmitJob jobName: up to 128 letters, numbers, hyphens and underscores, the first alphanumeric
# (API SubmitJob, jobName).
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
# The same rule in words: submit's --name and a task file's `name:` both say it.
JOB_NAME_RULE = "a job name is 1-128 letters, digits, '-' or '_', starting with a letter or digit"
# JobTimeout.attemptDurationSeconds: "The minimum value for the timeout is 60 seconds" (API JobTimeout).
MIN_TIMEOUT_SECONDS = 60
# attemptDurationSeconds is an Integer (API JobTimeout), a signed 32-bit value: Batch refuses more.
MAX_TIMEOUT_SECONDS = 2**31 - 1
# Environment names Batch reserves for its own variables (API ContainerOverrides, environment:
# "Environment variables cannot start with AWS_BATCH").
RESERVED_ENV_PREFIX = "AWS_BATCH"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The job definitions have one open node range "0:" (training_constructs/jobs/multi_node_job.py); an
# override for the same range reaches every node.
ALL_NODES = "0:"
# Tag that groups the jobs of one sweep (tag keys may hold letters, digits, spaces and + - = . _ : / @).
SWEEP_TAG = "trainctl:sweep"


def parse_env(pairs: Iterable[str]) -> dict[str, str]:
    """`K=V` strings as an ordered mapping; a later K wins."""
    environment: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.match(name):
            raise TrainctlError(f"--env {pair!r} is not NAME=VALUE with NAME a shell variable name (TASK=Isaac-...)")
        if name.startswith(RESERVED_ENV_PREFIX):
            raise TrainctlError(f"--env {name}: names starting with {RESERVED_ENV_PREFIX} are reserved for Batch")
        environment[name] = value
    return environment


def parse_env_file(path: Path) -> dict[str, str]:
    """`--env-file`: NAME=VALUE lines; blank lines and lines starting with # are skipped; a value in one pair
    of matching quotes loses them; nothing else is interpreted (no $ expansion)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TrainctlError(f"--env-file {path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise TrainctlError(f"--env-file {path}: not UTF-8 text") from None
    environment: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition("=")
        if not sep or not ENV_NAME.match(name):
            raise TrainctlError(
                f"--env-file {path} line {number}: {stripped[:40]!r} is not NAME=VALUE (NAME: letters, digits, _; "
                "# starts a comment)"
            )
        if name.startswith(RESERVED_ENV_PREFIX):
            raise TrainctlError(
                f"--env-file {path} line {number}: {name}: names starting with {RESERVED_ENV_PREFIX} are reserved"
            )
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        environment[name] = value
    return environment


def parse_grid(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`--grid K=v1,v2` options as (K, [v1, v2]), in the order given."""
    if not specs:
        raise TrainctlError("sweep needs at least one --grid NAME=v1,v2")
    grid: list[tuple[str, list[str]]] = []
    for spec in specs:
        name, sep, values = spec.partition("=")
        points = [v for v in values.split(",") if v]
        if not sep or not ENV_NAME.match(name) or not points:
            raise TrainctlError(f"--grid {spec!r} is not NAME=v1,v2,... (for example MAX_ITERATIONS=250,500)")
        if name.startswith(RESERVED_ENV_PREFIX):
            raise TrainctlError(f"--grid {name}: names starting with {RESERVED_ENV_PREFIX} are reserved for Batch")
        if any(name == seen for seen, _ in grid):
            raise TrainctlError(f"--grid {name} is given twice: list every value in one --grid {name}=v1,v2")
        grid.append((name, points))
    return grid


def grid_points(grid: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """Every combination of the grid's values, the last --grid varying fastest."""
    names = [name for name, _ in grid]
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(v for _, v in grid))]


def point_name(prefix: str, point: dict[str, str]) -> str:
    """A job name that says which point of the grid it runs: `<prefix>-<K>-<v>-<K2>-<v2>`."""
    parts = [prefix] + [f"{name}-{value}" for name, value in point.items()]
    name = re.sub(r"[^A-Za-z0-9_-]", "_", "-".join(parts))
    return check_job_name(name[:128])


def check_job_name(name: str) -> str:
    if not JOB_NAME.match(name):
        raise TrainctlError(f"--name {name!r}: {JOB_NAME_RULE}")
    return name


def check_flags(*, name: str | None, timeout_seconds: int | None) -> None:
    """What can be refused before anything is asked of AWS."""
    if name is not None:
        check_job_name(name)
    if timeout_seconds is not None and not MIN_TIMEOUT_SECONDS <= timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise TrainctlError(
            f"--timeout {timeout_seconds}: Batch accepts {MIN_TIMEOUT_SECONDS} to {MAX_TIMEOUT_SECONDS} seconds"
        )


def submit_request(
    *,
    name: str,
    queue: str,
    definition: str,
    nodes: int | None = None,
    environment: dict[str, str] | None = None,
    timeout_seconds: int | None = None,
    share: str | None = None,
    tags: dict[str, str] | None = None,
    command: list[str] | None = None,
    retry_strategy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The SubmitJob request body, as boto3's batch.submit_job takes it."""
    request: dict[str, Any] = {"jobName": check_job_name(name), "jobQueue": queue, "jobDefinition": definition}
    if share is not None:
        request["shareIdentifier"] = share
    overrides: dict[str, Any] = {}
    if nodes is not None:
        if nodes < 1:
            raise TrainctlError(f"--nodes {nodes}: a multi-node job needs at least 1 node")
        # numNodes may be overridden only because the definition's node range is open-ended
        # (API NodeOverrides).
        overrides["numNodes"] = nodes
    container: dict[str, Any] = {}
    if environment:
        container["environment"] = [{"name": k, "value": v} for k, v in environment.items()]
    if command:
        container["command"] = list(command)
    if container:
        overrides["nodePropertyOverrides"] = [{"targetNodes": ALL_NODES, "containerOverrides": container}]
    if overrides:
        request["nodeOverrides"] = overrides
    if timeout_seconds is not None:
        check_flags(name=None, timeout_seconds=timeout_seconds)
        request["timeout"] = {"attemptDurationSeconds": timeout_seconds}
    if retry_strategy is not None:
        request["retryStrategy"] = retry_strategy
    if tags:
        request["tags"] = dict(tags)
    return request
