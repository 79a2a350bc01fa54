"""PCS compute node groups: one per Slurm fleet (an EFA instance type) and a small login group.

CDK has no L2 construct for AWS PCS: these are the L1 classes of aws_cdk.aws_pcs.
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_pcs as pcs
from constructs import Construct

from config.catalog import InstanceSpec
from config.pcs import LOGIN_NODES
from config.settings import RootVolume
from training_constructs.compute.efa_launch_template import ROOT_DEVICE, EfaLaunchTemplate

# Login nodes hold no images or data of their own (/fsx is shared): a small encrypted root volume.
LOGIN_ROOT_GIB = 100


def pcs_user_data(commands: list[str]) -> str:
    """User data PCS accepts: a MIME multi-part archive, because PCS merges it with its own; a
    text/x-shellscript part runs after the node registers with PCS and before slurmd starts (PCS user
    guide, "Working with Amazon EC2 user data")."""
    script = ec2.UserData.for_linux()
    script.add_commands("set -euo pipefail", *commands)
    multipart = ec2.MultipartUserData()
    multipart.add_part(
        ec2.MultipartBody.from_raw_body(content_type='text/x-shellscript; charset="us-ascii"', body=script.render())
    )
    return multipart.render()


class PcsComputeNodes(Construct):
    """Compute nodes of one instance type for multi-node jobs: the fleets' EFA launch template (an
    `efa` interface on every card that has EFA, the cluster's security group on each interface), a
    cluster placement group in the template (PCS user guide, "Placement groups for EC2 instances in
    AWS PCS": recommended with EFA), one subnet (EFA does not cross AZs: EC2 user guide, EFA
    limitations), 0..max_nodes on demand.

    Attributes: `node_group` (L1), `launch_template` (EfaLaunchTemplate), `placement_group`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_id: str,
        name: str,
        instance: InstanceSpec,
        max_nodes: int,
        subnet: ec2.ISubnet,
        cluster_security_group: ec2.ISecurityGroup,
        node_security_group: ec2.ISecurityGroup,
        instance_profile_arn: str,
        ami_id: str,
        root_volume: RootVolume,
        user_data: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.placement_group = ec2.PlacementGroup(self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
        self.launch_template = EfaLaunchTemplate(
            self,
            "LaunchTemplate",
            instance=instance,
            fleet_name=name,
            # Slurm and EFA traffic share the cluster's group, which allows all traffic within itself.
            efa_security_group=cluster_security_group,
            node_security_group=node_security_group,
            root_volume=root_volume,
            user_data=user_data,
            placement_group=self.placement_group,
        )
        template = self.launch_template.launch_template
        self.node_group = pcs.CfnComputeNodeGroup(
            self,
            "Resource",
            cluster_id=cluster_id,
            name=name,
            ami_id=ami_id,
            custom_launch_template=pcs.CfnComputeNodeGroup.CustomLaunchTemplateProperty(
                template_id=template.ref, version=template.attr_latest_version_number
            ),
            iam_instance_profile_arn=instance_profile_arn,
            instance_configs=[pcs.CfnComputeNodeGroup.InstanceConfigProperty(instance_type=instance.name)],
            # Idle costs nothing: nodes start for jobs and stop after the cluster's idle time.
            scaling_configuration=pcs.CfnComputeNodeGroup.ScalingConfigurationProperty(
                min_instance_count=0, max_instance_count=max_nodes
            ),
            subnet_ids=[subnet.subnet_id],
            purchase_option="ONDEMAND",
        )


class PcsLoginNodes(Construct):
    """Always-on login nodes (config.pcs.LOGIN_NODES) for `sbatch`, `squeue` and `sacct`, reached with
    SSM Session Manager: the cluster's and the nodes' security groups, IMDSv2, an encrypted root volume.

    Attributes: `node_group` (L1), `launch_template` (ec2.LaunchTemplate).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_id: str,
        instance_type: str,
        subnet: ec2.ISubnet,
        cluster_security_group: ec2.ISecurityGroup,
        node_security_group: ec2.ISecurityGroup,
        instance_profile_arn: str,
        ami_id: str,
        user_data: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            security_group=cluster_security_group,
            require_imdsv2=True,
            user_data=ec2.UserData.custom(user_data),
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        LOGIN_ROOT_GIB, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True
                    ),
                )
            ],
        )
        self.launch_template.add_security_group(node_security_group)
        self.node_group = pcs.CfnComputeNodeGroup(
            self,
            "Resource",
            cluster_id=cluster_id,
            name="login",
            ami_id=ami_id,
            custom_launch_template=pcs.CfnComputeNodeGroup.CustomLaunchTemplateProperty(
                template_id=self.launch_template.launch_template_id or "",
                version=self.launch_template.latest_version_number,
            ),
            iam_instance_profile_arn=instance_profile_arn,
            instance_configs=[pcs.CfnComputeNodeGroup.InstanceConfigProperty(instance_type=instance_type)],
            scaling_configuration=pcs.CfnComputeNodeGroup.ScalingConfigurationProperty(
                min_instance_count=LOGIN_NODES, max_instance_count=LOGIN_NODES
            ),
            subnet_ids=[subnet.subnet_id],
            purchase_option="ONDEMAND",
        )
