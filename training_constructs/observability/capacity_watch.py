"""The dashboard row and the alarm of a fleet with fallback placements: how often each placement's
queue cancelled a job for lack of capacity, how many jobs were sent on, and an alarm when every
placement was short within one pass of the fallback chain. The counts come from the resubmitter's
log lines (training_constructs/jobs/capacity_fallback), which see every capacity cancel of the fleet."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from constructs import Construct

from config.metrics import CAPACITY_CANCELS, FALLBACK_RESUBMITS, FLEET_DIMENSION, NAMESPACE, PLACEMENT_DIMENSION
from config.settings import FleetSettings
from training_constructs.jobs.training_jobs import FALLBACK_CAPACITY_TIMEOUT

# An alarm's period times its evaluation periods may not exceed a day (CloudWatch API PutMetricAlarm).
MAX_WINDOW_MINUTES = 1440


def cancels(fleet: FleetSettings, placement: int, period: Duration) -> cw.Metric:
    return cw.Metric(
        namespace=NAMESPACE,
        metric_name=CAPACITY_CANCELS,
        dimensions_map={FLEET_DIMENSION: fleet.name, PLACEMENT_DIMENSION: str(placement)},
        statistic="Sum",
        period=period,
        label=f"{placement}: {fleet.placements[placement].label}",
    )


def chain_window(fleet: FleetSettings, runnable_timeout: Duration) -> Duration:
    """How long one job takes to pass every placement while none has capacity: the short capacity
    limit on each placement but the last, and the queue's RUNNABLE limit on the last."""
    minutes = len(fleet.fallback) * int(FALLBACK_CAPACITY_TIMEOUT.to_minutes()) + int(runnable_timeout.to_minutes())
    return Duration.minutes(min(minutes, MAX_WINDOW_MINUTES))


def capacity_widgets(fleet: FleetSettings) -> list[cw.IWidget]:
    five = Duration.minutes(5)
    resubmits = cw.Metric(
        namespace=NAMESPACE,
        metric_name=FALLBACK_RESUBMITS,
        dimensions_map={FLEET_DIMENSION: fleet.name},
        statistic="Sum",
        period=five,
        label="sent to the next placement",
    )
    return [
        cw.GraphWidget(
            title=f"{fleet.name}: capacity waits, jobs cancelled for capacity per placement (per 5 min)",
            left=[cancels(fleet, number, five) for number in range(len(fleet.placements))],
            right=[resubmits],
            width=24,
        )
    ]


def capacity_alarm(scope: Construct, fleet: FleetSettings, runnable_timeout: Duration) -> cw.Alarm:
    window = chain_window(fleet, runnable_timeout)
    using = {f"p{n}": cancels(fleet, n, window) for n in range(len(fleet.placements))}
    every = cw.MathExpression(
        expression="MIN([" + ", ".join(f"FILL({name}, 0)" for name in using) + "])",
        using_metrics=using,
        period=window,
        label="placements short of capacity, fewest cancels",
    )
    return every.create_alarm(
        scope,
        f"{fleet.construct_id}CapacityAlarm",
        alarm_description=(
            f"Fleet {fleet.name}: within {window.to_minutes():.0f} minutes every placement's queue cancelled a job "
            "for lack of capacity, so jobs ran out of places to go. `trainctl status` shows which placements are "
            "short and since when; add a placement, a reservation or a Capacity Block (docs/fleets.md)."
        ),
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
