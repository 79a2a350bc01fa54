"""An AWS ParallelCluster (Slurm) cluster through ParallelCluster's own CloudFormation custom
resource: the provider as a nested stack of a pinned release, and a Custom::PclusterCluster."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, CfnResource, Fn, RemovalPolicy
from aws_cdk import aws_cloudformation as cloudformation
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from config.settings import ParallelClusterSettings
from training_constructs.cluster_config import PCLUSTER_VERSION, ClusterInputs, cluster_configuration

PYXIS_SCRIPT = Path(__file__).resolve().parent / "pcluster" / "enable_pyxis.sh"
# The provider template AWS publishes for each release (ParallelCluster user guide,
# "AWS CloudFormation custom resource").
PROVIDER_TEMPLATE = (
    "https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
    f"/parallelcluster/{PCLUSTER_VERSION}/templates/custom_resource/cluster.yaml"
)


class TrainingCluster(Construct):
    """Attributes: `cluster` (the Custom::PclusterCluster L1), `provider` (nested stack),
    `configuration` (the ClusterConfiguration as passed, tokens included)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        settings: ParallelClusterSettings,
        subnet_id: str,
        dataset_bucket: str,
        checkpoint_bucket: str,
        log_retention_days: int,
        root_volume_gib: int,
    ) -> None:
        super().__init__(scope, construct_id)
        script = s3_assets.Asset(self, "EnablePyxis", path=str(PYXIS_SCRIPT))
        inputs = ClusterInputs(
            partition=Aws.PARTITION,
            subnet_id=subnet_id,
            dataset_bucket=dataset_bucket,
            checkpoint_bucket=checkpoint_bucket,
            pyxis_script_url=script.s3_object_url,
            script_bucket=script.s3_bucket_name,
        )
        self.configuration = cluster_configuration(
            settings, inputs, log_retention_days=log_retention_days, root_volume_gib=root_volume_gib
        )
        self.provider = cloudformation.CfnStack(
            self, "Provider", template_url=Fn.sub(PROVIDER_TEMPLATE), timeout_in_minutes=30
        )
        self.cluster = CfnResource(
            self,
            "Cluster",
            type="Custom::PclusterCluster",
            properties={
                "ServiceToken": self.provider.get_att("Outputs.ServiceToken").to_string(),
                "ClusterName": cluster_name,
                # The provider's own default is Delete; say it explicitly either way.
                "DeletionPolicy": settings.deletion_policy,
                "ClusterConfiguration": self.configuration,
            },
        )
        # Keep CloudFormation's view in step: with Retain, removing the resource never calls the
        # provider's delete at all.
        self.cluster.apply_removal_policy(
            RemovalPolicy.RETAIN if settings.deletion_policy == "Retain" else RemovalPolicy.DESTROY
        )
