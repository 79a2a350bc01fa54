"""A Batch job queue in front of one fleet's compute environment: FIFO, or fair share on request;
jobs that cannot run are cancelled with the reason instead of waiting forever."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_batch as batch
from constructs import Construct

# Why a RUNNABLE job can never start (API JobStateTimeLimitAction, `reason`): the AZ has no
# capacity for the type, the job asks for more than the environment's maxvCpus, or for more than
# one instance holds. Each cancels the job after the queue's limit, with the reason in statusReason.
STUCK_REASONS = (
    batch.JobStateTimeLimitActionsReason.INSUFFICIENT_INSTANCE_CAPACITY,
    batch.JobStateTimeLimitActionsReason.COMPUTE_ENVIRONMENT_MAX_RESOURCE,
    batch.JobStateTimeLimitActionsReason.JOB_RESOURCE_REQUIREMENT,
)


class TrainingQueue(Construct):
    """Attributes: `job_queue` (L2 JobQueue). `capacity_timeout`: how long a job may wait for
    capacity before it is cancelled, where that differs from `runnable_timeout` (a placement with a
    later fallback placement: the job is sent on, training_constructs/jobs/capacity_fallback)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        compute_environment_arn: str,
        scheduling_policy: batch.ISchedulingPolicy | None,
        runnable_timeout: Duration,
        capacity_timeout: Duration | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        # The compute environment is an L1 in the compute stack (see TrainingFleet); the queue only
        # needs its ARN.
        compute_environment = batch.ManagedEc2EcsComputeEnvironment.from_managed_ec2_ecs_compute_environment_arn(
            self, "ComputeEnvironment", compute_environment_arn
        )
        self.job_queue = batch.JobQueue(
            self,
            "Resource",
            priority=1,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=compute_environment, order=1)],
            # None: first in, first out, and submit-job needs no --share-identifier.
            scheduling_policy=scheduling_policy,
            job_state_time_limit_actions=[
                batch.JobStateTimeLimitAction(
                    max_time=capacity_timeout
                    if capacity_timeout
                    and reason is batch.JobStateTimeLimitActionsReason.INSUFFICIENT_INSTANCE_CAPACITY
                    else runnable_timeout,
                    reason=reason,
                    action=batch.JobStateTimeLimitActionsAction.CANCEL,
                    state=batch.JobStateTimeLimitActionsState.RUNNABLE,
                )
                for reason in STUCK_REASONS
            ],
        )
