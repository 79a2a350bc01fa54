"""One CloudWatch dashboard for the deployment (a row per fleet) and the alarms that page the job-alert
topic. aws_cloudwatch L2 only: cdk-monitoring-constructs has no Batch monitor (cdklabs/
cdk-monitoring-constructs#612) and every figure here is a custom metric; see docs/observability.md."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from config.catalog import AcceleratorKind
from config.metrics import (
    BENCHMARK_VERDICT,
    BOOT_CHECK_FAILED,
    BOOT_FAULTS,
    EFA_COUNTER_METRICS,
    FAULT_DIMENSION,
    FLEET_DIMENSION,
    GPU_UTILIZATION,
    JOB_STATE_METRICS,
    JOBS_RESUMED,
    NAMESPACE,
    NODE_HEARTBEAT,
    NODES_TAKEN_OUT,
    STRAGGLER_WINDOWS,
    TAKE_OUT_CONFIRMED,
    XID_ERRORS,
)
from config.settings import BudgetSettings, FleetSettings
from training_constructs.health.boot_breaker import NODE_FAULTS_TO_TRIP, WINDOW
from training_constructs.observability.budget_widgets import budget_widgets
from training_constructs.observability.capacity_watch import capacity_alarm, capacity_widgets

WIDTH = 24
# A fleet whose retransmitted EFA packets exceed this in a minute is losing packets on the fabric.
# No AWS figure exists; healthy SRD traffic retransmits rarely, so a sustained thousand a minute across
# a fleet is worth a look (tune to what your fleet shows while healthy).
EFA_RETRANSMITS_PER_MINUTE = 1000
EFA_RETRANSMIT_MINUTES = 5


ONE_MINUTE = Duration.minutes(1)


def search(metric: str, fleet: str, statistic: str, period: Duration = ONE_MINUTE) -> str:
    """Every series of `metric` of one fleet (any dimension set that has this Fleet)."""
    return (
        f'SEARCH(\'Namespace="{NAMESPACE}" MetricName="{metric}" {FLEET_DIMENSION}="{fleet}"\', '
        f"'{statistic}', {int(period.to_seconds())})"
    )


def insights_sum(metric: str, fleet: str) -> str:
    """A Metrics Insights query: the fleet's total of `metric`. Alarms take Metrics Insights queries
    but not SEARCH expressions (CloudWatch user guide, "Alarming on metric math expressions" and
    "Create alarms on Metrics Insights queries")."""
    # Names come from config.metrics and validated fleet names (letters and digits), never user text.
    return f"SELECT SUM({metric}) FROM \"{NAMESPACE}\" WHERE {FLEET_DIMENSION} = '{fleet}'"  # noqa: S608


def job_metric(status: str, fleet: str, period: Duration) -> cw.Metric:
    return cw.Metric(
        namespace=NAMESPACE,
        metric_name=JOB_STATE_METRICS[status],
        dimensions_map={FLEET_DIMENSION: fleet},
        statistic="Sum",
        period=period,
        label=status,
    )


class TrainingDashboard(Construct):
    """Attributes: `dashboard`, `alarms` (fleet name -> alarms of that fleet)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleets: Sequence[FleetSettings],
        alert_topic: sns.ITopic,
        job_events: logs.ILogGroup,
        runnable_timeout: Duration,
        budgets: BudgetSettings | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.dashboard = cw.Dashboard(self, "Resource", default_interval=Duration.hours(3))
        self.dashboard.add_widgets(
            cw.TextWidget(markdown="# Training platform: alerts and boot checks", width=WIDTH, height=1),
            cw.GraphWidget(
                title="Job alerts published (failed and cancelled jobs)",
                left=[alert_topic.metric_number_of_messages_published(period=Duration.minutes(5))],
                width=8,
            ),
            # {Namespace,Dim,...} matches only metrics with exactly those dimensions (CloudWatch user
            # guide, "CloudWatch search expression syntax"): the boot check emits both sets.
            cw.GraphWidget(
                title="Boot-check failures, every fleet",
                left=[
                    cw.MathExpression(
                        expression=f"SEARCH('{{{NAMESPACE},{FLEET_DIMENSION}}} MetricName=\"{BOOT_CHECK_FAILED}\"', "
                        "'Sum', 300)",
                        label="",
                        period=Duration.minutes(5),
                    )
                ],
                width=8,
            ),
            cw.GraphWidget(
                title=(
                    "Boot-check node faults per hour: with take-outs, the breaker disables a fleet at a tenth of "
                    f"its maxNodes, at least {NODE_FAULTS_TO_TRIP}"
                ),
                left=[
                    cw.MathExpression(
                        expression=f"SEARCH('{{{NAMESPACE},{FAULT_DIMENSION},{FLEET_DIMENSION}}} "
                        f'MetricName="{BOOT_CHECK_FAILED}" {FAULT_DIMENSION}="{BOOT_FAULTS[0]}"\', '
                        f"'Sum', {int(WINDOW.to_seconds())})",
                        label="",
                        period=WINDOW,
                    )
                ],
                left_annotations=[cw.HorizontalAnnotation(value=NODE_FAULTS_TO_TRIP, label="circuit breaker")],
                width=8,
            ),
        )
        self.alarms: dict[str, list[cw.Alarm]] = {}
        alarm_action = actions.SnsAction(alert_topic)
        for fleet in fleets:
            self._fleet_row(fleet, job_events)
            alarms = self._fleet_alarms(fleet, runnable_timeout)
            if fleet.fallback:
                self.dashboard.add_widgets(*capacity_widgets(fleet))
                alarms.append(capacity_alarm(self, fleet, runnable_timeout))
            for alarm in alarms:
                alarm.add_alarm_action(alarm_action)
            self.alarms[fleet.name] = alarms
        if budgets:
            self.dashboard.add_widgets(*budget_widgets(budgets))

    def _fleet_row(self, fleet: FleetSettings, job_events: logs.ILogGroup) -> None:
        name = fleet.name
        five = Duration.minutes(5)
        gpu = fleet.instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU
        accelerator: cw.IWidget = (
            cw.GraphWidget(
                title=f"{name}: GPU utilisation per node (%)",
                left=[cw.MathExpression(expression=search(GPU_UTILIZATION, name, "Average"), label="")],
                left_y_axis=cw.YAxisProps(min=0, max=100),
                width=6,
            )
            if gpu
            else cw.TextWidget(
                markdown=f"**{name}: NeuronCore utilisation** is not collected (docs/observability.md).",
                width=6,
            )
        )
        self.dashboard.add_widgets(
            cw.TextWidget(
                markdown=f"## Fleet {name} ({fleet.instance.name}, up to {fleet.max_nodes} nodes)",
                width=WIDTH,
                height=1,
            ),
            cw.GraphWidget(
                title=f"{name}: jobs entering each state (per 5 min)",
                left=[job_metric(status, name, five) for status in JOB_STATE_METRICS],
                width=8,
            ),
            cw.LogQueryWidget(
                title=f"{name}: time from submission to start (s)",
                log_group_names=[job_events.log_group_name],
                query_lines=[
                    f"filter fleet = '{name}' and status = 'RUNNING'",
                    "fields (toMillis(@timestamp) - createdAt) / 1000 as waitSeconds",
                    "stats max(waitSeconds) as longest, avg(waitSeconds) as average by bin(5m)",
                ],
                view=cw.LogQueryVisualizationType.LINE,
                width=8,
            ),
            cw.GraphWidget(
                title=f"{name}: nodes running",
                left=[cw.MathExpression(expression=f"SUM({search(NODE_HEARTBEAT, name, 'Maximum')})", label="nodes")],
                left_annotations=[cw.HorizontalAnnotation(value=fleet.max_nodes, label="maxNodes")],
                left_y_axis=cw.YAxisProps(min=0),
                width=8,
            ),
        )
        self.dashboard.add_widgets(
            accelerator,
            cw.GraphWidget(
                title=f"{name}: EFA bytes per minute, fleet total",
                left=[
                    cw.MathExpression(
                        expression=f"SUM({search(EFA_COUNTER_METRICS[counter], name, 'Sum')})", label=counter
                    )
                    for counter in ("tx_bytes", "rx_bytes", "rdma_read_bytes", "rdma_write_bytes")
                ],
                width=5,
            ),
            cw.GraphWidget(
                title=f"{name}: EFA retransmits and errors per minute",
                left=[
                    cw.MathExpression(
                        expression=f"SUM({search(EFA_COUNTER_METRICS[counter], name, 'Sum')})", label=counter
                    )
                    for counter in (
                        "retrans_pkts",
                        "retrans_timeout_events",
                        "rx_drops",
                        "unresponsive_remote_events",
                        "impaired_remote_conn_events",
                    )
                ],
                width=5,
            ),
            cw.GraphWidget(
                title=f"{name}: self-healing (nodes taken out, jobs resumed, slow-node windows, per hour)",
                # The breaker counts the host-confirmed series; the job-reported one is what jobs printed.
                left=[
                    cw.Metric(
                        namespace=NAMESPACE,
                        metric_name=metric_name,
                        dimensions_map={FLEET_DIMENSION: name},
                        statistic="Sum",
                        period=Duration.hours(1),
                        label=label,
                    )
                    for metric_name, label in (
                        (NODES_TAKEN_OUT, "nodes taken out (job-reported)"),
                        (TAKE_OUT_CONFIRMED, "take-outs the host confirmed"),
                        (JOBS_RESUMED, "jobs resumed"),
                        (STRAGGLER_WINDOWS, "windows with a slow node (job-reported)"),
                    )
                ],
                left_y_axis=cw.YAxisProps(min=0),
                width=4,
            ),
            cw.SingleValueWidget(
                title=f"{name}: last benchmark verdict (1 healthy, 0.5 degraded, 0 failing)",
                metrics=[
                    cw.MathExpression(expression=search(BENCHMARK_VERDICT, name, "Minimum", Duration.days(1)), label="")
                ],
                width=4,
            ),
        )

    def _fleet_alarms(self, fleet: FleetSettings, runnable_timeout: Duration) -> list[cw.Alarm]:
        name = fleet.name
        cid = fleet.construct_id
        # Half the queue's RUNNABLE limit, as whole minutes: an alarm's period is 10, 20 or 30 s or a
        # multiple of 60 s (CloudWatch API PutMetricAlarm, Period).
        half = Duration.minutes(max(1, int(runnable_timeout.to_minutes() // 2)))
        waiting = cw.MathExpression(
            expression="IF(FILL(runnable, 0) > 0 AND FILL(started, 0) == 0, 1, 0)",
            using_metrics={
                "runnable": job_metric("RUNNABLE", name, half),
                "started": job_metric("STARTING", name, half),
            },
            period=half,
            label="jobs queued, none started",
        )
        stuck = waiting.create_alarm(
            self,
            f"{cid}RunnableAlarm",
            alarm_description=(
                f"Fleet {name}: in one {half.to_minutes():.0f}-minute window (half the queue's RUNNABLE limit) "
                "jobs became RUNNABLE and no job started: a window count, not each job's own wait (`trainctl "
                "why JOB` tells one job's). The queue cancels jobs stuck at the limit. Check that the compute "
                "environment is VALID and scaling (Batch console), the EC2 quota and capacity for "
                f"{fleet.instance.name} in the fleet's AZ, and that the job fits one node (docs/jobs.md, "
                "Jobs that cannot run)."
            ),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        alarms = [stuck]
        # Boot-check failures alarm from the jobs stack (training_constructs/health/fleet_health.py), beside
        # the fleet check; here only GPU Xid errors at run time.
        if fleet.instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
            xid = cw.MathExpression(
                expression=insights_sum(XID_ERRORS, name), period=Duration.minutes(5), label="GPU Xid errors"
            )
            alarms.append(
                xid.create_alarm(
                    self,
                    f"{cid}XidAlarm",
                    alarm_description=(
                        f"Fleet {name}: a node reported GPU Xid errors. Find the node on the dashboard's "
                        "InstanceId series, read its kernel log (SSM: dmesg | grep -i xid), and terminate it "
                        "so Batch replaces it; a GPU with repeated Xid errors needs an EC2 instance replacement."
                    ),
                    threshold=1,
                    evaluation_periods=1,
                    comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                    treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                )
            )
        # Nodes that took themselves out after a node fault during a job, as the jobs reported it
        # (container/launcher/node_fault.py's line in the job's log): each costs an instance, and a cause every
        # node shares would repeat on every retry. This alarm only alerts, early; any job can print the line,
        # so the fleet's node-fault circuit breaker (boot_breaker.py) never counts it: it counts only the
        # take-outs the host confirmed (TakeOutConfirmed) and disables the fleet at its own threshold.
        taken_out = cw.Metric(
            namespace=NAMESPACE,
            metric_name=NODES_TAKEN_OUT,
            dimensions_map={FLEET_DIMENSION: name},
            statistic="Sum",
            period=WINDOW,
        )
        alarms.append(
            taken_out.create_alarm(
                self,
                f"{cid}TakenOutAlarm",
                alarm_description=(
                    f"Fleet {name}: jobs reported {NODE_FAULTS_TO_TRIP} or more nodes taken out after a node fault "
                    "within an hour (the launcher's line in the job log). `trainctl why JOB` names each node and "
                    "what it found; the same fault on many nodes points at the AMI or instance type. The fleet's "
                    "circuit breaker counts only the take-outs the host confirmed (TakeOutConfirmed in the "
                    "boot-check log group), with boot-check node faults, and disables the fleet at its threshold; "
                    "to stop it sooner: aws batch update-compute-environment --compute-environment <its ARN> "
                    "--state DISABLED."
                ),
                threshold=NODE_FAULTS_TO_TRIP,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            )
        )
        retransmits = cw.MathExpression(
            expression=insights_sum(EFA_COUNTER_METRICS["retrans_pkts"], name),
            period=Duration.minutes(1),
            label="EFA retransmitted packets",
        )
        alarms.append(
            retransmits.create_alarm(
                self,
                f"{cid}EfaRetransmitAlarm",
                alarm_description=(
                    f"Fleet {name}: more than {EFA_RETRANSMITS_PER_MINUTE} EFA packets retransmitted per minute "
                    f"for {EFA_RETRANSMIT_MINUTES} minutes while nodes ran. Compare nodes on the dashboard: "
                    "one node's counters rising points at that node (terminate it); all rising points at "
                    "placement or congestion (check the cluster placement group)."
                ),
                threshold=EFA_RETRANSMITS_PER_MINUTE,
                evaluation_periods=EFA_RETRANSMIT_MINUTES,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            )
        )
        return alarms
