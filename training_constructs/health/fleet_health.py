"""A fleet's health signals on the job-alert topic: an alarm when a node fails its boot-time host
check, and, with a schedule, the fleet check (the benchmark job) submitted on that schedule with
alarms when its verdict is failing or no verdict arrives.

A benchmark job that FAILS (including one cancelled for sitting RUNNABLE) already reaches the topic
through JobAlerts; the missing-verdict alarm covers the rest: the schedule that could not submit, a
run that succeeded without a verdict, a check that never ran.
"""

from __future__ import annotations

import math

from aws_cdk import Duration
from aws_cdk import aws_batch as batch
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as scheduler_targets
from aws_cdk import aws_sns as sns
from constructs import Construct

from config import metrics
from config.settings import HealthCheckSchedule
from training_constructs.jobs.multi_node_job import MultiNodeJobDefinition

# BenchmarkVerdict: 1 healthy, 0.5 degraded, 0 failing (config/metrics.py). Below this: failing.
FAILING_BELOW = 0.25
VERDICT_PERIOD = Duration.hours(1)
# An alarm looks back at most seven days (CloudWatch API PutMetricAlarm, Period).
MAX_EVALUATION_SECONDS = 7 * 24 * 3600
# The share identifier of the fleet check on a fair-share queue. Batch refuses a job without one
# there (API SubmitJob, shareIdentifier), and an identifier the policy does not list weighs 1.0
# (AWS::Batch::SchedulingPolicy ShareAttributes), so the check takes no team's share.
FLEET_CHECK_SHARE = "fleetcheck"


def verdict_window_periods(schedule: HealthCheckSchedule, check_seconds: int) -> int:
    """Hourly periods a verdict may take to arrive: the gap between runs plus one run's own time
    (waiting for capacity, then the job's timeout), within what an alarm can look back over."""
    window = schedule.interval_seconds + check_seconds
    hour = int(VERDICT_PERIOD.to_seconds())
    return min(math.ceil(window / hour), MAX_EVALUATION_SECONDS // hour)


class FleetHealth(Construct):
    """Attributes: `boot_check_alarm`; with a schedule also `failing_alarm`, `missing_alarm`, and
    `schedule_rule` (FIFO queues) or `schedule` (fair-share queues) (None without one)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleet: str,
        job_queue: batch.IJobQueue,
        benchmark: MultiNodeJobDefinition,
        topic: sns.ITopic,
        schedule: HealthCheckSchedule | None,
        check_seconds: int,
        fair_share: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        notify = actions.SnsAction(topic)

        def metric(name: str, statistic: str, period: Duration) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace=metrics.NAMESPACE,
                metric_name=name,
                dimensions_map={metrics.FLEET_DIMENSION: fleet},
                statistic=statistic,
                period=period,
            )

        # Any boot-check failure, node or shared fault (the [Fleet] series; config/metrics.py). A node
        # fault terminates the node and Batch launches another (no AWS document promises the
        # replacement, README "Verify a new fleet"); training_constructs/health/boot_breaker.py stops that loop.
        self.boot_check_alarm = metric(metrics.BOOT_CHECK_FAILED, "Maximum", Duration.minutes(5)).create_alarm(
            self,
            "BootCheckFailed",
            alarm_description=f"A {fleet} node failed its boot-time host check (its JSON line is in the fleet's "
            "boot-check log group): with a node fault it did not register and shut down; with a shared fault "
            "(Fault=shared) it registered and jobs are refused with the cause",
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.boot_check_alarm.add_alarm_action(notify)

        self.schedule_rule: events.Rule | None = None
        self.schedule: scheduler.Schedule | None = None
        self.failing_alarm: cloudwatch.Alarm | None = None
        self.missing_alarm: cloudwatch.Alarm | None = None
        if schedule is None:
            return
        if fair_share:
            self.schedule = self._fair_share_schedule(fleet, job_queue, benchmark, schedule)
        else:
            self.schedule_rule = self._fifo_rule(fleet, job_queue, benchmark, schedule)
        self.failing_alarm = metric(metrics.BENCHMARK_VERDICT, "Minimum", VERDICT_PERIOD).create_alarm(
            self,
            "CheckFailing",
            alarm_description=f"The {fleet} fleet check's verdict is failing: a wrong all-reduce result, or a node's "
            "bus bandwidth under a tenth of its GPUs' published interconnect (the benchmark job's log has the line)",
            threshold=FAILING_BELOW,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.failing_alarm.add_alarm_action(notify)
        periods = verdict_window_periods(schedule, check_seconds)
        self.missing_alarm = metric(metrics.BENCHMARK_VERDICT, "SampleCount", VERDICT_PERIOD).create_alarm(
            self,
            "CheckMissing",
            alarm_description=f"No {fleet} fleet check verdict in {periods} hours (schedule {schedule.expression}): "
            "the check did not finish",
            threshold=1,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        self.missing_alarm.add_alarm_action(notify)

    def _fifo_rule(
        self, fleet: str, job_queue: batch.IJobQueue, benchmark: MultiNodeJobDefinition, schedule: HealthCheckSchedule
    ) -> events.Rule:
        # An EventBridge rule on a schedule with a Batch job queue as its target submits the job
        # (EventBridge user guide, "Creating a rule that runs on a schedule"; targets: "Batch job queue").
        return events.Rule(
            self,
            "Schedule",
            description=f"Fleet check of {fleet}: the all-reduce benchmark with the node preflight",
            schedule=events.Schedule.expression(schedule.expression),
            targets=[
                targets.BatchJob(
                    job_queue.job_queue_arn,
                    job_queue,
                    benchmark.job_definition_arn,
                    benchmark,
                    job_name=f"{fleet}-fleet-check",
                    retry_attempts=2,
                )
            ],
        )

    def _fair_share_schedule(
        self, fleet: str, job_queue: batch.IJobQueue, benchmark: MultiNodeJobDefinition, schedule: HealthCheckSchedule
    ) -> scheduler.Schedule:
        """EventBridge's Batch target (BatchParameters) has no share identifier, so on a fair-share
        queue the check goes through EventBridge Scheduler's universal target, which calls SubmitJob
        with the request parameters given as Input (EventBridge Scheduler user guide, "Using
        universal targets": arn:aws:scheduler:::aws-sdk:batch:submitJob)."""
        submit = {
            "JobName": f"{fleet}-fleet-check",
            "JobQueue": job_queue.job_queue_arn,
            "JobDefinition": benchmark.job_definition_arn,
            "ShareIdentifier": FLEET_CHECK_SHARE,
        }
        return scheduler.Schedule(
            self,
            "FairShareSchedule",
            description=f"Fleet check of {fleet}: the all-reduce benchmark with the node preflight",
            schedule=scheduler.ScheduleExpression.expression(schedule.expression),
            target=scheduler_targets.Universal(
                service="batch",
                action="submitJob",
                input=scheduler.ScheduleTargetInput.from_object(submit),
                # SubmitJob's resources are the job queue and the job definition (Batch user guide,
                # "Supported resource-level permissions"): this job on this queue only.
                policy_statements=[
                    iam.PolicyStatement(
                        actions=["batch:SubmitJob"],
                        resources=[job_queue.job_queue_arn, benchmark.job_definition_arn],
                    )
                ],
                retry_attempts=2,
            ),
        )
