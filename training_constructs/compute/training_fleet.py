"""One fleet's Batch compute: EFA launch template, cluster placement group and a managed,
on-demand, scale-to-zero EC2 compute environment for multi-node parallel jobs that AWS Batch
updates in place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Acknowledgment, Annotations, Aws, RemovalPolicy, Validations
from aws_cdk import aws_batch as batch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.catalog import AcceleratorKind, InstanceSpec
from config.metrics import NAMESPACE
from config.settings import CapacityReservation, Placement, RootVolume
from training_constructs.compute.efa_launch_template import EfaLaunchTemplate
from training_constructs.health.host_check import host_check_commands, host_check_files

# Batch image types (API_Ec2Configuration). There is no Neuron image type: Trainium nodes use the
# ECS-optimized AL2023 Neuron AMI through imageIdOverride.
NVIDIA_IMAGE_TYPE = "ECS_AL2023_NVIDIA"
NEURON_IMAGE_TYPE = "ECS_AL2023"
ECS_INSTANCE_POLICY = "service-role/AmazonEC2ContainerServiceforEC2Role"
# Infrastructure updates (new launch template version, instance type, AMI, ...) replace instances
# in place; running jobs keep their old instances for up to this long (API UpdatePolicy: a longer
# timeout delays the replacement but gives jobs more time; default 30). Two hours lets most jobs
# finish or checkpoint, and stays within every documented range (CloudFormation: 1..360).
UPDATE_JOB_TIMEOUT_MINUTES = 120
CONTAINER_INSIGHTS = "enabled"


@dataclass(frozen=True)
class PlacementCompute:
    """One placement's compute path."""

    compute_environment: batch.CfnComputeEnvironment
    launch_template: EfaLaunchTemplate
    placement_group: ec2.PlacementGroup | None
    subnet: ec2.ISubnet

    @property
    def compute_environment_arn(self) -> str:
        return self.compute_environment.attr_compute_environment_arn


