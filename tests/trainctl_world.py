"""A deployment as trainctl sees it, served by moto on 127.0.0.1: the stacks' outputs (CloudFormation),
queues, compute environments and job definitions (Batch), log groups (CloudWatch Logs) and the
checkpoint bucket (S3). One server and one world per test module.

moto cannot create the real stacks, so the resources are made through the service APIs and the
stacks carry only the outputs trainctl reads. Two things are set on moto's stored objects directly,
in this process, because its API drops them: compute environments (creating one through the API
starts moto's whole EC2 emulation, about 3 s) and a queue's jobStateTimeLimitActions (moto 5.2.5's
CreateJobQueue ignores them).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import boto3

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
CHECKPOINT_BUCKET = "trainctl-world-checkpoints"
DATASET_BUCKET = "trainctl-world-datasets"
# What training_constructs/jobs/training_queue.py deploys: cancel after an hour RUNNABLE for these reasons.
RUNNABLE_LIMIT_SECONDS = 3600
STUCK_REASONS = (
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE",
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
)


@dataclass(frozen=True)
class FleetSpec:
    name: str
    instance_type: str
    vcpus: int
    memory_mib: int
    gpus: int
    max_vcpus: int
    fair_share: bool = False


FLEETS = (
    # Room for 2 nodes of 48 vCPUs.
    FleetSpec("gpu", "g6.12xlarge", 48, 186777, 4, 96),
    FleetSpec("trainium", "trn1.32xlarge", 128, 498073, 0, 512, fair_share=True),
    # Only the status test submits here, so its job counts are its own.
    FleetSpec("spare", "g6.12xlarge", 48, 186777, 4, 96),
)


@dataclass
class World:
    endpoint: str
    queues: dict[str, str] = field(default_factory=dict)
    training: dict[str, str] = field(default_factory=dict)
    benchmark: dict[str, str] = field(default_factory=dict)
    # Three nodes of the gpu fleet's size: more than its compute environment holds.
    wide_gpu_definition: str = ""
    foreign_queue: str = ""
    log_groups: dict[str, str] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",  # noqa: S106 - moto accepts any key
        )

    @property
    def batch_backend(self) -> Any:
        from moto.batch.models import batch_backends

        return batch_backends[ACCOUNT][REGION]

    def job(self, job_id: str) -> Any:
        return self.batch_backend.get_job_by_id(job_id)

    def submit(self, fleet: str, *, definition: str | None = None, name: str = "job", **kwargs: Any) -> str:
        """Submit through the API; moto's docker-less Batch marks the job SUCCEEDED at once."""
        response = self.client("batch").submit_job(
            jobName=name, jobQueue=self.queues[fleet], jobDefinition=definition or self.training[fleet], **kwargs
        )
        job_id = str(response["jobId"])
        if "shareIdentifier" in kwargs:
            # moto 5.2.5 accepts a share identifier at SubmitJob but does not keep it.
            job = self.job(job_id)
            described = job.describe
            job.describe = lambda: {**described(), "shareIdentifier": kwargs["shareIdentifier"]}
        return job_id

    def set_job(
        self,
        job_id: str,
        status: str,
        *,
        created: datetime | None = None,
        started: datetime | None = None,
        stopped: datetime | None = None,
        reason: str | None = None,
        attempts: list[tuple[datetime, datetime]] | None = None,
    ) -> None:
        """Put a job in a state; `started`/`stopped` also make its one attempt (as Batch lists them in
        attempts[]) unless `attempts` gives each attempt's (start, stop)."""
        from moto.batch.models import datetime2int_milliseconds

        job = self.job(job_id)
        job.status = status
        job.job_stopped = status in ("SUCCEEDED", "FAILED")
        job.job_stopped_reason = reason
        if created:
            job.job_created_at = created
        if started:
            job.job_started_at = started
        if stopped:
            job.job_stopped_at = stopped
        if attempts is None and started and stopped:
            attempts = [(started, stopped)]
        if attempts is not None:
            # moto's docker-less Batch records one attempt stamped at submission; replace it.
            job.attempts = [
                {"startedAt": datetime2int_milliseconds(a), "stoppedAt": datetime2int_milliseconds(b)}
                for a, b in attempts
            ]

    def add_node_streams(self, job_id: str, fleet: str, events: dict[int, list[tuple[int, str]]]) -> None:
        """Give each node `<job>#<i>` of a job a log stream with these (ms, message) events, as Batch and
        the awslogs driver would. Times are offsets from ten minutes ago: CloudWatch Logs refuses
        events older than 14 days, and moto too."""
        from moto.batch.models import Job

        parent = self.job(job_id)
        logs = self.client("logs")
        base = int(time.time() * 1000) - 600_000
        for node, lines in events.items():
            stream = f"training/default/{job_id}-node{node}"
            logs.create_log_stream(logGroupName=self.log_groups[fleet], logStreamName=stream)
            if lines:
                logs.put_log_events(
                    logGroupName=self.log_groups[fleet],
                    logStreamName=stream,
                    logEvents=[{"timestamp": base + t, "message": m} for t, m in lines],
                )
            node_job = Job(
                parent.job_name,
                parent.job_definition,
                parent.job_queue,
                self.batch_backend,
                log_backend=None,
                container_overrides=None,
                eks_properties_override=None,
                depends_on=None,
                parameters=None,
                all_jobs=self.batch_backend._jobs,
                timeout=None,
                array_properties={},
                provided_job_id=f"{job_id}#{node}",
            )
            # A node job is not listed in the queue (ListJobs shows the parent only).
            parent.job_queue.jobs.remove(node_job)
            node_job.log_stream_name = stream
            self.batch_backend._jobs[node_job.job_id] = node_job

    def set_node(self, job_id: str, node: int, status: str, **container: Any) -> None:
        """Give node `<job>#<node>` (made by add_node_streams) a state and container fields (taskArn,
        containerInstanceArn, exitCode, reason) as DescribeJobs shows a running or ended node."""
        node_job = self.job(f"{job_id}#{node}")
        node_job.status = status
        described = node_job.describe
        node_job.describe = lambda: {**described(), "container": {**described().get("container", {}), **container}}

    def append_log(self, job_id: str, fleet: str, node: int, offset_ms: int, message: str) -> None:
        """One more line in a node's stream (made by add_node_streams), stamped now - 10 min + offset."""
        self.client("logs").put_log_events(
            logGroupName=self.log_groups[fleet],
            logStreamName=f"training/default/{job_id}-node{node}",
            logEvents=[{"timestamp": int(time.time() * 1000) - 600_000 + offset_ms, "message": message}],
        )

    @contextmanager
    def benchmark_prints(self, fleet: str, lines: list[str], node: int = 0) -> Iterator[list[str]]:
        """While active, every job submitted to moto's Batch gets a node (the main node, 0, unless told)
        whose log holds `lines`: the benchmark's output, for `trainctl check` to read; any node before it
        logs only a per-node check line. Yields the submitted job ids."""
        from moto.batch_simple.models import BatchSimpleBackend

        submitted: list[str] = []
        original = BatchSimpleBackend.submit_job
        world = self

        def submit_job(backend: Any, *args: Any, **kwargs: Any) -> Any:
            name, job_id, arn = original(backend, *args, **kwargs)
            events = {
                n: [(500, f"# node check, node {n} (ip-10-0-{n}-5): busbw 30.0 Gbps, healthy")] for n in range(node)
            }
            events[node] = [(1_000 + i, line) for i, line in enumerate(lines)]
            world.add_node_streams(job_id, fleet, events)
            submitted.append(job_id)
            return name, job_id, arn

        BatchSimpleBackend.submit_job = submit_job  # type: ignore[method-assign]
        try:
            yield submitted
        finally:
            BatchSimpleBackend.submit_job = original  # type: ignore[method-assign]


