from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.settings import FleetSettings, Placement, RootVolume
from training_constructs.compute.training_fleet import TrainingFleet
from training_constructs.network.az_subnet import BATCH_OFFSET, AzSubnet
from training_constructs.network.training_network import TrainingNetwork


class ComputeStack(Stack):
    """Per fleet: EFA launch template, cluster placement group, managed compute environment, in the
    training subnet of the fleet's AZ: the network's first one when no AZ is named, else the named
    AZ's own subnet, made here (one per AZ, shared by the fleets in it), so that it comes and goes
    with the fleets that use it. A fleet's fallback placements get the same, each in its AZ's subnet.
    Attributes: `fleets` (fleet name -> TrainingFleet), `subnets`
    (named AZ -> AzSubnet)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: TrainingNetwork,
        fleets: Sequence[FleetSettings],
        root_volume: RootVolume,
        log_retention: logs.RetentionDays,
        default_availability_zone: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        # Fallback placements' AZs follow the fleets' own, so that existing subnets keep their order.
        named = dict.fromkeys(f.availability_zone or default_availability_zone for f in fleets)
        named.update(
            dict.fromkeys(p.availability_zone or default_availability_zone for f in fleets for p in f.fallback)
        )
        holder = Construct(self, "Subnets")
        self.subnets = {
            az: AzSubnet(
                holder,
                vpc_id=network.vpc.vpc_id,
                route_table_id=network.training_route_table_id,
                availability_zone=az,
                offset=BATCH_OFFSET,
            )
            for az in named
            if az
        }

        def subnet(placement: Placement) -> ec2.ISubnet:
            az = placement.availability_zone or default_availability_zone
            return self.subnets[az].subnet if az else network.training_subnet

        self.fleets = {
            fleet.name: TrainingFleet(
                self,
                fleet.construct_id,
                instance=fleet.instance,
                fleet_name=fleet.name,
                max_nodes=fleet.max_nodes,
                subnet=subnet(fleet.own_placement),
                efa_security_group=network.efa_security_group,
                node_security_group=network.node_security_group,
                root_volume=root_volume,
                log_retention=log_retention,
                capacity_reservation=fleet.capacity_reservation,
                ami_id=fleet.ami_id,
                fallback=[(p, subnet(p)) for p in fleet.fallback],
            )
            for fleet in fleets
        }
