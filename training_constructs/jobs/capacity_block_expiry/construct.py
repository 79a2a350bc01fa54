"""One EventBridge rule per Capacity Block placement on EC2's expiration warning, and the function that stops
that placement's jobs (stop_jobs.py) so that each uploads its final checkpoint before EC2 takes the block."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_batch as batch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from config.settings import FleetSettings, Placement
from training_constructs.common.nag_names import nag_name
from training_constructs.common.small_functions import alarm_on_errors, depend_on_policy_only, logging_role
from training_constructs.jobs.capacity_block_expiry import stop_jobs

HANDLER_DIR = Path(__file__).resolve().parent
# EC2 user guide, "Monitor Capacity Blocks using EventBridge": the example event's detail-type is
# "Capacity Block Expiration Warning"; one edition of the same page (docs.amazonaws.cn) writes "Capacity
# Block Reservation Expiration Warning". The rule takes both: it still matches the reservation id only.
WARNING_DETAIL_TYPES = ("Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning")


@dataclass(frozen=True, kw_only=True)
class BlockPlacement:
    """A fleet's placement that is a Capacity Block, with its own queue (one compute environment)."""

    fleet: str
    number: int  # 0: the fleet's own placement
    placement: Placement
    queue: batch.IJobQueue


def block_placements(
    fleets: Sequence[FleetSettings], queues: dict[str, Sequence[batch.IJobQueue]]
) -> list[BlockPlacement]:
    """Every placement of `fleets` whose reservation is a Capacity Block; `queues` by fleet name, in
    placement order."""
    return [
        BlockPlacement(fleet=fleet.name, number=number, placement=placement, queue=queue)
        for fleet in fleets
        for number, (placement, queue) in enumerate(zip(fleet.placements, queues[fleet.name], strict=True))
        if placement.capacity_reservation and placement.capacity_reservation.kind == "capacity-block"
    ]


def event_pattern(reservation_id: str) -> events.EventPattern:
    return events.EventPattern(
        source=["aws.ec2"],
        detail_type=list(WARNING_DETAIL_TYPES),
        detail={stop_jobs.DETAIL_RESERVATION: [reservation_id]},
    )


class CapacityBlockExpiry(Construct):
    """Attributes: `function`, `rules` (one per block placement, in order), `log_group`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        blocks: Sequence[BlockPlacement],
        topic: sns.ITopic,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)
        role = logging_role(self, "Role", self.log_group)
        # TerminateJob takes a job ARN and no Batch condition key names a job's queue (Service Authorization
        # Reference, AWS Batch): the code stops only jobs ListJobs finds in the rule's own queue.
        job_arns = stack.format_arn(service="batch", resource="job", resource_name="*")
        role.add_to_principal_policy(iam.PolicyStatement(actions=["batch:TerminateJob"], resources=[job_arns]))
        role.add_to_principal_policy(iam.PolicyStatement(actions=["batch:ListJobs"], resources=["*"]))
        self.function = lambda_.Function(
            self,
            "Function",
            description="Stops a Capacity Block placement's jobs when EC2 warns the block ends, for their final "
            "checkpoint",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler=f"{Path(stop_jobs.__file__).stem}.handler",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["*", "!stop_jobs.py"]),
            timeout=Duration.minutes(2),
            role=role,
            log_group=self.log_group,
        )
        self.rules = [self._rule(block) for block in blocks]
        depend_on_policy_only(self.function, role)
        alarm_on_errors(self.function, topic, "jobs on an ending Capacity Block are not stopped for a last checkpoint")
        for finding, reason in {
            f"Resource::{nag_name(stack, job_arns)}": (
                "batch:TerminateJob takes a job ARN and no condition key names a job's queue; the code stops only "
                "the jobs it lists in the block placement's own queue"
            ),
            "Resource::*": "batch:ListJobs only, which supports no resource-level permissions",
        }.items():
            Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
                Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason)
            )

    def _rule(self, block: BlockPlacement) -> events.Rule:
        reservation = block.placement.capacity_reservation
        assert reservation is not None  # block_placements keeps only reservations
        window = block.placement.window
        where = "its own placement" if block.number == 0 else f"fallback {block.number}"
        target_input = events.RuleTargetInput.from_object(
            {
                "queue": block.queue.job_queue_arn,
                "reservation": reservation.reservation_id,
                "fleet": block.fleet,
                "placement": str(block.number),
                "end": window.end if window else "",
                "detail": events.EventField.from_path("$.detail"),
                "resources": events.EventField.from_path("$.resources"),
            }
        )
        return events.Rule(
            self,
            f"Expiry{block.fleet[0].upper()}{block.fleet[1:]}{block.number}",
            description=f"Capacity Block {reservation.reservation_id} ends in 40 minutes: stop fleet {block.fleet}'s "
            f"jobs on {where}",
            event_pattern=event_pattern(reservation.reservation_id),
            targets=[targets.LambdaFunction(self.function, event=target_input, retry_attempts=8)],
        )
