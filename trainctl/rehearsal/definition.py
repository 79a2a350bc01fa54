"""The job a rehearsal runs: the fleet's job definition as it would be deployed, read from the
synthesized cloud assembly (plain JSON: trainctl never imports CDK) or from Batch, with a task file's
overrides applied as SubmitJob would apply them."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.deployment import JOBS_STACK, fleets_from_outputs
from trainctl.errors import TrainctlError
from trainctl.submitting.revisions import node_properties
from trainctl.submitting.taskfile import Task

# Bucket names the rehearsal gives to the buckets a template names through another stack's export
# ("TrainingData-CheckpointBucketArn" -> "checkpointbucket"): any valid name would do, as long as every
# value that names the bucket agrees.
_EXPORT_ARN = re.compile(r"^[A-Za-z0-9]+-(?P<name>[A-Za-z0-9]+?)(Arn)?$")


@dataclass(frozen=True)
class RetryRule:
    action: str  # RETRY or EXIT (case-insensitive in the API)
    on_status_reason: str | None = None
    on_reason: str | None = None
    on_exit_code: str | None = None


@dataclass(frozen=True)
class NodeSettings:
    """A job's node count, command and environment as a job definition registered them, or as SubmitJob's
    nodeOverrides give them (None or empty: not overridden; API NodeOverrides, ContainerOverrides: an
    override's variables are added to the definition's, a name in both takes the override's value)."""

    nodes: int | None = None
    command: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)

    def over(self, base: NodeSettings) -> NodeSettings:
        """These overrides applied to `base`."""
        return NodeSettings(
            nodes=self.nodes or base.nodes,
            command=self.command or base.command,
            environment={**base.environment, **self.environment},
        )


@dataclass(frozen=True)
class JobSpec:
    """What Batch would run: one node range over every node (the job definitions' "0:")."""

    fleet: str
    definition: str  # where it came from: "cdk.out GpuTrainingJob4CCAFCF3" or a job definition ARN
    nodes: int
    main_node: int
    command: tuple[str, ...]
    environment: dict[str, str]
    attempts: int
    retry_rules: tuple[RetryRule, ...]
    timeout_seconds: int | None
    name: str
    tags: dict[str, str] = field(default_factory=dict)
    # What the job definition registered, and what the submission overrode: DescribeJobs shows the first
    # (or, with --describe-merged, both merged) to the capacity fallback.
    registered: NodeSettings = field(default_factory=NodeSettings)
    overrides: NodeSettings = field(default_factory=NodeSettings)
    # The task's secrets as the nodes get them (secret_values): in `environment`, never in what DescribeJobs
    # shows (registered, overrides), as Batch reads them at the node's start; kept for a resubmitted job.
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)


