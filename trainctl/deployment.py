"""What `cdk deploy --all` built, read from the stacks' CloudFormation outputs.

The jobs stack names its outputs `<Fleet><What>` (stacks/jobs_stack.py): `GpuJobQueue`,
`GpuTrainingJobDefinition`, `GpuBenchmarkJobDefinition`, `GpuLogGroup`, and `AlertTopic`; a fleet
with fallback placements also has `<Fleet>Placements` ("<label>|<queue ARN>" per placement, its
own first, joined with ';'); the data
stack has `CheckpointBucket` and `DatasetBucket`. A fleet's output prefix is its name with the first
letter upper-cased (config.settings.fleet_construct_id).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainctl.aws import aws_errors
from trainctl.errors import ExitCode, TrainctlError

# app.py: STACK_PREFIX "Training" + the stack's role.
JOBS_STACK = "TrainingJobs"
DATA_STACK = "TrainingData"

# Longest first: "TrainingJobDefinition" must not be read as a fleet "...Training" + "JobDefinition".
_FLEET_OUTPUTS = ("BenchmarkJobDefinition", "TrainingJobDefinition", "JobQueue", "LogGroup")
PLACEMENTS_OUTPUT = "Placements"


@dataclass(frozen=True, kw_only=True)
class PlacementRef:
    """One placement of a fleet: what it is, in words, and its job queue."""

    label: str
    queue: str


@dataclass(frozen=True, kw_only=True)
class Fleet:
    name: str
    # The queue of the placement this view is of: the fleet's own unless `placement` > 0.
    job_queue: str
    training_definition: str
    benchmark_definition: str
    log_group: str
    # Every placement, the fleet's own first; empty for a fleet without fallback placements.
    placements: tuple[PlacementRef, ...] = ()
    placement: int = 0

    def placement_views(self) -> list[Fleet]:
        """The fleet as seen from each of its placements, its own first: each view's `job_queue` is that
        placement's queue, where the capacity fallback may have sent a job."""
        return [self] + [
            dataclasses.replace(self, job_queue=ref.queue, placement=number)
            for number, ref in enumerate(self.placements)
            if number
        ]


def parse_placements(value: str) -> tuple[PlacementRef, ...]:
    refs = []
    for item in value.split(";"):
        label, _, queue = item.rpartition("|")
        if label and queue:
            refs.append(PlacementRef(label=label, queue=queue))
    return tuple(refs)


@dataclass(frozen=True, kw_only=True)
class Deployment:
    region: str
    fleets: dict[str, Fleet]
    checkpoint_bucket: str | None
    # Datasets, and the workdirs trainctl uploads (trainctl/submitting/workdir.py).
    dataset_bucket: str | None = None

    def fleet(self, name: str) -> Fleet:
        for fleet in self.fleets.values():
            if fleet.name.lower() == name.lower():
                return fleet
        raise TrainctlError(f"no fleet {name!r} in {self.region}: the deployed fleets are {self.fleet_names()}")

    def fleet_of_queue(self, queue_arn: str) -> Fleet | None:
        """The fleet a queue belongs to; for a fallback placement's queue, the fleet as seen from that
        placement (its `job_queue` is that queue)."""
        for fleet in self.fleets.values():
            for view in fleet.placement_views():
                # Outputs hold the queue ARN; a job description names the queue by ARN as well.
                if queue_arn in (view.job_queue, view.job_queue.rsplit("/", 1)[-1]):
                    return view
        return None

    def fleet_names(self) -> str:
        return ", ".join(sorted(self.fleets)) or "(none)"


def outputs_of(cloudformation: Any, stack: str) -> dict[str, str] | None:
    """A stack's outputs, or None when the stack does not exist."""
    try:
        with aws_errors():
            response = cloudformation.describe_stacks(StackName=stack)
    except TrainctlError as error:
        # CloudFormation answers ValidationError "Stack with id X does not exist".
        if "does not exist" in error.message:
            return None
        raise
    stacks = response.get("Stacks", [])
    if not stacks:
        return None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def fleets_from_outputs(outputs: dict[str, str]) -> dict[str, Fleet]:
    found: dict[str, dict[str, str]] = {}
    placements: dict[str, str] = {}
    for key, value in outputs.items():
        if key.endswith(PLACEMENTS_OUTPUT) and len(key) > len(PLACEMENTS_OUTPUT):
            placements[key[: -len(PLACEMENTS_OUTPUT)]] = value
            continue
        for suffix in _FLEET_OUTPUTS:
            if key.endswith(suffix) and len(key) > len(suffix):
                prefix = key[: -len(suffix)]
                found.setdefault(prefix, {})[suffix] = value
                break
    fleets: dict[str, Fleet] = {}
    for prefix, values in found.items():
        if set(values) != set(_FLEET_OUTPUTS):
            continue
        name = prefix[0].lower() + prefix[1:]
        fleets[name] = Fleet(
            name=name,
            job_queue=values["JobQueue"],
            training_definition=values["TrainingJobDefinition"],
            benchmark_definition=values["BenchmarkJobDefinition"],
            log_group=values["LogGroup"],
            placements=parse_placements(placements.get(prefix, "")),
        )
    return fleets


def load_deployment(cloudformation: Any, region: str) -> Deployment:
    jobs = outputs_of(cloudformation, JOBS_STACK)
    if jobs is None:
        raise TrainctlError(
            f"no {JOBS_STACK} stack in {region}: deploy with `make deploy`, or pass the --region it is in",
            ExitCode.AWS,
        )
    fleets = fleets_from_outputs(jobs)
    if not fleets:
        raise TrainctlError(
            f"the {JOBS_STACK} stack in {region} has no fleet outputs: redeploy it with `make deploy`", ExitCode.AWS
        )
    data = outputs_of(cloudformation, DATA_STACK) or {}
    return Deployment(
        region=region,
        fleets=fleets,
        checkpoint_bucket=data.get("CheckpointBucket"),
        dataset_bucket=data.get("DatasetBucket"),
    )
