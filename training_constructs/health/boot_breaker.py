"""Per fleet, a circuit breaker on node faults: a node that fails the boot check with a node fault powers
off and Auto Scaling launches another (training_constructs/health/host_check.py); a node that finds a
fault in itself during a job takes itself out the same way (node_recovery.py). Where every node fails
the same way, that loop would bill launches for ever. When node_faults_to_trip(maxNodes) nodes of one
fleet fail within WINDOW, the fleet's breaker alarm goes to ALARM; an EventBridge rule on that alarm's
state change runs a small function that disables the fleet's compute environments (a DISABLED managed
compute environment does not scale out; STARTING and RUNNING jobs continue: Batch API,
ComputeEnvironmentDetail.state) and publishes which checks failed and the command that turns the fleet
back on. The alarm also notifies the job-alert topic itself, with the same command.

What counts is only what the hosts wrote into the fleet's boot-check log group with the instance role:
boot-check node faults (BootCheckFailed, Fault=node) and take-outs the host itself confirmed
(TakeOutConfirmed, node_scripts/boot_check.py `confirm`). Job containers cannot write there (the app's
multi-node jobs run in awsvpc mode with IMDS blocked, so not with the instance role, and the job role may
write only the job log groups; a single-node job would run in host mode, within IMDS's reach). The alarm sums
those two metrics, but a metric is not evidence: CloudWatch extracts embedded metrics from any log group, so
a job can print a line that adds to them. The alarm only wakes the function; the function disables nothing
unless the boot-check log group itself holds the lines, so no line a job prints, NodesTakenOut included,
moves the breaker.

CloudWatch sends "CloudWatch Alarm State Change" events to EventBridge for every state change
(CloudWatch user guide, "Alarm events and EventBridge"); the rule matches this alarm's ARN in the
event's resources and the new state in detail.state.value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from config import metrics
from training_constructs.common.small_functions import (
    alarm_on_errors,
    depend_on_policy_only,
    grant_publish_to_alerts,
    logging_role,
)
from training_constructs.health.boot_breaker_function import trip

FUNCTION_DIR = Path(__file__).with_name("boot_breaker_function")
# At least three nodes: one bad instance, or two, is bad luck that the power-off already handles; a
# third within the hour says the fleet, not the instance, is broken. At one launch every ~10 minutes
# that stops a p5.48xlarge loop within about half an hour. Larger fleets: node_faults_to_trip.
NODE_FAULTS_TO_TRIP = 3
# One node fault in an hour per this many nodes of maxNodes, at the least.
NODES_PER_FAULT = 10


def node_faults_to_trip(max_nodes: int) -> int:
    """The breaker's threshold for a fleet of up to `max_nodes` nodes: a tenth of them, at least 3. A
    cause every node shares (an AMI whose driver never loads) fails every node a job launches, so a
    job of a tenth of the fleet or more trips it in its first launch wave; independent bad hosts, which
    grow with the fleet's size, rarely reach a tenth of it in one hour (3 would stop a 64-node fleet for
    three unrelated bad hosts among 64 fresh launches)."""
    return max(NODE_FAULTS_TO_TRIP, math.ceil(max_nodes / NODES_PER_FAULT))


# One alarm period: CloudWatch sums the node faults of each hour-long period.
WINDOW = Duration.hours(1)
# What the function reads back to confirm the alarm: its period and as much again, since the alarm
# reaches the function some time after the faults (the alarm, not the function, decides "within an hour").
LOOKBACK = Duration.hours(2)


@dataclass(frozen=True)
class BreakerFleet:
    name: str
    # Every placement's compute environment, the fleet's own first: the nodes of each placement run the
    # boot check under the fleet's name and log group, so their faults trip the same breaker.
    compute_environment_arns: tuple[str, ...]
    # The hosts' own lines: boot checks and confirmed take-outs.
    boot_check_log_group: logs.ILogGroup
    max_nodes: int


class BootCircuitBreaker(Construct):
    """Attributes: `function`, `errors_alarm`, `alarms` and `rules` (fleet name -> the fleet's alarm, rule)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleets: Sequence[BreakerFleet],
        topic: sns.ITopic,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        function_logs = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)
        role = logging_role(self, "Role", function_logs)
        # UpdateComputeEnvironment takes the compute environment's ARN as its resource (Batch user
        # guide, "Supported resource-level permissions for AWS Batch API actions"): these fleets only.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["batch:UpdateComputeEnvironment"],
                resources=[arn for f in fleets for arn in f.compute_environment_arns],
            )
        )
        for fleet in fleets:
            fleet.boot_check_log_group.grant(role, "logs:FilterLogEvents")
        grant_publish_to_alerts(role, topic)
        self.function = lambda_.Function(
            self,
            "Function",
            description="Node-fault circuit breaker: disables a fleet whose nodes keep failing",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="trip.handler",
            code=lambda_.Code.from_asset(str(FUNCTION_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"]),
            # The most Lambda allows (Lambda developer guide, "Configure Lambda function timeout"): Batch
            # refuses the change while the environment is being updated, and the function waits it out.
            timeout=Duration.minutes(15),
            role=role,
            log_group=function_logs,
            environment={
                trip.LOOKBACK_ENV: str(int(LOOKBACK.to_seconds())),
                trip.TOPIC_ENV: topic.topic_arn,
            },
        )

        depend_on_policy_only(self.function, role)
        self.errors_alarm = alarm_on_errors(
            self.function, topic, "a fleet whose nodes keep failing the boot check is not disabled"
        )

        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self.rules: dict[str, events.Rule] = {}
        for fleet in fleets:
            own, *fallback = fleet.compute_environment_arns
            # The alarm text has room for one command (AlarmDescription: 1024 characters); the breaker's
            # own message lists one per placement.
            also = f" (and the same for its {len(fallback)} fallback placements: see the breaker's message)"
            threshold = node_faults_to_trip(fleet.max_nodes)
            boot_faults = cloudwatch.Metric(
                namespace=metrics.NAMESPACE,
                metric_name=metrics.BOOT_CHECK_FAILED,
                dimensions_map={metrics.FLEET_DIMENSION: fleet.name, metrics.FAULT_DIMENSION: metrics.BOOT_FAULTS[0]},
                statistic="Sum",
                period=WINDOW,
            )
            # Host-confirmed take-outs: the host's line is 0 when its own check found nothing, so Sum counts 1s.
            confirmed = cloudwatch.Metric(
                namespace=metrics.NAMESPACE,
                metric_name=metrics.TAKE_OUT_CONFIRMED,
                dimensions_map={metrics.FLEET_DIMENSION: fleet.name},
                statistic="Sum",
                period=WINDOW,
            )
            # FILL: an hour with faults of one kind only has no data point for the other.
            node_faults = cloudwatch.MathExpression(
                expression="FILL(boot, 0) + FILL(confirmed, 0)",
                using_metrics={"boot": boot_faults, "confirmed": confirmed},
                label="node faults (boot check and host-confirmed take-outs)",
                period=WINDOW,
            )
            alarm = node_faults.create_alarm(
                self,
                f"{fleet.name}Alarm",
                alarm_description=(
                    f"Node-fault circuit breaker of fleet {fleet.name}: the metrics say {threshold} or more nodes "
                    "failed the boot check with a node fault or were taken out during a job with a fault their host "
                    "confirmed, within an hour. The breaker's function counts the hosts' own lines in the fleet's "
                    "boot-check log group and, when they show as many, disables the fleet's compute environment (no "
                    "new instances; running jobs go on) and sends a second message naming the failed checks; without "
                    "that message nothing was disabled. Fix the cause, then turn the fleet back on: "
                    f"{trip.enable_command(own)}{also if fallback else ''}"
                ),
                threshold=threshold,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(actions.SnsAction(topic))
            self.alarms[fleet.name] = alarm
            self.rules[fleet.name] = events.Rule(
                self,
                f"{fleet.name}Trip",
                description=f"Node-fault circuit breaker of fleet {fleet.name}: its alarm entered ALARM",
                event_pattern=events.EventPattern(
                    source=["aws.cloudwatch"],
                    detail_type=["CloudWatch Alarm State Change"],
                    resources=[alarm.alarm_arn],
                    detail={"state": {"value": ["ALARM"]}},
                ),
                targets=[
                    targets.LambdaFunction(
                        self.function,
                        event=events.RuleTargetInput.from_object(
                            {
                                "fleet": fleet.name,
                                "computeEnvironments": list(fleet.compute_environment_arns),
                                "logGroup": fleet.boot_check_log_group.log_group_name,
                                "nodeFaultsToTrip": threshold,
                            }
                        ),
                        retry_attempts=8,
                    )
                ],
            )
