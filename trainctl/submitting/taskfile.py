"""`trainctl run TASK.yaml`: a job described in a file, checked field by field before anything is asked
of AWS. Every field is also an option of `submit`; an unknown field (a typo) is refused with the field
it most resembles."""

from __future__ import annotations

import difflib
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from trainctl.errors import TrainctlError, clip, clip_path
from trainctl.submitting.requests import (
    ENV_NAME,
    JOB_NAME,
    JOB_NAME_RULE,
    MAX_TIMEOUT_SECONDS,
    MIN_TIMEOUT_SECONDS,
    RESERVED_ENV_PREFIX,
)
from trainctl.submitting.secrets import name_problem, refuse_secret_looking, value_from_problem

# The launcher every job definition runs its script through (training_constructs/jobs/workloads.py
# LAUNCHER; a test keeps the two equal): torchrun / neuron rendezvous across the nodes.
LAUNCHER = "/opt/training/distributed_run.sh"
# Batch retry strategy: 1..10 attempts (API RetryStrategy, attempts).
MAX_ATTEMPTS = 10
# MNP jobs: at most 1,000 nodes (Batch user guide, multi-node parallel jobs).
MAX_NODES = 1000
# What each whole-number field takes, for the refusal of a boolean, a fraction or text.
WHOLE_NUMBERS = {
    "nodes": f"a whole number of nodes, 1 to {MAX_NODES}",
    "timeout": f"whole seconds, {MIN_TIMEOUT_SECONDS} to {MAX_TIMEOUT_SECONDS}",
    "attempts": f"a whole number of attempts, 1 to {MAX_ATTEMPTS}",
}


def _value_from(value: Any) -> Any:
    problem = value_from_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# A secret's valueFrom; refused with its variable's name in the field (`secrets.HF_TOKEN`).
ValueFrom = Annotated[str, BeforeValidator(_value_from)]


