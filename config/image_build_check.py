"""`make deploy`'s first step: with imageBuild=local (the default) and an image to build, stop at once
when this machine has no working Docker engine, instead of failing in the middle of a deploy.

    python -m config.image_build_check [cdk arguments...]

Reads the context as the CDK CLI would (cdk.json, cdk.context.json, then -c/--context from the
arguments). Makes no AWS call. Exit 0: nothing to check, or Docker answers; exit 2: one line saying
why, naming -c imageBuild=cloud.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from config.context import ConfigError, read_settings

ROOT = Path(__file__).resolve().parent.parent
DOCKER_TIMEOUT_SECONDS = 15


def context_from(arguments: Sequence[str], root: Path = ROOT) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for name in ("cdk.json", "cdk.context.json"):
        path = root / name
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                raise SystemExit(f"error: {path.name} is not JSON ({error}); fix it before deploying") from error
            context.update(data.get("context", {}) if name == "cdk.json" else data)
    pending = False
    for argument in arguments:
        value = None
        if pending:
            value, pending = argument, False
        elif argument in ("-c", "--context"):
            pending = True
        elif argument.startswith(("-c=", "--context=")):
            value = argument.split("=", 1)[1]
        if value and "=" in value:
            key, item = value.split("=", 1)
            context[key] = item
    return context


def needs_docker(context: dict[str, Any]) -> bool:
    try:
        settings = read_settings(context)
    except ConfigError:
        return False  # the synth reports it, in the app's own words
    return settings.images.build == "local" and any(not fleet.image_uri for fleet in settings.fleets)


def docker_problem() -> str | None:
    """None when a Docker engine answers; otherwise what is wrong, in a few words."""
    docker = shutil.which("docker")
    if docker is None:
        return "there is no docker command on PATH"
    try:
        result = subprocess.run(  # noqa: S603 - fixed arguments
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"docker info did not answer within {DOCKER_TIMEOUT_SECONDS} s"
    except OSError as error:
        return f"{docker} cannot be run ({error.strerror or error})"
    if result.returncode != 0:
        detail = next((line.strip() for line in result.stderr.splitlines() if line.strip()), "no message")
        return f"docker cannot reach an engine ({detail})"
    return None


def main(arguments: Sequence[str]) -> int:
    if not needs_docker(context_from(arguments)):
        return 0
    problem = docker_problem()
    if problem is None:
        return 0
    print(
        f"error: imageBuild=local (the default) builds the training images with Docker on this machine, but "
        f"{problem}; start Docker, or deploy with -c imageBuild=cloud to build them in AWS CodeBuild",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
