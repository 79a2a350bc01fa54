"""What `cdk deploy --all` built, read from the stacks' CloudFormation outputs.

The jobs stack names its outputs `<Fleet><What>` (stacks/jobs_stack.py): `GpuJobQueue`,
`GpuTrainingJobDefinition`, `GpuBenchmarkJobDefinition`, `GpuLogGroup`, and `AlertTopic`; the data
stack has `CheckpointBucket` and `DatasetBucket`. A fleet's output prefix is its name with the first
letter upper-cased (config.settings.fleet_construct_id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.aws import aws_errors
from trainctl.errors import ExitCode, TrainctlError

# app.py: STACK_PREFIX "Training" + the stack's role.
JOBS_STACK = "TrainingJobs"
DATA_STACK = "TrainingData"

# Longest first: "TrainingJobDefinition" must not be read as a fleet "...Training" + "JobDefinition".
_FLEET_OUTPUTS = ("BenchmarkJobDefinition", "TrainingJobDefinition", "JobQueue", "LogGroup")


@dataclass(frozen=True, kw_only=True)
class Fleet:
    name: str
    job_queue: str
    training_definition: str
    benchmark_definition: str
    log_group: str


@dataclass(frozen=True, kw_only=True)
class Deployment:
    region: str
    fleets: dict[str, Fleet]
    checkpoint_bucket: str | None

    def fleet(self, name: str) -> Fleet:
        for fleet in self.fleets.values():
            if fleet.name.lower() == name.lower():
                return fleet
        raise TrainctlError(f"no fleet {name!r} in {self.region}: the deployed fleets are {self.fleet_names()}")

    def fleet_of_queue(self, queue_arn: str) -> Fleet | None:
        for fleet in self.fleets.values():
            # Outputs hold the queue ARN; a job description names the queue by ARN as well.
            if queue_arn in (fleet.job_queue, fleet.job_queue.rsplit("/", 1)[-1]):
                return fleet
        return None

    def fleet_names(self) -> str:
        return ", ".join(sorted(self.fleets)) or "(none)"


def _outputs(cloudformation: Any, stack: str) -> dict[str, str] | None:
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
    for key, value in outputs.items():
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
        )
    return fleets


def load_deployment(cloudformation: Any, region: str) -> Deployment:
    jobs = _outputs(cloudformation, JOBS_STACK)
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
    data = _outputs(cloudformation, DATA_STACK) or {}
    return Deployment(
        region=region,
        fleets=fleets,
        checkpoint_bucket=data.get("CheckpointBucket"),
    )
