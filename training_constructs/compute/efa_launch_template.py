"""A launch template that attaches every EFA interface an instance type has, on the network cards
that support EFA, and leaves room on network card 0 for the Batch job's own network interface."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Aws, Fn
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from config import limits
from config.catalog import AcceleratorKind, InstanceSpec
from config.settings import CapacityReservation, RootVolume
from training_constructs.common.node_files import NodeFile, write_packed_files
from training_constructs.health.node_recovery import node_recovery_commands
from training_constructs.observability.node_metrics import node_metrics_commands, node_metrics_files

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
# IMDS hop limit per fleet kind. 1 keeps bridge-mode containers off the instance role on GPU nodes.
# Neuron nodes take AWS's own Neuron Batch launch template's 5 (aws-neuron-samples, torch-neuronx
# training aws-batch llama2 templates: HttpPutResponseHopLimit 5). Neither opens IMDS to the awsvpc
# job containers: ECS_AWSVPC_BLOCK_IMDS does that, and the job preflight proves the Neuron tools work
# without it (README, "Verify a new fleet").
HOP_LIMIT = {AcceleratorKind.NVIDIA_GPU: 1, AcceleratorKind.NEURON: 5}


@dataclass(frozen=True)
class InterfaceSlot:
    network_card_index: int
    device_index: int
    interface_type: str | None  # "efa": EFA with ENA; None: ENA only (EC2's default type)
    primary: bool

    @property
    def is_efa(self) -> bool:
        return self.interface_type == "efa"


def efa_layout(instance: InstanceSpec) -> list[InterfaceSlot]:
    """One `efa` interface (EFA with ENA) at device index 0 of every network card that supports
    EFA; the interface at card 0, device index 0 is the instance's primary interface.

    Where card 0 supports EFA (every type but p6-b300 here) this is the layout of AWS's own Batch
    templates for P5 and P6 (awslabs/awsome-distributed-training, 1.architectures/3.aws-batch).
    Where it does not (`InstanceSpec.efa_cards`), card 0 gets an ENA-only primary interface and the
    EFA interfaces go on the other cards: the interface types the pinned aws-parallelcluster renders
    for such types with its `EfaInterfaceType: efa` setting (templates/queues_stack.py: type unset,
    i.e. ENA, on card 0 when card 0 has no EFA; `efa` on every other card, there at device index 1
    where a card takes more than one interface; device index 0 here, as on every other type, the
    Batch templates' choice). No public source
    shows Batch accepting `efa-only` interfaces, so none are used. Card 0 then holds one interface
    and keeps room for the task ENI even where it takes only two (p5, p5e, trn2).
    """
    if not instance.efa_supported:
        raise ValueError(f"{instance.name} has no EFA")
    efa_cards = instance.efa_cards
    slots = [] if 0 in efa_cards else [InterfaceSlot(0, 0, None, True)]
    slots += [InterfaceSlot(card, 0, "efa", card == 0) for card in efa_cards]
    on_card_0 = sum(slot.network_card_index == 0 for slot in slots)
    if on_card_0 + TASK_ENIS > instance.card_interfaces[0]:
        raise ValueError(f"{instance.name}: network card 0 takes {instance.card_interfaces[0]} interfaces")
    if len(slots) != instance.node_interfaces:
        raise ValueError(f"{instance.name}: {len(slots)} interfaces laid out, {instance.node_interfaces} counted")
    return slots


def ecs_agent_user_data(files: Sequence[NodeFile], *command_groups: Sequence[str]) -> str:
    """MIME multi-part user data that appends the agent settings to /etc/ecs/ecs.config, writes every
    node file with one command (one gzip stream: training_constructs/common/node_files.py), then runs
    each group of commands in order: the host check first (a node that fails it never registers),
    then node metrics (the one package installed at boot, see training_constructs.observability.node_metrics),
    then node recovery (training_constructs.health.node_recovery)."""
    script = ec2.UserData.for_linux()
    script.add_commands(*(f"echo {setting} >> /etc/ecs/ecs.config" for setting in ECS_AGENT_SETTINGS))
    if files:
        script.add_commands(write_packed_files(files))
    for commands in command_groups:
        script.add_commands(*commands)
    multipart = ec2.MultipartUserData()
    # A plain-text part, as in the Batch user guide's launch template example: a base64 part would
    # cost a third more of the 16 KB (training_constructs/common/node_files.py).
    multipart.add_part(
        ec2.MultipartBody.from_raw_body(content_type='text/x-shellscript; charset="utf-8"', body=script.render())
    )
    return multipart.render()


class EfaLaunchTemplate(Construct):
    """Launch template for EFA training nodes.

    Attributes: `launch_template` (the L1 resource), `efa_interface_count`.
    The launch template is L1 because the L2 `ec2.LaunchTemplate` cannot express network
    interfaces with network card indexes.

    By default the nodes are Batch's ECS hosts: the user data configures the ECS agent, writes
    `boot_files` with the host metrics' files, and runs `boot_commands`, the host metrics and node
    recovery. `user_data` (MIME multi-part) replaces all
    of that for nodes that are not ECS hosts (PCS), and `placement_group` puts the placement in the
    template itself, where a service takes it from there (PCS user guide, "Create or update an EC2
    launch template" for EFA); Batch takes its placement group from the compute environment instead.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance: InstanceSpec,
        fleet_name: str,
        efa_security_group: ec2.ISecurityGroup,
        node_security_group: ec2.ISecurityGroup,
        root_volume: RootVolume,
        capacity_reservation: CapacityReservation | None = None,
        boot_commands: Sequence[str] = (),
        boot_files: Sequence[NodeFile] = (),
        user_data: str | None = None,
        placement_group: ec2.IPlacementGroup | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        slots = efa_layout(instance)
        gpu = instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU
        self.efa_interface_count = sum(slot.is_efa for slot in slots)

        def groups(slot: InterfaceSlot) -> list[str]:
            # Every interface carries the EFA group; the primary one also carries the host's own
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
                    http_put_response_hop_limit=HOP_LIMIT[instance.accelerator_kind],
                ),
                user_data=Fn.base64(
                    user_data
                    or ecs_agent_user_data(
                        [*boot_files, *node_metrics_files(fleet=fleet_name, gpu=gpu)],
                        boot_commands,
                        node_metrics_commands(fleet=fleet_name, gpu=gpu),
                        node_recovery_commands(region=Aws.REGION, url_suffix=Aws.URL_SUFFIX),
                    )
                ),
                placement=(
                    ec2.CfnLaunchTemplate.PlacementProperty(group_name=placement_group.placement_group_name)
                    if placement_group
                    else None
                ),
                # A node that fails its boot check, or finds a node fault during a job, powers itself
                # off: terminate it rather than keep a stopped instance (training_constructs/health/host_check.py,
                # training_constructs/health/node_recovery.py).
                instance_initiated_shutdown_behavior="terminate",
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
