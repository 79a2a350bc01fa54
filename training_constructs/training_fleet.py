"""One profile's Batch compute: EFA launch template, cluster placement group and a managed,
on-demand, scale-to-zero EC2 compute environment for multi-node parallel jobs."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Annotations, Validations
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from constructs import Construct

from config.catalog import AcceleratorKind, InstanceSpec
from training_constructs.efa_launch_template import CapacityReservation, EfaLaunchTemplate

# Batch image types (API_Ec2Configuration). There is no Neuron image type: Trainium nodes use the
# ECS-optimized AL2023 Neuron AMI through imageIdOverride.
NVIDIA_IMAGE_TYPE = "ECS_AL2023_NVIDIA"
NEURON_IMAGE_TYPE = "ECS_AL2023"
ECS_INSTANCE_POLICY = "service-role/AmazonEC2ContainerServiceforEC2Role"


class TrainingFleet(Construct):
    """Compute for one training profile.

    Attributes: `compute_environment` (L1), `launch_template` (EfaLaunchTemplate),
    `placement_group` (None when a capacity reservation rules it out), `instance_role`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance: InstanceSpec,
        max_nodes: int,
        subnet: ec2.ISubnet,
        efa_security_group: ec2.ISecurityGroup,
        node_security_group: ec2.ISecurityGroup,
        root_volume_gib: int,
        capacity_reservation: CapacityReservation | None = None,
    ) -> None:
        super().__init__(scope, construct_id)

        self.launch_template = EfaLaunchTemplate(
            self,
            "LaunchTemplate",
            instance=instance,
            efa_security_group=efa_security_group,
            node_security_group=node_security_group,
            root_volume_gib=root_volume_gib,
            capacity_reservation=capacity_reservation,
        )

        self.placement_group: ec2.PlacementGroup | None = None
        if capacity_reservation:
            # Targeted ODCRs and Capacity Blocks place instances where the reservation is; adding a
            # cluster placement group on top makes launches fail with capacity errors.
            Annotations.of(self).add_warning_v2(
                "training:placement-group-omitted",
                f"{instance.name}: no cluster placement group, because capacity reservation "
                f"{capacity_reservation.reservation_id} ({capacity_reservation.kind}) decides placement",
            )
        else:
            self.placement_group = ec2.PlacementGroup(
                self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
            )

        self.instance_role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"Batch ECS container instances ({instance.name})",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(ECS_INSTANCE_POLICY)],
        )
        Validations.of(self.instance_role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{ECS_INSTANCE_POLICY}]",
                reason="AWS's managed policy for ECS container instances: what the ECS agent needs to register, "
                "pull images and ship logs, kept current by AWS as the agent changes",
            )
        )
        instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.instance_role)

        # L1 on purpose: the L2 ManagedEc2EcsComputeEnvironment always renders securityGroupIds,
        # and AWS Batch refuses compute-environment security groups together with launch-template
        # network interfaces (aws/aws-cdk#21577). The interfaces carry the groups instead.
        self.compute_environment = batch.CfnComputeEnvironment(
            self,
            "Resource",
            type="MANAGED",
            state="ENABLED",
            compute_resources=batch.CfnComputeEnvironment.ComputeResourcesProperty(
                # On-demand EC2: multi-node parallel jobs run neither on Spot nor on Fargate.
                type="EC2",
                allocation_strategy="BEST_FIT_PROGRESSIVE",
                instance_types=[instance.name],
                minv_cpus=0,
                desiredv_cpus=0,
                maxv_cpus=max_nodes * instance.vcpus,
                subnets=[subnet.subnet_id],
                instance_role=instance_profile.instance_profile_arn,
                placement_group=self.placement_group.placement_group_name if self.placement_group else None,
                launch_template=batch.CfnComputeEnvironment.LaunchTemplateSpecificationProperty(
                    launch_template_id=self.launch_template.launch_template.ref,
                    version=self.launch_template.launch_template.attr_latest_version_number,
                ),
                ec2_configuration=[_image(self, instance)],
            ),
        )

    @property
    def compute_environment_arn(self) -> str:
        return self.compute_environment.attr_compute_environment_arn


def _image(scope: Construct, instance: InstanceSpec) -> batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty:
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        # SSM parameter of the ECS-optimized AL2023 Neuron AMI, resolved by CloudFormation at deploy.
        ami = ecs.EcsOptimizedImage.amazon_linux2023(ecs.AmiHardwareType.NEURON).get_image(scope).image_id
        return batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty(
            image_type=NEURON_IMAGE_TYPE, image_id_override=ami
        )
    return batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty(image_type=NVIDIA_IMAGE_TYPE)
