"""What is refused before SubmitJob because it could never run: more nodes than the fleet's compute
environment holds, a share identifier the queue's fair-share policy does not know, and what a job
definition revision with another image needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.aws import aws_errors
from trainctl.deployment import Fleet
from trainctl.errors import TrainctlError
from trainctl.fleet.compute import FleetCompute
from trainctl.jobs import node_requirements
from trainctl.submitting.revisions import job_revision, node_properties


def describe_definition(batch: Any, arn: str) -> dict[str, Any]:
    with aws_errors():
        found = batch.describe_job_definitions(jobDefinitions=[arn]).get("jobDefinitions", [])
    if not found:
        raise TrainctlError(f"job definition {arn} is not in Batch: redeploy the jobs stack (`make deploy`)")
    return dict(found[0])


@dataclass(frozen=True)
class Inputs:
    """Where a job's settings came from, so that a refusal names what to change: submit's options, the
    fields of a task file (`run` has no --nodes or --share), or the job definition for the fields a
    command has no option for (`sweep` takes its node count from the definition)."""

    task_file: str | None = None
    from_definition: frozenset[str] = frozenset()

    def name(self, field: str) -> str:
        if field in self.from_definition:
            return f"the job definition's {field}"
        # The file is named once, in what to change.
        return f"--{field}" if self.task_file is None else f"{field}:"

    def set_to(self, field: str, value: str) -> str:
        if field in self.from_definition:
            return f"redeploy the fleet with {field} {value} (its job definition)"
        return f"pass --{field} {value}" if self.task_file is None else f"set {field}: {value} in {self.task_file}"

    def drop(self, field: str) -> str:
        return f"drop --{field}" if self.task_file is None else f"remove {field}: from {self.task_file}"


FLAGS = Inputs()
# sweep has no --nodes: its jobs take the job definition's node count.
SWEEP = Inputs(from_definition=frozenset({"nodes"}))


@dataclass(frozen=True)
class Capacity:
    nodes: int
    max_vcpus: int
    vcpus_per_node: int


def capacity(compute: FleetCompute, definition: dict[str, Any]) -> Capacity | None:
    """How many nodes the fleet can ever run at once: the compute environment's maxvCpus over one
    node's vCPUs. A node takes a whole instance (multi-node parallel nodes are single-tenant: Batch
    user guide, multi-node parallel jobs), so a node counts at least its instance type's vCPUs."""
    environment = compute.environment or {}
    max_vcpus = int(environment.get("computeResources", {}).get("maxvCpus", 0))
    asked = node_requirements(definition).get("VCPU", 0)
    per_node = max(asked, compute.instance.vcpus if compute.instance else 0)
    if not max_vcpus or not per_node:
        return None
    return Capacity(max_vcpus // per_node, max_vcpus, per_node)


def check_nodes(fleet: Fleet, nodes: int, room: Capacity | None, *, inputs: Inputs = FLAGS) -> None:
    if room is not None and nodes > room.nodes:
        raise TrainctlError(
            f"{inputs.name('nodes')} {nodes}: fleet {fleet.name} holds at most {room.nodes} nodes ({room.max_vcpus} "
            f"vCPUs, {room.vcpus_per_node} per node), so the job could never start; "
            f"{inputs.set_to('nodes', f'{room.nodes} or fewer')} or deploy a larger maxNodes"
        )


def share_identifiers(batch: Any, policy_arn: str) -> list[str]:
    with aws_errors():
        policies = batch.describe_scheduling_policies(arns=[policy_arn]).get("schedulingPolicies", [])
    distribution = (policies[0].get("fairsharePolicy") or {}).get("shareDistribution", []) if policies else []
    return [str(d["shareIdentifier"]) for d in distribution]


def known_share(share: str, identifiers: list[str]) -> bool:
    """An identifier ending in * covers every share that starts with what precedes it (API ShareAttributes)."""
    return any(share == i or (i.endswith("*") and share.startswith(i[:-1])) for i in identifiers)


def check_share(
    batch: Any,
    fleet: Fleet,
    queue: dict[str, Any],
    share: str | None,
    *,
    new_share: bool,
    inputs: Inputs = FLAGS,
) -> None:
    """A fair-share queue refuses jobs without a share identifier; a FIFO queue takes none; an identifier
    the policy does not list would quietly become a new share (weight 1) unless --new-share says so."""
    if new_share and share is None:
        raise TrainctlError(
            f"--new-share without a share: {inputs.set_to('share', 'ID')} (the new share), or drop --new-share"
        )
    policy = queue.get("schedulingPolicyArn")
    if policy and share is None:
        raise TrainctlError(
            f"fleet {fleet.name}'s queue uses fair share: {inputs.set_to('share', 'ID')} (a deployed share identifier)"
        )
    if not policy and share is not None:
        raise TrainctlError(
            f"fleet {fleet.name}'s queue is first in, first out: {inputs.drop('share')} "
            "(deploy with -c shares=... for fair share)"
        )
    if policy and share is not None and not new_share:
        identifiers = share_identifiers(batch, str(policy))
        if identifiers and not known_share(share, identifiers):
            raise TrainctlError(
                f"{inputs.name('share')} {share}: fleet {fleet.name}'s fair-share policy lists "
                f"{', '.join(identifiers)}; {inputs.set_to('share', 'one of them')}, or pass --new-share to start "
                "a new share"
            )


def retry_with_attempts(definition: dict[str, Any], attempts: int) -> dict[str, Any]:
    """SubmitJob's retryStrategy replaces the definition's whole strategy (API SubmitJob, retryStrategy):
    keep its evaluateOnExit rules so that application errors still stop at once."""
    strategy = dict(definition.get("retryStrategy") or {})
    strategy["attempts"] = attempts
    return strategy


def with_image(batch: Any, definition: dict[str, Any], image: str, *, register: bool = True) -> str:
    """The ARN of a `<deployed name>-trainctl` revision that is the deployed definition with another image
    (trainctl/submitting/revisions.py); described, not registered, without `register`."""
    return job_revision(batch, definition, node_properties(definition, image=image), register=register)