def _resolve(value: Any, resources: dict[str, Any]) -> Any:
    """A CloudFormation value with its intrinsic functions worked out as far as a rehearsal needs:
    strings stay, Join/Select/Split compute, an import of a bucket's ARN becomes a local bucket's ARN,
    any other reference a placeholder naming it."""
    if isinstance(value, list):
        return [_resolve(v, resources) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        return {k: _resolve(v, resources) for k, v in value.items()}
    ((function, argument),) = value.items()
    if function == "Fn::Join":
        separator, parts = argument
        return str(separator).join(str(_resolve(p, resources)) for p in parts)
    if function == "Fn::Select":
        index, items = argument
        return _resolve(items, resources)[int(_resolve(index, resources))]
    if function == "Fn::Split":
        separator, text = argument
        return str(_resolve(text, resources)).split(str(separator))
    if function == "Fn::ImportValue":
        name = str(_resolve(argument, resources))
        match = _EXPORT_ARN.match(name)
        bucket = (match.group("name") if match else name).lower()
        return f"arn:aws:s3:::{bucket}" if name.endswith("BucketArn") else f"rehearsal-{bucket}"
    if function == "Ref":
        return f"rehearsal-{str(argument).lower()}"
    if function == "Fn::GetAtt":
        return f"rehearsal-{'-'.join(str(a) for a in argument).lower()}"
    return {function: _resolve(argument, resources)}


def _api_shape(value: Any) -> Any:
    """CloudFormation's PascalCase properties in the API's camelCase ("NumNodes" -> "numNodes")."""
    if isinstance(value, list):
        return [_api_shape(v) for v in value]
    if isinstance(value, dict):
        return {k[:1].lower() + k[1:]: _api_shape(v) for k, v in value.items()}
    return value


def from_cloud_assembly(assembly: Path, fleet: str, job: str) -> tuple[str, dict[str, Any]]:
    """(the resource's logical id, the job definition in DescribeJobDefinitions' shape) from cdk.out."""
    template_path = assembly / f"{JOBS_STACK}.template.json"
    if not template_path.is_file():
        raise TrainctlError(f"no synthesized app at {assembly} (no {template_path.name}): run `make synth` first")
    try:
        template = json.loads(template_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TrainctlError(f"{template_path}: cannot read it ({error}): run `make synth` again") from None
    resources: dict[str, Any] = template.get("Resources", {})
    # The jobs stack's outputs name each fleet's job definitions (trainctl.deployment); their values here
    # are {"Ref": logical id} rather than ARNs.
    outputs = {
        key: str(output.get("Value", {}).get("Ref", ""))
        for key, output in template.get("Outputs", {}).items()
        if isinstance(output.get("Value"), dict)
    }
    outputs.update({key: "" for key in template.get("Outputs", {}) if key not in outputs})
    fleets = fleets_from_outputs(outputs)
    match = next((f for name, f in fleets.items() if name.lower() == fleet.lower()), None)
    if match is None:
        known = ", ".join(sorted(fleets)) or "(none)"
        raise TrainctlError(f"no fleet {fleet!r} in {template_path}: its fleets are {known}")
    logical_id = match.training_definition if job == "training" else match.benchmark_definition
    resource = resources.get(logical_id)
    if not resource or resource.get("Type") != "AWS::Batch::JobDefinition":
        raise TrainctlError(f"{template_path}: output of fleet {fleet} names no job definition: run `make synth`")
    properties = _api_shape(_resolve(resource.get("Properties", {}), resources))
    return logical_id, properties


def _environment(container: dict[str, Any]) -> dict[str, str]:
    return {str(e["name"]): str(e.get("value", "")) for e in container.get("environment", [])}


def job_spec(definition: dict[str, Any], *, fleet: str, source: str, task: Task, name: str) -> JobSpec:
    """The job definition (DescribeJobDefinitions' shape) with the task's overrides on top: node count,
    command, environment (a task's variable wins), attempts and timeout, as SubmitJob applies them."""
    properties = definition.get("nodeProperties")
    if not properties or not properties.get("nodeRangeProperties"):
        raise TrainctlError(f"{source} is not a multi-node parallel job definition: nothing to rehearse")
    container = dict(properties["nodeRangeProperties"][0].get("container", {}))
    retry = definition.get("retryStrategy") or {}
    rules = tuple(
        RetryRule(
            action=str(r.get("action", "")).upper(),
            on_status_reason=r.get("onStatusReason"),
            on_reason=r.get("onReason"),
            on_exit_code=r.get("onExitCode"),
        )
        for r in retry.get("evaluateOnExit", [])
    )
    command = task.full_command() or [str(c) for c in container.get("command", [])]
    if not command:
        raise TrainctlError(f"{source} has no command and the task file gives none: add `command:` to it")
    timeout = task.timeout or (definition.get("timeout") or {}).get("attemptDurationSeconds")
    nodes = task.nodes or int(properties.get("numNodes") or 1)
    main = int(properties.get("mainNode") or 0)
    if main >= nodes:
        raise TrainctlError(f"--nodes {nodes}: the job definition's main node is node {main}; give {main + 1} or more")
    return JobSpec(
        fleet=fleet,
        definition=source,
        nodes=nodes,
        main_node=main,
        command=tuple(command),
        environment={**_environment(container), **task.env},
        attempts=task.attempts or int(retry.get("attempts") or 1),
        retry_rules=rules,
        timeout_seconds=int(timeout) if timeout else None,
        name=name,
        registered=_registered(definition),
        overrides=NodeSettings(nodes=task.nodes, command=tuple(task.full_command() or ()), environment=dict(task.env)),
    )


def as_trainctl_registers(definition: dict[str, Any], overrides: NodeSettings) -> NodeSettings:
    """What the job definition revision `trainctl run` submits the job on registers: the definition with the
    job's command, environment and node count written in (trainctl/submitting/revisions.py, the same code),
    so that DescribeJobs shows them merged or not. Nothing overridden: the deployed definition itself."""
    if not (overrides.nodes or overrides.command or overrides.environment):
        return _registered(definition)
    properties = node_properties(
        definition, nodes=overrides.nodes, command=overrides.command, environment=overrides.environment
    )
    return _registered({**definition, "nodeProperties": properties})


def _registered(definition: dict[str, Any]) -> NodeSettings:
    properties = definition.get("nodeProperties") or {}
    container = (properties.get("nodeRangeProperties") or [{}])[0].get("container", {})
    return NodeSettings(
        nodes=int(properties.get("numNodes") or 1),
        command=tuple(str(c) for c in container.get("command", [])),
        environment=_environment(container),
    )


def secret_values(task: Task, definition: dict[str, Any], environ: Mapping[str, str], *, source: str) -> dict[str, str]:
    """A rehearsal reads no Secrets Manager or SSM: each of the task's secrets takes the value of the variable of
    the same name in trainctl's own environment, and a secret with none there is refused in one line naming it.
    As on Batch, the job definition must name an execution role (the deployment's jobSecrets), or `run` would
    refuse the task."""
    if not task.secrets:
        return {}
    properties = definition.get("nodeProperties") or {}
    container = (properties.get("nodeRangeProperties") or [{}])[0].get("container", {})
    if not container.get("executionRoleArn"):
        raise TrainctlError(
            f"secrets: {source} names no execution role to read them with: synthesize with -c jobSecrets=<ARNs> "
            "(docs/jobs.md, Secrets)"
        )
    missing = next((name for name in task.secrets if name not in environ), None)
    if missing is not None:
        raise TrainctlError(
            f"secret {missing}: a rehearsal reads no Secrets Manager or SSM parameter; export {missing} in the shell "
            "that runs `trainctl rehearse` (docs/rehearsal.md)"
        )
    return {name: environ[name] for name in task.secrets}
