"""The job definition revision a job runs on: the deployed definition with the job's own image, command,
environment, secrets and node count written in, registered by trainctl in a family of its own. Secrets have no
other way in: SubmitJob's container overrides cannot carry them (API ContainerOverrides has no `secrets`).

Why a revision, and not only SubmitJob's nodeOverrides: what rebuilds a job later reads it back from
DescribeJobs (the capacity fallback's resubmitter, training_constructs/jobs/capacity_fallback/resubmit.py,
submits a cancelled job again from its DescribeJobs detail). DescribeJobs' JobDetail has nodeProperties and
no nodeOverrides (API reference, JobDetail), and whether its nodeProperties carry a submission's overrides
merged in is not documented. What is documented: JobDetail.jobDefinition is "the Amazon Resource Name (ARN)
of the job definition that this job uses", and a registered revision's nodeProperties are what
RegisterJobDefinition was given (API RegisterJobDefinition, DescribeJobDefinitions). A job whose revision
carries its command, environment and node count is described the same either way. The request still
carries the same nodeOverrides, so Batch runs the job the same whichever it applies.

The family is `<deployed name>-trainctl` (config/job_events.py; CloudFormation does not know it, and the
capacity fallback may submit it). A revision is tagged with the deployed revision it copies and a digest of
what it carries, and an ACTIVE one with both the same is reused instead of registering another.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from config.job_events import TRAINCTL_FAMILY_SUFFIX
from trainctl.aws import aws_errors

MANAGED_TAG = "trainctl:managed"
DERIVED_TAG = "trainctl:derived-from"
CONTENT_TAG = "trainctl:content"
DERIVED_SUFFIX = TRAINCTL_FAMILY_SUFFIX
# What a copy keeps of the deployed definition beside its node properties (API RegisterJobDefinition).
COPIED = ("parameters", "retryStrategy", "timeout", "propagateTags", "platformCapabilities")


def node_properties(
    definition: Mapping[str, Any],
    *,
    image: str | None = None,
    nodes: int | None = None,
    command: Sequence[str] | None = None,
    environment: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    execution_role: str | None = None,
) -> dict[str, Any]:
    """The deployed definition's nodeProperties with the job's own values in every node range: the image,
    the node count, the command, and its variables over the definition's (a name in both takes the job's
    value, as an override's would: API ContainerOverrides, environment); its secrets (variable name ->
    valueFrom ARN) as the container's `secrets` over the definition's, and the execution role that reads them
    (API RegisterJobDefinition, ContainerProperties secrets and executionRoleArn: only a definition can carry
    secrets, SubmitJob's overrides cannot). A variable that is also a secret is the secret's."""
    properties = copy.deepcopy(dict(definition["nodeProperties"]))
    if nodes:
        properties["numNodes"] = nodes
    ranges = []
    for node_range in properties.get("nodeRangeProperties", []):
        container = dict(node_range.get("container", {}))
        if image:
            container["image"] = image
        if command:
            container["command"] = list(command)
        if environment:
            merged = {str(e["name"]): str(e.get("value", "")) for e in container.get("environment", [])}
            merged.update(environment)
            container["environment"] = [{"name": k, "value": v} for k, v in merged.items()]
        if secrets:
            kept = [s for s in container.get("secrets", []) if s.get("name") not in secrets]
            container["secrets"] = kept + [{"name": k, "valueFrom": v} for k, v in secrets.items()]
            if "environment" in container:
                container["environment"] = [e for e in container["environment"] if e.get("name") not in secrets]
        if execution_role:
            container["executionRoleArn"] = execution_role
        ranges.append({**node_range, "container": container})
    properties["nodeRangeProperties"] = ranges
    return properties


def digest(properties: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(properties, sort_keys=True).encode()).hexdigest()[:32]


def job_revision(batch: Any, definition: Mapping[str, Any], properties: Mapping[str, Any], *, register: bool) -> str:
    """The ARN of a revision of `<deployed name>-trainctl` with these node properties: an ACTIVE one derived
    from the same deployed revision with the same digest, else a new one. Without `register` (a dry run, or
    before the checks pass), a revision that would be new is described instead of registered."""
    source = str(definition["jobDefinitionArn"])
    family = f"{definition['jobDefinitionName']}{DERIVED_SUFFIX}"[:128]
    content = digest(properties)
    with aws_errors():
        pages = batch.get_paginator("describe_job_definitions").paginate(jobDefinitionName=family, status="ACTIVE")
        for page in pages:
            for existing in page.get("jobDefinitions", []):
                tags = existing.get("tags") or {}
                if tags.get(DERIVED_TAG) == source and tags.get(CONTENT_TAG) == content:
                    return str(existing["jobDefinitionArn"])
    if not register:
        return f"(a new revision of {family}: {source} with the job's image, command, environment, secrets and nodes)"
    request: dict[str, Any] = {
        "jobDefinitionName": family,
        "type": definition.get("type", "multinode"),
        "nodeProperties": dict(properties),
        "tags": {MANAGED_TAG: "true", DERIVED_TAG: source, CONTENT_TAG: content},
    }
    for key in COPIED:
        if definition.get(key) is not None:
            request[key] = definition[key]
    with aws_errors():
        return str(batch.register_job_definition(**request)["jobDefinitionArn"])


def job_definition(
    batch: Any,
    definition: Mapping[str, Any],
    *,
    image: str | None = None,
    nodes: int | None = None,
    command: Sequence[str] | None = None,
    environment: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    execution_role: str | None = None,
    register: bool,
) -> str:
    """What a job is submitted on: the deployed revision itself when the job changes nothing of it, else the
    revision that carries the job (job_revision; described, not registered, without `register`)."""
    if not (image or nodes or command or environment or secrets):
        return str(definition["jobDefinitionArn"])
    properties = node_properties(
        definition, image=image, nodes=nodes, command=command, environment=environment, secrets=secrets,
        execution_role=execution_role if secrets else None,
    )  # fmt: skip
    return job_revision(batch, definition, properties, register=register)
