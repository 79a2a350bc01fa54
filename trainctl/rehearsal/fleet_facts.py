"""What the synthesized app says about a fleet beyond its job definition, read from cdk.out (plain JSON):
how long ECS waits between the stop signal and SIGKILL (the fleet's launch template user data), how long
its queue lets a job wait RUNNABLE for capacity before cancelling it (jobStateTimeLimitActions), and how
many nodes its compute environment can ever hold (maxvCpus over one node's vCPUs).

Each fact says where it came from; a rehearsal of a deployed job definition (--deployed) reads no
template, and takes ECS's and Batch's documented defaults, saying so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.catalog import CATALOG
from trainctl.deployment import JOBS_STACK
from trainctl.jobs import node_requirements
from trainctl.rehearsal import batch_rules

COMPUTE_STACK = "TrainingCompute"
# ECS developer guide, "Amazon ECS container agent configuration": ECS_CONTAINER_STOP_TIMEOUT, "Time to
# wait from when a task is stopped before its containers are forcefully stopped if they do not exit
# normally on their own", a Go duration, default 30s (batch_rules.STOP_GRACE_SECONDS).
STOP_TIMEOUT_SETTING = "ECS_CONTAINER_STOP_TIMEOUT"
_SETTING = re.compile(rf"\b{STOP_TIMEOUT_SETTING}=([0-9][0-9a-zµ.]*)")
# Go's time.ParseDuration units (the agent parses the value with it).
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
# API JobStateTimeLimitAction: the reason a queue cancels a job for lack of capacity, and the least
# maxTimeSeconds it takes (600 to 86,400).
CAPACITY_REASON = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
MIN_RUNNABLE_LIMIT_SECONDS = 600.0


@dataclass(frozen=True)
class FleetFacts:
    stop_grace_seconds: float
    stop_grace_from: str
    # None: the queue never cancels a job for capacity (capacity-cancel cannot happen on it).
    capacity_wait_seconds: float | None
    capacity_wait_from: str
    # None: not known (a deployed definition), so not checked.
    max_nodes: int | None = None
    max_nodes_from: str = ""


def deployed_facts() -> FleetFacts:
    """A deployed job definition's rehearsal: no template is read, the documented defaults stand."""
    why = "the deployed job definition was read, not the fleet's templates"
    return FleetFacts(
        stop_grace_seconds=batch_rules.STOP_GRACE_SECONDS,
        stop_grace_from=f"ECS's default ({why})",
        capacity_wait_seconds=MIN_RUNNABLE_LIMIT_SECONDS,
        capacity_wait_from=f"the least a queue may wait, API JobStateTimeLimitAction ({why})",
    )


def go_duration(text: str) -> float | None:
    """Seconds in a Go duration ("10m", "1m30s", "45s"); None when it is not one."""
    if not text or _GO_PART.sub("", text) != "":
        return None
    return sum(float(number) * _GO_UNITS[unit] for number, unit in _GO_PART.findall(text))


def stop_timeout_setting(user_data: str) -> str | None:
    """The ECS_CONTAINER_STOP_TIMEOUT the user data writes, the last one where several are written (the
    agent reads /etc/ecs/ecs.config as KEY=VALUE lines; a later line of a key wins)."""
    found = _SETTING.findall(user_data)
    return found[-1] if found else None


def _text(value: Any) -> str:
    """A template value's literal text: Fn::Base64's and Fn::Join's strings, references left out."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Fn::Base64":
            return _text(argument)
        if function == "Fn::Join" and isinstance(argument, list) and len(argument) == 2:
            return str(argument[0]).join(_text(p) for p in argument[1])
    return ""


def _logical_id(value: Any) -> str:
    """The resource a Ref or Fn::GetAtt names."""
    if isinstance(value, dict) and "Ref" in value:
        return str(value["Ref"])
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        attribute = value["Fn::GetAtt"]
        return str(attribute[0] if isinstance(attribute, list) else str(attribute).split(".")[0])
    return ""


class _Assembly:
    """The templates of a cloud assembly, and references across them (Fn::ImportValue of an export)."""

    def __init__(self, folder: Path) -> None:
        self.templates: dict[str, dict[str, Any]] = {}
        for path in sorted(folder.glob("*.template.json")):
            try:
                self.templates[path.name.removesuffix(".template.json")] = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError):
                continue

    def resource(self, stack: str, logical_id: str) -> dict[str, Any]:
        found = self.templates.get(stack, {}).get("Resources", {}).get(logical_id)
        return dict(found.get("Properties", {})) if isinstance(found, dict) else {}

    def target(self, stack: str, value: Any) -> tuple[str, str]:
        """(stack, logical id) a reference names: in the same stack, or another stack's export."""
        if isinstance(value, dict) and "Fn::ImportValue" in value:
            name = value["Fn::ImportValue"]
            for other, template in self.templates.items():
                for output in template.get("Outputs", {}).values():
                    if (output.get("Export") or {}).get("Name") == name:
                        return other, _logical_id(output.get("Value"))
            return "", ""
        return stack, _logical_id(value)


