"""A Batch job queue in front of one profile's compute environment, scheduled by fair share."""

from __future__ import annotations

from aws_cdk import aws_batch as batch
from constructs import Construct


class TrainingQueue(Construct):
    """Attributes: `job_queue` (L2 JobQueue)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        compute_environment_arn: str,
        scheduling_policy: batch.ISchedulingPolicy,
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
            scheduling_policy=scheduling_policy,
        )
