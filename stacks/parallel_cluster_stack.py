from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ecr as ecr
from constructs import Construct

from config.settings import ParallelClusterSettings
from stacks.data_stack import ExportedBucket
from training_constructs.cluster.training_cluster import TrainingCluster
from training_constructs.images.image_repositories import image_repository_arns
from training_constructs.network.az_subnet import slurm_subnet
from training_constructs.network.training_network import TrainingNetwork

# Stable, and different from the stack name (the provider refuses a cluster named like its stack).
CLUSTER_NAME = "training-slurm"


class ParallelClusterStack(Stack):
    """Optional Slurm cluster for large fleets, with FSx for Lustre in front of the data buckets.

    Stateful (a running cluster, a file system): termination protection, and the cluster and file
    system are retained by default when the stack goes.
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
        settings: ParallelClusterSettings,
        log_retention_days: int,
        root_volume_gib: int,
        availability_zone: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, termination_protection=True, **kwargs)
        subnet, self.subnet = slurm_subnet(self, network=network, availability_zone=availability_zone)
        subnet_id = subnet.subnet_id
        dataset_bucket = datasets.bucket(self, "Datasets")
        checkpoint_bucket = checkpoints.bucket(self, "Checkpoints")
        self.cluster = TrainingCluster(
            self,
            "Slurm",
            cluster_name=CLUSTER_NAME,
            settings=settings,
            subnet_id=subnet_id,
            dataset_bucket=dataset_bucket,
            checkpoint_bucket=checkpoint_bucket,
            image_repositories=image_repository_arns(self, team_repository),
            log_retention_days=log_retention_days,
            root_volume_gib=root_volume_gib,
        )
        CfnOutput(self, "ClusterName", value=CLUSTER_NAME)
        # Attributes the provider returns for the cluster (flattened describe-cluster output).
        CfnOutput(self, "HeadNodeInstanceId", value=self.cluster.cluster.get_att("headNode.instanceId").to_string())
