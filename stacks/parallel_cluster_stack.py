from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from config.settings import ParallelClusterSettings
from stacks.data_stack import ExportedBucket
from training_constructs.cluster.training_cluster import TrainingCluster
from training_constructs.network.az_subnet import SLURM_OFFSET, AzSubnet
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
        settings: ParallelClusterSettings,
        log_retention_days: int,
        root_volume_gib: int,
        availability_zone: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, termination_protection=True, **kwargs)
        # The network's first training subnet, or a subnet of the cluster's own in the named AZ: one in
        # the compute stack would come and go with the fleets there, under this stack's import.
        subnet_id = network.training_subnet.subnet_id
        if availability_zone:
            self.subnet: AzSubnet | None = AzSubnet(
                Construct(self, "Subnets"),
                vpc_id=network.vpc.vpc_id,
                route_table_id=network.training_route_table_id,
                availability_zone=availability_zone,
                offset=SLURM_OFFSET,
            )
            subnet_id = self.subnet.subnet.subnet_id
        else:
            self.subnet = None
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
            log_retention_days=log_retention_days,
            root_volume_gib=root_volume_gib,
        )
        CfnOutput(self, "ClusterName", value=CLUSTER_NAME)
        # Attributes the provider returns for the cluster (flattened describe-cluster output).
        CfnOutput(self, "HeadNodeInstanceId", value=self.cluster.cluster.get_att("headNode.instanceId").to_string())