def _moto_api(endpoint: str, path: str, body: dict[str, Any]) -> None:
    url = f"{endpoint}/moto-api/{path}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")  # noqa: S310 - http on 127.0.0.1
    with urllib.request.urlopen(request, timeout=10):  # noqa: S310 - 127.0.0.1 only
        pass


def _job_definition(batch: Any, name: str, spec: FleetSpec, nodes: int, environment: dict[str, str]) -> str:
    requirements = [{"type": "VCPU", "value": str(spec.vcpus)}, {"type": "MEMORY", "value": str(spec.memory_mib)}]
    if spec.gpus:
        requirements.append({"type": "GPU", "value": str(spec.gpus)})
    container = {
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/training:latest",
        "instanceType": spec.instance_type,
        "resourceRequirements": requirements,
        "environment": [{"name": k, "value": v} for k, v in environment.items()],
    }
    response = batch.register_job_definition(
        jobDefinitionName=name,
        type="multinode",
        nodeProperties={
            "numNodes": nodes,
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
        },
    )
    return str(response["jobDefinitionArn"])


_MOTO_DESCRIBE_DEFINITION: Any = None


def _describe_node_properties() -> None:
    """moto 5.2.5's DescribeJobDefinitions leaves out a multi-node definition's nodeProperties, which
    Batch returns (API JobDefinition, nodeProperties); add them while the world lives."""
    global _MOTO_DESCRIBE_DEFINITION
    from moto.batch.models import JobDefinition

    if _MOTO_DESCRIBE_DEFINITION is not None:
        return
    original = _MOTO_DESCRIBE_DEFINITION = JobDefinition.describe

    def describe(definition: Any) -> dict[str, Any]:
        result = dict(original(definition))
        if definition.node_properties:
            result["nodeProperties"] = definition.node_properties
        return result

    JobDefinition.describe = describe  # type: ignore[method-assign]


