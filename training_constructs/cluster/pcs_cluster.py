"""A managed Slurm cluster on AWS Parallel Computing Service (PCS): the controller (Slurm accounting
on), a login node group, one compute node group and queue per Slurm fleet, the nodes' role, and the
shared FSx for Lustre file system.

CDK has no L2 construct for AWS PCS: the cluster, node groups and queues are the L1 classes of
aws_cdk.aws_pcs. Their properties follow the AWS::PCS::* resource schemas cfn-lint ships.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, RemovalPolicy, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_pcs as pcs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from config import pcs as pcs_facts
from config.settings import PcsSettings, RootVolume
from training_constructs.cluster.cluster_config import SCALEDOWN_IDLE_MINUTES, queue_name
from training_constructs.cluster.lustre_file_system import SharedLustre
from training_constructs.cluster.pcs_node_groups import PcsComputeNodes, PcsLoginNodes, pcs_user_data
from training_constructs.cluster.training_cluster import ECR_PULL_ACTIONS
from training_constructs.common.nag_names import nag_name

SSM_POLICY = "AmazonSSMManagedInstanceCore"


class PcsCluster(Construct):
    """Attributes: `cluster` (L1), `security_group`, `node_role`, `instance_profile`, `storage`
    (SharedLustre), `login` (PcsLoginNodes), `compute` and `queues` (by queue name, one per type)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        settings: PcsSettings,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        node_security_group: ec2.ISecurityGroup,
        dataset_bucket: s3.IBucket,
        checkpoint_bucket: s3.IBucket,
        image_repositories: Sequence[str],
        fsx_capacity_gib: int,
        fsx_throughput: int,
        root_volume: RootVolume,
    ) -> None:
        super().__init__(scope, construct_id)
        # One group for the controller's interface, every node interface and the file system: Slurm
        # (slurmctld, slurmd, slurmdbd), EFA and Lustre all need traffic between members (CloudFormation
        # reference, AWS::PCS::Cluster Networking.SecurityGroupIds, its required rules; PCS user guide,
        # "Create a basic launch template"; EC2 user guide, EFA security group; FSx for Lustre user
        # guide, "File system access control with Amazon VPC"). Nothing else gets in or out through it.
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="Slurm cluster: all traffic between members (controller, nodes, EFA, FSx for Lustre)",
            allow_all_outbound=False,
        )
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "from cluster members")
        self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(), "to cluster members")
        self.node_role, self.instance_profile = self._node_identity(
            dataset_bucket, checkpoint_bucket, image_repositories
        )
        self.storage = SharedLustre(
            self,
            "Storage",
            vpc=vpc,
            subnet=subnet,
            security_group=self.security_group,
            capacity_gib=fsx_capacity_gib,
            throughput=fsx_throughput,
            dataset_bucket=dataset_bucket,
            checkpoint_bucket=checkpoint_bucket,
        )
        self.cluster = pcs.CfnCluster(
            self,
            "Cluster",
            name=cluster_name,
            scheduler=pcs.CfnCluster.SchedulerProperty(type="SLURM", version=pcs_facts.SLURM_VERSION),
            size=pcs_facts.cluster_size(settings.cluster_nodes),
            # PCS takes one subnet for the controller (AWS::PCS::Cluster schema, Networking.SubnetIds).
            networking=pcs.CfnCluster.NetworkingProperty(
                subnet_ids=[subnet.subnet_id], security_group_ids=[self.security_group.security_group_id]
            ),
            slurm_configuration=pcs.CfnCluster.SlurmConfigurationProperty(
                scale_down_idle_time_in_seconds=SCALEDOWN_IDLE_MINUTES * 60,
                # Accounting (sacct, limits) needs Slurm 24.11 or later, costs extra, and is chosen when
                # the cluster is created (PCS user guide, "Slurm accounting in AWS PCS"); records older
                # than the purge time are deleted (PCS API reference, Accounting).
                accounting=pcs.CfnCluster.AccountingProperty(
                    mode="STANDARD", default_purge_time_in_days=settings.accounting_purge_days
                ),
            ),
        )
        # PCS needs the subnet and the security group, rules included, before it creates the
        # controller (PCS API reference, CreateCluster). The group and subnet are references already;
        # the rules are resources of their own.
        for rule in self.security_group.node.children:
            if isinstance(rule, ec2.CfnSecurityGroupIngress | ec2.CfnSecurityGroupEgress):
                self.cluster.add_resource_dependency(rule)
        # Accounting records live in the cluster: deleting the stack keeps it (docs/slurm.md).
        self.cluster.apply_removal_policy(RemovalPolicy.RETAIN)
        cluster_id = self.cluster.attr_id
        user_data = pcs_user_data(self.storage.mount_commands())
        self.login = PcsLoginNodes(
            self,
            "Login",
            cluster_id=cluster_id,
            instance_type=settings.login_instance_type,
            subnet=subnet,
            cluster_security_group=self.security_group,
            node_security_group=node_security_group,
            instance_profile_arn=self.instance_profile.instance_profile_arn,
            ami_id=settings.ami_id,
            user_data=user_data,
        )
        self.compute: dict[str, PcsComputeNodes] = {}
        self.queues: dict[str, pcs.CfnQueue] = {}
        for instance in settings.instances:
            # The queue (Slurm partition) and node group take ParallelCluster's queue name for the
            # type, so that the same sbatch line works on both Slurm options.
            name = queue_name(instance)
            construct = "".join(part.capitalize() for part in name.split("-"))
            nodes = PcsComputeNodes(
                self,
                construct,
                cluster_id=cluster_id,
                name=name,
                instance=instance,
                max_nodes=settings.max_nodes,
                subnet=subnet,
                cluster_security_group=self.security_group,
                node_security_group=node_security_group,
                instance_profile_arn=self.instance_profile.instance_profile_arn,
                ami_id=settings.ami_id,
                root_volume=root_volume,
                user_data=user_data,
            )
            self.compute[name] = nodes
            self.queues[name] = pcs.CfnQueue(
                self,
                f"{construct}Queue",
                cluster_id=cluster_id,
                name=name,
                compute_node_group_configurations=[
                    pcs.CfnQueue.ComputeNodeGroupConfigurationProperty(compute_node_group_id=nodes.node_group.attr_id)
                ],
            )

    def _node_identity(
        self, dataset_bucket: s3.IBucket, checkpoint_bucket: s3.IBucket, image_repositories: Sequence[str]
    ) -> tuple[iam.Role, iam.InstanceProfile]:
        """The nodes' role: registration with the cluster, Session Manager, the data buckets (datasets
        read, checkpoints read and written, nothing deleted) and image pulls from this deployment's ECR
        repositories (image_repositories.py)."""
        stack = Stack.of(self)
        role = iam.Role(
            self,
            "NodeRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            # The role of a PCS instance profile is named AWSPCS... or sits under /aws-pcs/; CDK names
            # the role, so the path it is (PCS user guide, "Create an instance profile for AWS PCS").
            path=pcs_facts.NODE_ROLE_PATH,
            description="PCS nodes: join the cluster, Session Manager, data buckets, ECR pulls",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name(pcs_facts.NODE_POLICY),
                iam.ManagedPolicy.from_aws_managed_policy_name(SSM_POLICY),
            ],
        )
        dataset_bucket.grant_read(role)
        checkpoint_bucket.grant_read(role)
        checkpoint_bucket.grant_put(role)
        # GetAuthorizationToken has no resource to scope to (ECR API reference).
        role.add_to_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        role.add_to_policy(iam.PolicyStatement(actions=ECR_PULL_ACTIONS, resources=list(image_repositories)))
        for policy in (pcs_facts.NODE_POLICY, SSM_POLICY):
            finding = f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]"
            reason = f"AWS's managed {policy}: what PCS and Session Manager document for their nodes"
            Validations.of(role).acknowledge(Acknowledgment(id=finding, reason=reason))
        findings = {
            "Action::s3:GetObject*": "read the dataset and checkpoint buckets only",
            "Action::s3:GetBucket*": "read the dataset and checkpoint buckets only",
            "Action::s3:List*": "list the dataset and checkpoint buckets only",
            "Action::s3:Abort*": "multi-part checkpoint uploads to the checkpoint bucket only",
            "Resource::*": "ecr:GetAuthorizationToken cannot be scoped to a resource",
            f"Resource::{nag_name(stack, dataset_bucket.arn_for_objects('*'))}": "objects of the dataset bucket",
            f"Resource::{nag_name(stack, checkpoint_bucket.arn_for_objects('*'))}": "objects of the checkpoint bucket",
        }
        policy = role.node.find_child("DefaultPolicy")
        for finding, reason in findings.items():
            Validations.of(policy).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
        profile = iam.InstanceProfile(self, "InstanceProfile", role=role)
        return role, profile
