from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ecr as ecr
from constructs import Construct

from config.settings import PcsSettings, RootVolume
from stacks.data_stack import ExportedBucket
from training_constructs.cluster.pcs_cluster import PcsCluster
from training_constructs.images.image_repositories import image_repository_arns
from training_constructs.network.az_subnet import slurm_subnet
from training_constructs.network.training_network import TrainingNetwork

# Stable: people type it (aws pcs get-cluster --cluster-identifier training-slurm). The two Slurm
# options never exist together, so ParallelCluster's name is free.
CLUSTER_NAME = "training-slurm"


class PcsStack(Stack):
    """Optional managed Slurm cluster on AWS Parallel Computing Service (`-c slurm=pcs`), with FSx for
    Lustre in front of the data buckets.

    Stateful (accounting records, a file system): termination protection, and the cluster and file
    system are retained when the stack goes.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        network: TrainingNetwork,
        datasets: ExportedBucket,
        checkpoints: ExportedBucket,
        team_repository: ecr.IRepository,
        settings: PcsSettings,
        fsx_capacity_gib: int,
        fsx_throughput: int,
        root_volume: RootVolume,
        availability_zone: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, termination_protection=True, **kwargs)
        subnet, self.subnet = slurm_subnet(self, network=network, availability_zone=availability_zone)
        self.cluster = PcsCluster(
            self,
            "Slurm",
            cluster_name=CLUSTER_NAME,
            settings=settings,
            vpc=network.vpc,
            subnet=subnet,
            node_security_group=network.node_security_group,
            dataset_bucket=datasets.bucket(self, "Datasets"),
            checkpoint_bucket=checkpoints.bucket(self, "Checkpoints"),
            image_repositories=image_repository_arns(self, team_repository),
            fsx_capacity_gib=fsx_capacity_gib,
            fsx_throughput=fsx_throughput,
            root_volume=root_volume,
        )
        CfnOutput(self, "ClusterName", value=CLUSTER_NAME)
        CfnOutput(self, "ClusterId", value=self.cluster.cluster.attr_id)
        CfnOutput(self, "QueueName", value=",".join(self.cluster.queues))
        CfnOutput(self, "LoginNodeGroupId", value=self.cluster.login.node_group.attr_id)