def _queue_of(assembly: _Assembly, fleet: str) -> str:
    """The fleet's own queue (placement 0) in the jobs stack: its `<Fleet>JobQueue` output."""
    outputs = assembly.templates.get(JOBS_STACK, {}).get("Outputs", {})
    for key, output in outputs.items():
        prefix = key.removesuffix("JobQueue")
        if prefix != key and prefix.lower() == fleet.lower():
            return _logical_id(output.get("Value"))
    return ""


def _capacity_wait(queue: dict[str, Any], where: str) -> tuple[float | None, str]:
    for action in queue.get("JobStateTimeLimitActions") or []:
        wanted = (CAPACITY_REASON, "RUNNABLE", "CANCEL")
        if (action.get("Reason"), action.get("State"), str(action.get("Action", "")).upper()) == wanted:
            return float(action["MaxTimeSeconds"]), f"{where} jobStateTimeLimitActions {CAPACITY_REASON}"
    return None, f"{where} has no jobStateTimeLimitActions CANCEL for {CAPACITY_REASON}"


def _max_nodes(environment: dict[str, Any], definition: dict[str, Any], where: str) -> tuple[int | None, str]:
    """Batch user guide, "Multi-node parallel jobs": nodes are single-tenant (one container per instance),
    and the compute environment's maxvCpus must cover the whole job: a node counts at least its
    instance type's vCPUs (trainctl/submitting/preflight.py capacity, the same rule at submit)."""
    resources = environment.get("ComputeResources") or {}
    max_vcpus = resources.get("MaxvCpus")
    types = resources.get("InstanceTypes") or []
    instance = CATALOG.get(str(types[0])) if types else None
    per_node = max(node_requirements(definition).get("VCPU", 0), instance.vcpus if instance else 0)
    if not isinstance(max_vcpus, int) or not per_node:
        return None, f"{where} states no maxvCpus or node size"
    return max_vcpus // per_node, f"{where}: maxvCpus {max_vcpus}, {per_node} vCPUs a node"


def read_facts(folder: Path, fleet: str, definition: dict[str, Any]) -> FleetFacts:
    """The fleet's facts from the cloud assembly in `folder`; where the chain from the fleet's queue to its
    compute environment and launch template breaks, the documented default, saying so."""
    assembly = _Assembly(folder)
    queue_id = _queue_of(assembly, fleet)
    queue = assembly.resource(JOBS_STACK, queue_id)
    if not queue:
        wait: tuple[float | None, str] = (MIN_RUNNABLE_LIMIT_SECONDS, f"the API's least (no queue of fleet {fleet})")
    else:
        wait = _capacity_wait(queue, f"{JOBS_STACK}/{queue_id}")
    order = sorted(queue.get("ComputeEnvironmentOrder") or [], key=lambda o: int(o.get("Order", 0)))
    stack, environment_id = assembly.target(JOBS_STACK, order[0].get("ComputeEnvironment")) if order else ("", "")
    environment = assembly.resource(stack, environment_id)
    nodes = _max_nodes(environment, definition, f"{stack}/{environment_id}") if environment else (None, "")
    template = (environment.get("ComputeResources") or {}).get("LaunchTemplate") or {}
    template_id = _logical_id(template.get("LaunchTemplateId") or template.get("LaunchTemplateName"))
    data = assembly.resource(stack, template_id).get("LaunchTemplateData") or {}
    setting = stop_timeout_setting(_text(data.get("UserData")))
    grace = go_duration(setting) if setting else None
    if grace is not None:
        grace_from = f"{stack}/{template_id} user data {STOP_TIMEOUT_SETTING}={setting}"
    else:
        grace = batch_rules.STOP_GRACE_SECONDS
        named = f"{stack}/{template_id}" if template_id else f"fleet {fleet}'s launch template"
        grace_from = f"ECS's default ({named} sets no readable {STOP_TIMEOUT_SETTING})"
    return FleetFacts(
        stop_grace_seconds=grace,
        stop_grace_from=grace_from,
        capacity_wait_seconds=wait[0],
        capacity_wait_from=wait[1],
        max_nodes=nodes[0],
        max_nodes_from=nodes[1],
    )
