from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from config.settings import ProfileSettings
from training_constructs.efa_launch_template import CapacityReservation
from training_constructs.training_fleet import TrainingFleet
from training_constructs.training_network import TrainingNetwork


class ComputeStack(Stack):
    """Per profile: EFA launch template, cluster placement group, managed compute environment."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: TrainingNetwork,
        gpu: ProfileSettings,
        trainium: ProfileSettings,
        root_volume_gib: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.gpu = self._fleet("Gpu", gpu, network, root_volume_gib)
        self.trainium = self._fleet("Trainium", trainium, network, root_volume_gib)

    def _fleet(
        self, construct_id: str, profile: ProfileSettings, network: TrainingNetwork, root_volume_gib: int
    ) -> TrainingFleet:
        reservation = None
        if profile.capacity_reservation_id:
            reservation = CapacityReservation(profile.capacity_reservation_id, profile.capacity_reservation_type)
        return TrainingFleet(
            self,
            construct_id,
            instance=profile.instance,
            max_nodes=profile.max_nodes,
            subnet=network.training_subnet,
            efa_security_group=network.efa_security_group,
            node_security_group=network.node_security_group,
            root_volume_gib=root_volume_gib,
            capacity_reservation=reservation,
        )
