"""A job's secrets: `--secret NAME=ARN` and a task file's `secrets:`, and the refusal of environment variables
whose names look like a secret's.

Why: a job's environment is readable by every job of the deployment (the job role's batch:DescribeJobs takes
no narrower resource than `*`) and by anyone allowed batch:DescribeJobDefinitions. A secret instead goes into
the job's revision as a Batch `secrets` entry (`{name, valueFrom}`, trainctl/submitting/revisions.py): the
ECS agent reads its value with the deployment's execution role when the container starts, and DescribeJobs
shows only the ARN. Batch's SubmitJob cannot carry secrets (API ContainerOverrides has no `secrets`).

The deployment says which secrets its execution role may read (context key jobSecrets; the jobs stack's
outputs JobExecutionRole and JobSecrets); a secret it does not cover is refused before anything is
registered, as the node would fail to start with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from config.job_secrets import VALUE_FROM_RULE, covers, resource_of, secret_word
from trainctl.deployment import JOBS_STACK, outputs_of
from trainctl.errors import TrainctlError
from trainctl.submitting.requests import ENV_NAME, RESERVED_ENV_PREFIX

# The jobs stack's outputs with jobSecrets (stacks/jobs_stack.py).
ROLE_OUTPUT = "JobExecutionRole"
ALLOWED_OUTPUT = "JobSecrets"
CONTEXT_KEY = "jobSecrets"
ALLOW_FLAG = "--allow-env-secrets"

SecretOption = Annotated[
    list[str] | None,
    typer.Option(
        metavar="NAME=ARN",
        help="Environment variable on every node whose value the node reads from a Secrets Manager secret or "
        "SSM parameter when it starts (never shown by DescribeJobs); repeatable (docs/jobs.md, Secrets).",
    ),
]
AllowEnvSecretsOption = Annotated[
    bool,
    typer.Option(
        "--allow-env-secrets",
        help="Take environment variables whose names look like a secret's (HF_TOKEN, WANDB_API_KEY) all the same; "
        "their values are then readable by every job (docs/jobs.md, Secrets).",
    ),
]


def name_problem(name: Any) -> str | None:
    """What is wrong with a secret's variable name, in words; None when nothing is."""
    if not isinstance(name, str) or not ENV_NAME.match(name):
        return f"{str(name)[:40]!r} is not an environment variable name (letters, digits and _, not first a digit)"
    if name.startswith(RESERVED_ENV_PREFIX):
        return f"{name}: names starting with {RESERVED_ENV_PREFIX} are reserved for Batch"
    return None


def value_from_problem(value_from: Any) -> str | None:
    """What is wrong with where a secret's value comes from, in words; None when nothing is."""
    if not isinstance(value_from, str) or resource_of(value_from) is None:
        return f"{str(value_from)[:40]!r} is not {VALUE_FROM_RULE}"
    return None


def parse_secrets(pairs: Iterable[str]) -> dict[str, str]:
    """`--secret NAME=ARN` options as a mapping, each checked; a NAME given twice is refused."""
    secrets: dict[str, str] = {}
    for pair in pairs:
        name, sep, value_from = pair.partition("=")
        if not sep:
            raise TrainctlError(f"--secret {pair[:80]!r} is not NAME=ARN (HF_TOKEN=arn:aws:secretsmanager:...)")
        problem = name_problem(name)
        if problem:
            raise TrainctlError(f"--secret {problem}")
        problem = value_from_problem(value_from)
        if problem:
            raise TrainctlError(f"--secret {name}: {problem}")
        if name in secrets:
            raise TrainctlError(f"--secret {name} is given twice: keep one")
        secrets[name] = value_from
    return secrets


def refuse_secret_looking(names: Iterable[str], *, named: Callable[[str], str]) -> None:
    """Refuse the first name that looks like a secret's (config/job_secrets.py, secret_word), in one line that
    points to secrets; `named(name)` says where it was given (`--env HF_TOKEN`, `task.yaml: field env.HF_TOKEN`)."""
    for name in names:
        word = secret_word(name)
        if word:
            raise TrainctlError(
                f"{named(name)}: named like a secret ({word}), readable by any job: use --secret or `secrets:` "
                f"(docs/jobs.md), or {ALLOW_FLAG}"
            )


def refuse_env_file_secrets(environment: Mapping[str, str], env_file: Path | None) -> None:
    """refuse_secret_looking for the names of an --env-file, which the refusal names by its file name."""
    refuse_secret_looking(environment, named=lambda name: f"--env-file {(env_file or Path()).name}: {name}")


def refuse_in_both(environment: Mapping[str, str], secrets: Mapping[str, str], *, named: str) -> None:
    both = next((name for name in secrets if name in environment), None)
    if both:
        raise TrainctlError(f"{named} {both} is also an environment variable of the job: give it in one of them")


@dataclass(frozen=True, kw_only=True)
class SecretsAccess:
    """What the deployment lets jobs read: its execution role and the ARNs (trailing * allowed) it may read."""

    execution_role: str
    allowed: tuple[str, ...]


def deployment_access(cloudformation: Any) -> SecretsAccess:
    """The deployment's execution role and jobSecrets, from the jobs stack's outputs; refused in one line
    when it was deployed without jobSecrets."""
    outputs = outputs_of(cloudformation, JOBS_STACK) or {}
    role = outputs.get(ROLE_OUTPUT)
    if not role:
        raise TrainctlError(
            f"secrets: the deployment has no execution role to read them with: deploy with -c {CONTEXT_KEY}=<ARNs "
            "jobs may read> (docs/jobs.md, Secrets)"
        )
    allowed = tuple(item for item in outputs.get(ALLOWED_OUTPUT, "").split(",") if item)
    return SecretsAccess(execution_role=role, allowed=allowed)


def check_covered(secrets: Mapping[str, str], access: SecretsAccess) -> None:
    """Refuse a secret the execution role may not read: its node would never start."""
    for name, value_from in secrets.items():
        resource = resource_of(value_from) or value_from
        if not any(covers(allowed, resource) for allowed in access.allowed):
            raise TrainctlError(
                f"secret {name}: {resource} is not in the deployment's {CONTEXT_KEY} (what its jobs may read): add "
                "it and deploy"
            )
