from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from config.settings import BudgetSettings, FleetSettings
from training_constructs.observability.training_dashboard import TrainingDashboard


class MonitoringStack(Stack):
    """The deployment's dashboard and alarms (to the job-alert topic). Output `DashboardUrl`."""

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
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.monitoring = TrainingDashboard(
            self,
            "Dashboard",
            fleets=fleets,
            alert_topic=alert_topic,
            job_events=job_events,
            runnable_timeout=runnable_timeout,
            budgets=budgets,
        )
        name = self.monitoring.dashboard.dashboard_name
        CfnOutput(
            self,
            "DashboardUrl",
            value=f"https://{self.region}.console.{self.url_suffix}/cloudwatch/home?region={self.region}"
            f"#dashboards/dashboard/{name}",
        )