class TrainingFleet(Construct):
    """Compute for one fleet.

    Attributes: `compute_environment` (L1), `launch_template` (EfaLaunchTemplate),
    `placement_group` (None when a capacity reservation rules it out), `instance_role`,
    `boot_check_log_group` (the boot-time host check's results), `placements` (PlacementCompute:
    the fleet's own, then one per fallback placement, each under the construct `Fallback<n>`).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance: InstanceSpec,
        fleet_name: str,
        max_nodes: int,
        subnet: ec2.ISubnet,
        efa_security_group: ec2.ISecurityGroup,
        node_security_group: ec2.ISecurityGroup,
        root_volume: RootVolume,
        log_retention: logs.RetentionDays,
        capacity_reservation: CapacityReservation | None = None,
        ami_id: str | None = None,
        fallback: Sequence[tuple[Placement, ec2.ISubnet]] = (),
    ) -> None:
        super().__init__(scope, construct_id)

        # One JSON line per node from the boot-time host check; kept like the job logs.
        self.boot_check_log_group = logs.LogGroup(
            self, "BootCheckLogs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN
        )
        self._fleet_name = fleet_name
        self._security_groups = (efa_security_group, node_security_group)
        self._root_volume = root_volume
        self.launch_template, self.placement_group = self._launch_path(self, instance, capacity_reservation)

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
        self._allow_node_metrics()
        self.boot_check_log_group.grant_write(self.instance_role)
        self._instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.instance_role)
        self.compute_environment = self._environment(
            self, instance, max_nodes, subnet, self.launch_template, self.placement_group, ami_id
        )
        own = PlacementCompute(
            compute_environment=self.compute_environment,
            launch_template=self.launch_template,
            placement_group=self.placement_group,
            subnet=subnet,
        )
        # Each fallback placement: a compute path of its own (same instance role and boot-check log),
        # scaled to zero like the fleet's, in its AZ's subnet (config/placements.py).
        self.placements = [own]
        for number, (placement, placement_subnet) in enumerate(fallback, start=1):
            scope = Construct(self, f"Fallback{number}")
            template, group = self._launch_path(scope, placement.instance, placement.capacity_reservation)
            environment = self._environment(
                scope, placement.instance, max_nodes, placement_subnet, template, group, ami_id
            )
            self.placements.append(PlacementCompute(environment, template, group, placement_subnet))

    def _launch_path(
        self, scope: Construct, instance: InstanceSpec, capacity_reservation: CapacityReservation | None
    ) -> tuple[EfaLaunchTemplate, ec2.PlacementGroup | None]:
        boot_commands = host_check_commands(
            instance=instance,
            fleet=self._fleet_name,
            efa_interfaces=instance.max_efa_interfaces,
            log_group_name=self.boot_check_log_group.log_group_name,
            region=Aws.REGION,
            url_suffix=Aws.URL_SUFFIX,
        )
        launch_template = EfaLaunchTemplate(
            scope,
            "LaunchTemplate",
            instance=instance,
            fleet_name=self._fleet_name,
            efa_security_group=self._security_groups[0],
            node_security_group=self._security_groups[1],
            root_volume=self._root_volume,
            capacity_reservation=capacity_reservation,
            boot_commands=boot_commands,
            boot_files=host_check_files(),
        )
        if capacity_reservation:
            # Targeted ODCRs and Capacity Blocks place instances where the reservation is; adding a
            # cluster placement group on top makes launches fail with capacity errors.
            Annotations.of(scope).add_warning_v2(
                "training:placement-group-omitted",
                f"{instance.name}: no cluster placement group, because capacity reservation "
                f"{capacity_reservation.reservation_id} ({capacity_reservation.kind}) decides placement",
            )
            return launch_template, None
        return launch_template, ec2.PlacementGroup(scope, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)

    def _environment(
        self,
        scope: Construct,
        instance: InstanceSpec,
        max_nodes: int,
        subnet: ec2.ISubnet,
        launch_template: EfaLaunchTemplate,
        placement_group: ec2.PlacementGroup | None,
        ami_id: str | None,
    ) -> batch.CfnComputeEnvironment:
        # L1 on purpose: the L2 ManagedEc2EcsComputeEnvironment always renders securityGroupIds,
        # and AWS Batch refuses compute-environment security groups together with launch-template
        # network interfaces (aws/aws-cdk#21577). The interfaces carry the groups instead.
        ec2_configuration, take_aws_updates = _image(scope, instance, ami_id)
        return batch.CfnComputeEnvironment(
            scope,
            "Resource",
            type="MANAGED",
            state="ENABLED",
            # CloudFormation replaces the environment on most changes unless this is false (new ARN,
            # which the jobs stack's queue imports, so the update would fail on the export). With
            # false, Batch updates the environment in place; that needs BEST_FIT_PROGRESSIVE and the
            # Batch service-linked role, which an environment without ServiceRole uses (CloudFormation
            # AWS::Batch::ComputeEnvironment ReplaceComputeEnvironment; Batch user guide, "Updating
            # compute environments").
            replace_compute_environment=False,
            update_policy=batch.CfnComputeEnvironment.UpdatePolicyProperty(
                terminate_jobs_on_update=False, job_execution_timeout_minutes=UPDATE_JOB_TIMEOUT_MINUTES
            ),
            # Container Insights on the ECS cluster behind the environment (CloudFormation
            # AWS::Batch::ComputeEnvironment EcsSettings.ContainerInsights). Its task and instance
            # metrics exist only while instances run.
            ecs_settings=batch.CfnComputeEnvironment.EcsSettingsProperty(container_insights=CONTAINER_INSIGHTS),
            compute_resources=batch.CfnComputeEnvironment.ComputeResourcesProperty(
                # On-demand EC2: multi-node parallel jobs run neither on Spot nor on Fargate.
                type="EC2",
                allocation_strategy="BEST_FIT_PROGRESSIVE",
                instance_types=[instance.name],
                # No desiredvCpus: Batch refuses to lower it on an existing environment ("Manually
                # scaling down compute environment is not supported"); min 0 scales it to zero.
                minv_cpus=0,
                maxv_cpus=max_nodes * instance.vcpus,
                subnets=[subnet.subnet_id],
                instance_role=self._instance_profile.instance_profile_arn,
                placement_group=placement_group.placement_group_name if placement_group else None,
                launch_template=batch.CfnComputeEnvironment.LaunchTemplateSpecificationProperty(
                    launch_template_id=launch_template.launch_template.ref,
                    version=launch_template.launch_template.attr_latest_version_number,
                ),
                ec2_configuration=[ec2_configuration],
                update_to_latest_image_version=take_aws_updates,
            ),
        )

    def _allow_node_metrics(self) -> None:
        """The node's CloudWatch agent publishes GPU and EFA metrics, in the app's namespace only.
        PutMetricData has no resource-level permissions; the cloudwatch:namespace condition key scopes
        it (CloudWatch user guide, "Using condition keys to limit access to CloudWatch namespaces")."""
        self.instance_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": NAMESPACE}},
            )
        )
        Validations.of(self.instance_role.node.find_child("DefaultPolicy")).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason="cloudwatch:PutMetricData supports no resource ARN; the cloudwatch:namespace "
                f"condition limits it to the {NAMESPACE} namespace",
            )
        )

    @property
    def compute_environment_arn(self) -> str:
        return self.compute_environment.attr_compute_environment_arn


def _image(
    scope: Construct, instance: InstanceSpec, ami_id: str | None
) -> tuple[batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty, bool]:
    """The AMI policy, and whether Batch moves the environment to AWS's newest AMI on its own.

    GPU: Batch's ECS_AL2023_NVIDIA image, and UpdateToLatestImageVersion, so that an infrastructure
    update (any deploy that changes the environment) also takes AWS's current GPU AMI.
    Neuron: no Batch image type exists; the ECS AL2023 Neuron AMI comes from its SSM parameter,
    which CloudFormation re-resolves on every deploy (a new AMI rolls the fleet in place), or from
    the fleet's `amiId`, which holds it until changed.
    """
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        ami = ami_id or ecs.EcsOptimizedImage.amazon_linux2023(ecs.AmiHardwareType.NEURON).get_image(scope).image_id
        config = batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty(
            image_type=NEURON_IMAGE_TYPE, image_id_override=ami
        )
        return config, False
    return batch.CfnComputeEnvironment.Ec2ConfigurationObjectProperty(image_type=NVIDIA_IMAGE_TYPE), True
