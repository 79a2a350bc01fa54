"""A launch template that attaches every EFA interface an instance type has."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from config.catalog import InstanceSpec

# Root device of the ECS-optimized Amazon Linux 2023 AMIs.
ROOT_DEVICE = "/dev/xvda"


@dataclass(frozen=True)
class InterfaceSlot:
    network_card_index: int
    device_index: int
    interface_type: str  # "interface" (ENA) or "efa-only"

    @property
    def is_efa(self) -> bool:
        return self.interface_type in ("efa", "efa-only")


def efa_layout(instance: InstanceSpec) -> list[InterfaceSlot]:
    """Interfaces for `instance`, as the EC2 user guide lays them out for EFA on instances with
    one or more network cards (efa-acc-inst-types, "Maximize network bandwidth on Amazon EC2
    instances with multiple network cards"):

    - card 0, device 0: the primary interface, ENA (an EFA-only interface cannot be primary);
    - card 0, device 1: EFA-only, since card 0 supports EFA;
    - every further card i, device 0: EFA-only.

    That gives one EFA device per network card (P5/P5e: 32, trn1: 8) and one IP address per
    instance, which keeps large fleets from exhausting the subnet.
    """
    if not instance.efa_supported:
        raise ValueError(f"{instance.name} has no EFA")
    slots = [InterfaceSlot(0, 0, "interface"), InterfaceSlot(0, 1, "efa-only")]
    slots += [InterfaceSlot(card, 0, "efa-only") for card in range(1, instance.network_cards)]
    return slots


@dataclass(frozen=True)
class CapacityReservation:
    reservation_id: str
    # "odcr" or "capacity-block"
    kind: str


class EfaLaunchTemplate(Construct):
    """Launch template for EFA training nodes.

    Attributes: `launch_template` (the L1 resource), `efa_interface_count`.
    The launch template is L1 because the L2 `ec2.LaunchTemplate` cannot express network
    interfaces with network card indexes.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance: InstanceSpec,
        efa_security_group: ec2.ISecurityGroup,
        node_security_group: ec2.ISecurityGroup,
        root_volume_gib: int,
        capacity_reservation: CapacityReservation | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        slots = efa_layout(instance)
        self.efa_interface_count = sum(slot.is_efa for slot in slots)

        interfaces = [
            ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                network_card_index=slot.network_card_index,
                device_index=slot.device_index,
                interface_type=slot.interface_type,
                groups=[efa_security_group.security_group_id if slot.is_efa else node_security_group.security_group_id],
                delete_on_termination=True,
            )
            for slot in slots
        ]

        reservation_spec = None
        market_options = None
        if capacity_reservation:
            reservation_spec = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=capacity_reservation.reservation_id
                )
            )
            if capacity_reservation.kind == "capacity-block":
                # Capacity Blocks are launched with market type capacity-block (EC2 user guide,
                # capacity-blocks-launch).
                market_options = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")

        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "Resource",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                network_interfaces=interfaces,
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_tokens="required",
                    http_endpoint="enabled",
                    # 1: containers in their own network namespace cannot reach the instance
                    # role; jobs use their job role instead.
                    http_put_response_hop_limit=1,
                ),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name=ROOT_DEVICE,
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=root_volume_gib,
                            volume_type="gp3",
                            encrypted=True,
                            delete_on_termination=True,
                        ),
                    )
                ],
                capacity_reservation_specification=reservation_spec,
                instance_market_options=market_options,
            ),
        )
