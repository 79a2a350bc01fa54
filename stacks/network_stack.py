from __future__ import annotations

from typing import Any

from aws_cdk import Annotations, Fn, Stack
from aws_cdk import aws_logs as logs
from constructs import Construct

from config import zones
from config.settings import NetworkSettings
from training_constructs.network.training_network import TrainingNetwork


class NetworkStack(Stack):
    """VPC, public and training subnets in the region's first two AZs, NAT, S3 endpoint, flow logs
    and the EFA security group. Its subnets never move: the subnets of AZs that the user names live
    with their users (the compute and ParallelCluster stacks, see AzSubnet)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: NetworkSettings,
        log_retention: logs.RetentionDays,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self._azs = [Fn.select(0, Fn.get_azs()), Fn.select(1, Fn.get_azs())]
        self.network = TrainingNetwork(
            self,
            "Network",
            availability_zones=self._azs,
            nat_gateways=settings.nat_gateways,
            interface_endpoints=settings.interface_endpoints,
            flow_log_retention=log_retention,
        )
        for region in settings.zone_table_skipped:
            Annotations.of(self).add_warning_v2("training:zone-table-skipped", zones.skip_warning(region))

    @property
    def availability_zones(self) -> list[str]:
        # Overridden so that an environment-bound stack never triggers CDK's AZ context lookup
        # (an AWS call at synth); CloudFormation resolves Fn::GetAZs at deploy time instead.
        return self._azs