class Task(BaseModel):
    """One multi-node job. Only `fleet` is required."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str
    job: Literal["training", "benchmark"] = "training"
    nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    name: str | None = None
    # A string is split as a shell would; a list is taken as it is.
    command: list[str] | None = None
    # False: the command runs as given, without the launcher in front.
    launcher: bool = True
    image: Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^\S+$")] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Variable name -> the ARN of a Secrets Manager secret or SSM parameter its value comes from (docs/jobs.md,
    # Secrets): written into the job's revision, never into its environment.
    secrets: dict[str, ValueFrom] = Field(default_factory=dict)
    # True: env names that look like a secret's (HF_TOKEN) are taken all the same (trainctl/submitting/secrets.py).
    allow_env_secrets: bool = False
    share: str | None = None
    timeout: int | None = Field(None, ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS)
    attempts: int | None = Field(None, ge=1, le=MAX_ATTEMPTS)
    # A folder every node fetches and runs the command in (docs/workdir.md); in a file, relative to the file.
    workdir: Path | None = None
    # A shell command every node runs after the unpack, before training.
    setup: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None

    @field_validator(*WHOLE_NUMBERS, mode="before")
    @classmethod
    def _whole_number(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML reads `true` as a boolean and 2.5 as a float; pydantic would make `nodes: true` 1 node.
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(WHOLE_NUMBERS[str(info.field_name)])
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not JOB_NAME.match(value):
            raise ValueError(JOB_NAME_RULE)
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = shlex.split(value)
        if isinstance(value, list) and not value:
            # The launcher alone exits with its usage on every node.
            raise ValueError("empty: give the script and its arguments (train.py --lr 0.1), or leave it out")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name in value:
                if not isinstance(name, str) or not ENV_NAME.match(name):
                    raise ValueError(f"{name!r} is not a shell variable name")
                if name.startswith(RESERVED_ENV_PREFIX):
                    raise ValueError(f"{name}: names starting with {RESERVED_ENV_PREFIX} are reserved for Batch")
                if not isinstance(value[name], str | int | float | bool):
                    raise ValueError(f"{name}: give text, a number or true/false")
            # YAML reads 1000 as a number and true as a boolean; the environment is text.
            return {k: v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
                    for k, v in value.items()}  # fmt: skip
        return value

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError("give a mapping of variable names to ARNs (HF_TOKEN: arn:aws:secretsmanager:...)")
        if isinstance(value, dict):
            for name in value:
                problem = name_problem(name)
                if problem:
                    raise ValueError(problem)
                if name in info.data.get("env", {}):
                    raise ValueError(f"{name} is also in env: give it in one of them")
        return value

    @field_validator("workdir", "setup")
    @classmethod
    def _needs_the_launcher(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("launcher") is False:
            raise ValueError(
                "needs the launcher, which fetches the workdir and runs the setup: drop launcher: false (--no-launcher)"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _runs_a_script_of_the_folder(cls, value: Any, info: ValidationInfo) -> Any:
        # Without a command the job definition's own script runs, which is the image's, not the folder's.
        if "command" in info.data and info.data["command"] is None:
            raise ValueError(
                "needs a command, a script of that folder (train.py --lr 0.1): the job definition's own is not in it"
            )
        return value

    def full_command(self) -> list[str] | None:
        if self.command is None:
            return None
        return [LAUNCHER, *self.command] if self.launcher else list(self.command)


FIELDS = tuple(Task.model_fields)


def load_task(path: Path, *, allow_env_secrets: bool = False) -> Task:
    """The task a file describes, every field checked; env names that look like a secret's are refused unless
    the file says `allow_env_secrets: true` or `allow_env_secrets` (--allow-env-secrets) is given."""
    try:
        text = path.read_text(encoding="utf-8")
        twice = _duplicate_key(yaml.compose(text))
        document = yaml.safe_load(text)
    except OSError as error:
        raise TrainctlError(f"{path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise TrainctlError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise TrainctlError(f"{path}: not valid YAML{where}") from None
    if twice is not None:
        key, first, again = twice
        # YAML loaders keep the last of two equal keys without a word.
        raise TrainctlError(f"{path}: field {key} is given twice (lines {first} and {again}): keep one")
    if not isinstance(document, dict):
        raise TrainctlError(
            f"{path}: a task file is a mapping of fields, such as `fleet: gpu` (all of them: docs/jobs.md)"
        )
    empty = next((name for name, value in document.items() if name in FIELDS and _empty(name, value)), None)
    if empty is not None:
        # Written with nothing after its colon: refused rather than taken as left out.
        hint = "the folder to send (. for the task file's own)" if empty == "workdir" else "a value"
        raise TrainctlError(f"{clip_path(path)}: field {empty}: empty: give {hint}, or leave the field out")
    task = make_task(document, where=f"{clip_path(path)}: field ")
    if not (allow_env_secrets or task.allow_env_secrets):
        refuse_secret_looking(task.env, named=lambda name: f"{clip_path(path)}: field env.{name}")
    if task.workdir and not task.workdir.is_absolute():
        return task.model_copy(update={"workdir": path.parent / task.workdir})
    return task


def _empty(name: str, value: Any) -> bool:
    """A field given no value; for `workdir`, blank text too (Path("") would be the task file's folder)."""
    return value is None or (name == "workdir" and isinstance(value, str) and not value.strip())


def _duplicate_key(node: Any, within: str = "") -> tuple[str, int, int] | None:
    """The first key a mapping of the document repeats (`env.LR` inside env), with the lines of its first
    and second use."""
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key, value in node.value:
            name = f"{within}{key.value}" if isinstance(key, yaml.ScalarNode) else within
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if name in lines:
                    return name, lines[name], line
                lines[name] = line
            found = _duplicate_key(value, f"{name}.")
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _duplicate_key(item, within)
            if found is not None:
                return found
    return None


def make_task(fields: dict[str, Any], *, where: str) -> Task:
    """A Task, or one line naming the first bad field (`where` + its name: "task.yaml: field " or "--")."""
    try:
        return Task.model_validate(fields)
    except ValidationError as error:
        raise TrainctlError(_first_problem(error, where)) from None


def _first_problem(error: ValidationError, where: str) -> str:
    first = error.errors()[0]
    field = where + (".".join(str(part) for part in first["loc"]) or "(file)")
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(first["loc"][0]), FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (fields: {', '.join(FIELDS)})"
        return f"{field}: unknown{hint}"
    if first["type"] == "missing":
        return f"{field} is required"
    message = str(first["msg"]).removeprefix("Value error, ")
    # A secret's refusal names the variable and shows its value already.
    given = None if first["loc"][:1] == ("secrets",) else first.get("input")
    line = f"{field}: {message}" + ("" if given is None else f" (given {_as_written(given)})")
    return line[:200]


def _as_written(value: Any) -> str:
    """A refused value as the user wrote it: `true`, not Python's True; a text or a folder cut short."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(clip(value)) if isinstance(value, str | Path) else repr(value)
