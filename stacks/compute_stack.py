from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.settings import FleetSettings, RootVolume
from training_constructs.training_fleet import TrainingFleet
from training_constructs.training_network import TrainingNetwork


class ComputeStack(Stack):
    """Per fleet: EFA launch template, cluster placement group, managed compute environment, in the
    training subnet of the fleet's AZ. Attribute `fleets`: fleet name -> TrainingFleet."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: TrainingNetwork,
        fleets: Sequence[FleetSettings],
        root_volume: RootVolume,
        log_retention: logs.RetentionDays,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.fleets = {
            fleet.name: TrainingFleet(
                self,
                fleet.construct_id,
                instance=fleet.instance,
                fleet_name=fleet.name,
                max_nodes=fleet.max_nodes,
                subnet=network.subnet_for(fleet.availability_zone),
                efa_security_group=network.efa_security_group,
                node_security_group=network.node_security_group,
                root_volume=root_volume,
                fleet_name=fleet.name,
                log_retention=log_retention,
                capacity_reservation=fleet.capacity_reservation,
                ami_id=fleet.ami_id,
            )
            for fleet in fleets
        }
