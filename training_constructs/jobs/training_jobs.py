"""One fleet's way in: its job queue, its log group, and two multi-node job definitions (the
training job and the all-reduce smoke test)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.catalog import InstanceSpec
from training_constructs.jobs.multi_node_job import MultiNodeJobDefinition
from training_constructs.jobs.training_queue import TrainingQueue
from training_constructs.jobs.workloads import CHECKPOINT_DIR, Workload, benchmark_workload, training_workload

# What a task role needs for ECS Exec, exactly (ECS developer guide, "Monitor Amazon ECS containers
# with ECS Exec", IAM permissions required for ECS Exec). ssmmessages has no resource types, so the
# resource is "*" (Service Authorization Reference, Amazon Message Gateway Service).
ECS_EXEC_ACTIONS = (
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)
# Session logging: Batch's ECS cluster keeps ECS Exec's default logging, which sends each session's
# commands and output to the task's awslogs log group, written by the SSM agent in the container as
# the task role. What that role needs, as the same page lists it ("IAM permissions required for
# Amazon CloudWatch Logs or Amazon S3 Logging"): DescribeLogGroups on every log group, and the three
# stream actions on the log group the session writes to (here each fleet's job log group).
ECS_EXEC_LOG_LOOKUP = ("logs:DescribeLogGroups",)
ECS_EXEC_LOG_WRITES = ("logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents")
# The main node's watcher (container/launcher/node_watch.py) reads its child node jobs: DescribeJobs, which takes
# no resource type, so the resource is "*" (Service Authorization Reference, "Actions, resources, and
# condition keys for AWS Batch"; Batch user guide, "Supported resource-level permissions for AWS Batch API
# actions", which does not list it). Read only: a job's status, reasons and exit codes.
NODE_WATCH_ACTIONS = ("batch:DescribeJobs",)


def grant_ecs_exec(role: iam.Role, log_groups: Sequence[logs.ILogGroup]) -> None:
    """Let the job containers open ECS Exec sessions (`trainctl exec`) and log them to the jobs'
    log groups."""
    role.add_to_principal_policy(iam.PolicyStatement(actions=list(ECS_EXEC_ACTIONS), resources=["*"]))
    role.add_to_principal_policy(iam.PolicyStatement(actions=list(ECS_EXEC_LOG_LOOKUP), resources=["*"]))
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=list(ECS_EXEC_LOG_WRITES), resources=[g.log_group_arn for g in log_groups])
    )
    Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="ECS Exec's four ssmmessages actions, which have no resource types to scope them to, and "
            "logs:DescribeLogGroups, which ECS Exec's session logging needs on every log group (ECS developer guide)",
        )
    )


def grant_node_watch(role: iam.Role) -> None:
    """Let the job containers describe Batch jobs: the main node sees a child node job that failed without
    telling it (container/launcher/node_watch.py)."""
    role.add_to_principal_policy(iam.PolicyStatement(actions=list(NODE_WATCH_ACTIONS), resources=["*"]))
    Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
        Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="batch:DescribeJobs, for the main node to see its child node jobs fail; the action takes no "
            "resource type (Service Authorization Reference, AWS Batch)",
        )
    )


# How long a job waits for capacity on a placement that has a later one before it is cancelled and
# sent on: the shortest jobStateTimeLimitActions allows (600 s, API JobStateTimeLimitAction).
FALLBACK_CAPACITY_TIMEOUT = Duration.minutes(10)
# The smoke test moves a few GiB; half an hour covers image pulls and a slow fabric.
BENCHMARK_TIMEOUT_SECONDS = 1800


class TrainingJobs(Construct):
    """Attributes: `job_queue`, `log_group`, `training` and `benchmark` (MultiNodeJobDefinition),
    `placement_queues` (the fleet's own queue, then one per fallback placement: `Fallback<n>Queue`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance: InstanceSpec,
        nodes: int,
        image_uri: str,
        compute_environment_arn: str,
        scheduling_policy: batch.ISchedulingPolicy | None,
        runnable_timeout: Duration,
        job_role: iam.IRole,
        environment: Mapping[str, str],
        checkpoint_uri: str,
        timeout_seconds: int,
        attempts: int,
        log_retention: logs.RetentionDays,
        ecs_exec: bool,
        fallback_compute_environment_arns: Sequence[str] = (),
        execution_role: iam.IRole | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        # Every placement but the last waits only briefly for capacity; the last waits as long as
        # any fleet's queue (runnableTimeoutMinutes).
        arns = [compute_environment_arn, *fallback_compute_environment_arns]
        self.placement_queues = [
            TrainingQueue(
                self,
                "Queue" if number == 0 else f"Fallback{number}Queue",
                compute_environment_arn=arn,
                scheduling_policy=scheduling_policy,
                runnable_timeout=runnable_timeout,
                capacity_timeout=FALLBACK_CAPACITY_TIMEOUT if number < len(arns) - 1 else None,
            ).job_queue
            for number, arn in enumerate(arns)
        ]
        self.job_queue = self.placement_queues[0]
        # Job output is the record of a run: kept when the stack goes.
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)

        def definition(
            construct_id: str, workload: Workload, extra: Mapping[str, str], timeout: int, prefix: str
        ) -> MultiNodeJobDefinition:
            return MultiNodeJobDefinition(
                self,
                construct_id,
                instance=instance,
                nodes=nodes,
                image_uri=image_uri,
                job_role=job_role,
                log_group=self.log_group,
                log_stream_prefix=prefix,
                command=workload.command,
                environment={**environment, **extra, **workload.environment},
                timeout_seconds=timeout,
                attempts=attempts,
                ecs_exec=ecs_exec,
                execution_role=execution_role,
            )

        # The launcher restores <CHECKPOINT_URI>/<job id>/ before training and uploads it while and
        # after the script runs; a retried attempt keeps its job id and so resumes.
        checkpoints = {"CHECKPOINT_URI": checkpoint_uri, "CHECKPOINT_DIR": CHECKPOINT_DIR}
        self.training = definition("TrainingJob", training_workload(instance), checkpoints, timeout_seconds, "training")
        self.benchmark = definition(
            "BenchmarkJob",
            benchmark_workload(instance),
            {},
            min(timeout_seconds, BENCHMARK_TIMEOUT_SECONDS),
            "allreduce",
        )
