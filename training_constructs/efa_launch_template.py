"""A launch template that attaches every EFA interface an instance type has, and leaves room on
network card 0 for the Batch job's own network interface."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from config import limits
from config.catalog import InstanceSpec
from config.settings import CapacityReservation, RootVolume

# Root device of the ECS-optimized Amazon Linux 2023 AMIs.
ROOT_DEVICE = "/dev/xvda"
# Batch multi-node containers run in awsvpc mode: ECS attaches one task ENI per job container to
# the host (Batch user guide, "Multi-node parallel jobs" / networking), on network card 0.
TASK_ENIS = limits.TASK_ENIS_PER_NODE
# The ECS agent blocks instance metadata for awsvpc tasks only with this setting (ECS developer
# guide, "Amazon ECS container agent configuration", ECS_AWSVPC_BLOCK_IMDS); the IMDS hop limit
# does not stop them. Batch merges MIME multi-part user data from the launch template with its
# own (Batch user guide, "Launch template support").
# A stop (job timeout, terminate, compute-environment update) is SIGTERM, then SIGKILL after
# ECS_CONTAINER_STOP_TIMEOUT (a Go duration; default 30s: ECS developer guide, "Amazon ECS container
# agent configuration", and ECS API StopTask). Batch ContainerProperties has no per-container stop
# timeout. The launcher's last checkpoint upload needs more than 30 s for multi-GB files; it exits
# as soon as that upload is done, so the longer limit only binds a container that hangs.
CONTAINER_STOP_TIMEOUT = "10m"
ECS_AGENT_SETTINGS = ("ECS_AWSVPC_BLOCK_IMDS=true", f"ECS_CONTAINER_STOP_TIMEOUT={CONTAINER_STOP_TIMEOUT}")


@dataclass(frozen=True)
class InterfaceSlot:
    network_card_index: int
    device_index: int
    interface_type: str  # "efa": EFA with ENA
    primary: bool


def efa_layout(instance: InstanceSpec) -> list[InterfaceSlot]:
    """One `efa` interface (EFA with ENA) at device index 0 of every network card, the first one
    also the instance's primary interface.

    This is the layout of AWS's own Batch templates for P5 and P6 (awslabs/awsome-distributed-training,
    1.architectures/3.aws-batch). No public source shows Batch accepting `efa-only` interfaces, so
    none are used. Card 0 then holds one interface and keeps room for the task ENI even where it
    takes only two (p5, p5e, trn2: `interfaces_per_card` in the catalog).
    """
    if not instance.efa_supported:
        raise ValueError(f"{instance.name} has no EFA")
    slots = [InterfaceSlot(card, 0, "efa", card == 0) for card in range(instance.network_cards)]
    on_card_0 = sum(slot.network_card_index == 0 for slot in slots)
    if on_card_0 + TASK_ENIS > instance.interfaces_per_card:
        raise ValueError(f"{instance.name}: network card 0 takes {instance.interfaces_per_card} interfaces")
    return slots


def ecs_agent_user_data() -> str:
    """MIME multi-part user data that appends the agent settings to /etc/ecs/ecs.config. Nothing is
    downloaded or installed at boot."""
    script = ec2.UserData.for_linux()
    script.add_commands(*(f"echo {setting} >> /etc/ecs/ecs.config" for setting in ECS_AGENT_SETTINGS))
    multipart = ec2.MultipartUserData()
    multipart.add_part(ec2.MultipartBody.from_user_data(script))
    return multipart.render()


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
        root_volume: RootVolume,
        capacity_reservation: CapacityReservation | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        slots = efa_layout(instance)
        self.efa_interface_count = len(slots)  # every slot is an EFA interface

        def groups(slot: InterfaceSlot) -> list[str]:
            # Every EFA interface carries the EFA group; the primary one also carries the host's own
            # outbound traffic (ECS, ECR, S3, logs) through the node group.
            efa = [efa_security_group.security_group_id]
            return [*efa, node_security_group.security_group_id] if slot.primary else efa

        interfaces = [
            ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                network_card_index=slot.network_card_index,
                device_index=slot.device_index,
                interface_type=slot.interface_type,
                groups=groups(slot),
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
                    # 1 keeps bridge-mode containers off the instance role; awsvpc job containers
                    # are kept off by ECS_AWSVPC_BLOCK_IMDS in the user data.
                    http_put_response_hop_limit=1,
                ),
                user_data=Fn.base64(ecs_agent_user_data()),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name=ROOT_DEVICE,
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=root_volume.size_gib,
                            volume_type="gp3",
                            throughput=root_volume.throughput_mibps,
                            iops=root_volume.iops,
                            encrypted=True,
                            delete_on_termination=True,
                        ),
                    )
                ],
                capacity_reservation_specification=reservation_spec,
                instance_market_options=market_options,
            ),
        )