def build_world(endpoint: str) -> World:
    from moto.batch.models import ComputeEnvironment

    _describe_node_properties()

    _moto_api(endpoint, "config", {"batch": {"use_docker": False}})
    # Job states stay where the tests put them.
    _moto_api(
        endpoint,
        "state-manager/set-transition",
        {"model_name": "batch::job", "transition": {"progression": "manual", "times": 1_000_000}},
    )
    world = World(endpoint)
    batch = world.client("batch")
    logs = world.client("logs")
    world.client("s3").create_bucket(Bucket=CHECKPOINT_BUCKET)
    # Versioned, as the stack's dataset bucket is: a second upload of a key would show as a second version.
    world.client("s3").create_bucket(Bucket=DATASET_BUCKET)
    world.client("s3").put_bucket_versioning(Bucket=DATASET_BUCKET, VersioningConfiguration={"Status": "Enabled"})

    def compute_environment(name: str, instance_type: str, max_vcpus: int) -> str:
        environment = ComputeEnvironment(
            name,
            "MANAGED",
            "ENABLED",
            {"type": "EC2", "minvCpus": 0, "maxvCpus": max_vcpus, "desiredvCpus": 0, "instanceTypes": [instance_type]},
            f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/batch.amazonaws.com/AWSServiceRoleForBatch",
            account_id=ACCOUNT,
            region_name=REGION,
        )
        world.batch_backend._compute_environments[environment.arn] = environment
        return str(environment.arn)

    outputs: dict[str, str] = {}
    for spec in FLEETS:
        environment = compute_environment(f"{spec.name}-compute", spec.instance_type, spec.max_vcpus)
        policy = {}
        if spec.fair_share:
            policy["schedulingPolicyArn"] = batch.create_scheduling_policy(
                name=f"{spec.name}-fair-share",
                fairsharePolicy={"shareDecaySeconds": 3600, "shareDistribution": [{"shareIdentifier": "llama"}]},
            )["arn"]
        queue = batch.create_job_queue(
            jobQueueName=f"{spec.name}-queue",
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
            **policy,
        )["jobQueueArn"]
        stored = world.batch_backend.get_job_queue(queue)
        limits = [
            {"reason": r, "state": "RUNNABLE", "maxTimeSeconds": RUNNABLE_LIMIT_SECONDS, "action": "CANCEL"}
            for r in STUCK_REASONS
        ]
        described = stored.describe
        stored.describe = lambda described=described, limits=limits: {
            **described(),
            "jobStateTimeLimitActions": limits,
        }
        group = f"/trainctl-world/{spec.name}"
        logs.create_log_group(logGroupName=group)
        checkpoint = {"CHECKPOINT_URI": f"s3://{CHECKPOINT_BUCKET}/{spec.name}", "TRAINING_FLEET": spec.name}
        world.queues[spec.name] = queue
        world.training[spec.name] = _job_definition(batch, f"{spec.name}-training", spec, 2, checkpoint)
        world.benchmark[spec.name] = _job_definition(batch, f"{spec.name}-benchmark", spec, 2, {})
        world.log_groups[spec.name] = group
        prefix = spec.name[0].upper() + spec.name[1:]
        outputs |= {
            f"{prefix}JobQueue": queue,
            f"{prefix}TrainingJobDefinition": world.training[spec.name],
            f"{prefix}BenchmarkJobDefinition": world.benchmark[spec.name],
            f"{prefix}LogGroup": group,
        }
    world.wide_gpu_definition = _job_definition(batch, "gpu-wide", FLEETS[0], 3, {})
    world.foreign_queue = batch.create_job_queue(
        jobQueueName="someone-elses-queue",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": compute_environment("other", "g6.12xlarge", 96)}],
    )["jobQueueArn"]
    outputs["AlertTopic"] = f"arn:aws:sns:{REGION}:{ACCOUNT}:alerts"

    cloudformation = world.client("cloudformation")
    buckets = {"CheckpointBucket": CHECKPOINT_BUCKET, "DatasetBucket": DATASET_BUCKET}
    for stack, stack_outputs in (("TrainingJobs", outputs), ("TrainingData", buckets)):
        template = {
            # CloudFormation needs one resource; a wait condition handle costs nothing.
            "Resources": {"Placeholder": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
            "Outputs": {key: {"Value": value} for key, value in stack_outputs.items()},
        }
        with warnings.catch_warnings():
            # moto says it does not model the placeholder resource; the outputs are all that matter.
            warnings.simplefilter("ignore", UserWarning)
            cloudformation.create_stack(StackName=stack, TemplateBody=json.dumps(template))
    return world


def tear_down(endpoint: str) -> None:
    """moto's backends live in this process: leave nothing behind for other tests in it."""
    global _MOTO_DESCRIBE_DEFINITION
    if _MOTO_DESCRIBE_DEFINITION is not None:
        from moto.batch.models import JobDefinition

        JobDefinition.describe = _MOTO_DESCRIBE_DEFINITION  # type: ignore[method-assign]
        _MOTO_DESCRIBE_DEFINITION = None
    _moto_api(endpoint, "state-manager/unset-transition", {"model_name": "batch::job"})
    _moto_api(endpoint, "config", {"batch": {"use_docker": True}})
    _moto_api(endpoint, "reset", {})


AWS_ENV_KEYS = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


def moto_environment(endpoint: str) -> dict[str, str | None]:
    """The environment a test command runs in: moto's endpoint, fake keys, no real AWS configuration."""
    environment: dict[str, str | None] = dict.fromkeys(AWS_ENV_KEYS)
    environment |= {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",  # moto accepts any key
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_MAX_ATTEMPTS": "1",
    }
    return environment


@contextmanager
def served_world() -> Iterator[World]:
    """A world on a moto server of its own (tests/local_aws.py), torn down and stopped on exit."""
    from tests.local_aws import moto_server

    with moto_server() as endpoint:
        try:
            yield build_world(endpoint)
        finally:
            tear_down(endpoint)
