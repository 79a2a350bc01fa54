"""An AWS ParallelCluster (Slurm) cluster through ParallelCluster's own CloudFormation custom
resource: the provider as a nested stack of a pinned release, and a Custom::PclusterCluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aws_cdk import Acknowledgment, Annotations, Aws, CfnResource, Fn, RemovalPolicy, Stack, Validations
from aws_cdk import aws_cloudformation as cloudformation
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from config.settings import ParallelClusterSettings
from training_constructs.cluster.cluster_config import PCLUSTER_VERSION, ClusterInputs, cluster_configuration
from training_constructs.common.nag_names import nag_name

PYXIS_SCRIPT = Path(__file__).resolve().parent / "pcluster" / "enable_pyxis.sh"
# The provider template AWS publishes for each release (ParallelCluster user guide,
# "AWS CloudFormation custom resource").
PROVIDER_TEMPLATE = (
    "https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
    f"/parallelcluster/{PCLUSTER_VERSION}/templates/custom_resource/cluster.yaml"
)


# The role the provider's Lambda function runs as may do only what ParallelCluster's default policies
# allow (aws/aws-parallelcluster cloudformation/custom_resource/cluster.yaml with
# cloudformation/policies/parallelcluster-policies.yaml, EnableIamAdminAccess). Its template takes
# extra managed policies for that role through this parameter (ParallelCluster user guide,
# "Provider stack hosted by AWS ParallelCluster").
PROVIDER_POLICIES_PARAMETER = "AdditionalIamPolicies"
# The service-linked role FSx for Lustre uses to reach S3 for data repository associations.
FSX_S3_SERVICE_ROLE = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/*"
ECR_PULL_ACTIONS = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
# What Bucket.grant_put gives the Batch job role on checkpoint objects (stacks/jobs_stack.py), with the
# s3:DeleteObject it adds for rotation; a test keeps the two roles' checkpoint actions equal.
CHECKPOINT_WRITE_ACTIONS = [
    "s3:PutObject",
    "s3:PutObjectLegalHold",
    "s3:PutObjectRetention",
    "s3:PutObjectTagging",
    "s3:PutObjectVersionTagging",
    "s3:Abort*",
    "s3:DeleteObject",
]
# Never, whatever else a node's role is given: a version deleted is gone for good, and the bucket's
# versioning, lifecycle and policy keep every checkpoint recoverable.
BUCKET_GUARD_ACTIONS = [
    "s3:PutBucketVersioning",
    "s3:PutLifecycleConfiguration",
    "s3:PutBucketPolicy",
    "s3:DeleteBucketPolicy",
    "s3:DeleteBucket",
]


def open_ssh_warning(source: str) -> str:
    """One line for a head node whose SSH port is open to every address."""
    return (
        f"pclusterSshSource={source} opens the head node's SSH port to the whole internet; name your own CIDR, or "
        "unset it: Session Manager needs no open port"
    )


class TrainingCluster(Construct):
    """Attributes: `cluster` (the Custom::PclusterCluster L1), `provider` (nested stack),
    `provider_policy` (what the provider needs beyond its defaults), `ecr_pull_policy` and
    `checkpoint_write_policy` (the compute nodes'),
    `configuration` (the ClusterConfiguration as passed, tokens included)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        settings: ParallelClusterSettings,
        subnet_id: str,
        dataset_bucket: s3.IBucket,
        checkpoint_bucket: s3.IBucket,
        image_repositories: Sequence[str],
        log_retention_days: int,
        root_volume_gib: int,
    ) -> None:
        super().__init__(scope, construct_id)
        script = s3_assets.Asset(self, "EnablePyxis", path=str(PYXIS_SCRIPT))
        self.ecr_pull_policy = self._ecr_pull_policy(image_repositories)
        self.checkpoint_write_policy = self._checkpoint_write_policy(dataset_bucket, checkpoint_bucket)
        self.provider_policy = self._provider_policy([dataset_bucket, checkpoint_bucket], script)
        inputs = ClusterInputs(
            partition=Aws.PARTITION,
            subnet_id=subnet_id,
            dataset_bucket=dataset_bucket.bucket_name,
            checkpoint_bucket=checkpoint_bucket.bucket_name,
            pyxis_script_url=script.s3_object_url,
            script_bucket=script.s3_bucket_name,
            ecr_pull_policy=self.ecr_pull_policy.managed_policy_arn,
            checkpoint_write_policy=self.checkpoint_write_policy.managed_policy_arn,
        )
        self.configuration = cluster_configuration(
            settings, inputs, log_retention_days=log_retention_days, root_volume_gib=root_volume_gib
        )
        self.provider = cloudformation.CfnStack(
            self,
            "Provider",
            template_url=Fn.sub(PROVIDER_TEMPLATE),
            timeout_in_minutes=30,
            parameters={PROVIDER_POLICIES_PARAMETER: self.provider_policy.managed_policy_arn},
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
        if settings.ssh_source and settings.ssh_source.endswith("/0"):
            Annotations.of(self).add_warning_v2("training:open-ssh", open_ssh_warning(settings.ssh_source))

    def _ecr_pull_policy(self, repositories: Sequence[str]) -> iam.ManagedPolicy:
        """Nodes pull training images from this deployment's repositories only (image_repositories.py).
        The provider may attach it because it lives under /parallelcluster/;
        AmazonEC2ContainerRegistryReadOnly is not on its list."""
        policy = iam.ManagedPolicy(
            self,
            "EcrPull",
            path="/parallelcluster/",
            description="ParallelCluster nodes: pull images from this deployment's ECR repositories",
            statements=[
                # GetAuthorizationToken has no resource to scope to (ECR API reference).
                iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]),
                iam.PolicyStatement(actions=ECR_PULL_ACTIONS, resources=list(repositories)),
            ],
        )
        _acknowledge(policy, {"Resource::*": "ecr:GetAuthorizationToken cannot be scoped to a resource"})
        return policy

    def _checkpoint_write_policy(self, dataset_bucket: s3.IBucket, checkpoint_bucket: s3.IBucket) -> iam.ManagedPolicy:
        """Compute nodes write and rotate checkpoints as Batch jobs do, and can never erase a version or
        change what keeps versions. Under /parallelcluster/ so that the provider may attach it."""
        stack = Stack.of(self)
        objects = [checkpoint_bucket.arn_for_objects("*"), dataset_bucket.arn_for_objects("*")]
        policy = iam.ManagedPolicy(
            self,
            "CheckpointWrite",
            path="/parallelcluster/",
            description="ParallelCluster compute nodes: write checkpoints; never delete a version",
            statements=[
                iam.PolicyStatement(actions=CHECKPOINT_WRITE_ACTIONS, resources=[objects[0]]),
                iam.PolicyStatement(effect=iam.Effect.DENY, actions=["s3:DeleteObjectVersion"], resources=objects),
                iam.PolicyStatement(
                    effect=iam.Effect.DENY,
                    actions=BUCKET_GUARD_ACTIONS,
                    resources=[checkpoint_bucket.bucket_arn, dataset_bucket.bucket_arn],
                ),
            ],
        )
        _acknowledge(
            policy,
            {
                "Action::s3:Abort*": "abort multipart uploads of large checkpoints, in the checkpoint bucket only",
                f"Resource::{nag_name(stack, objects[0])}": "objects of the checkpoint bucket: checkpoints",
            },
        )
        return policy

    def _provider_policy(self, buckets: list[s3.IBucket], script: s3_assets.Asset) -> iam.ManagedPolicy:
        """What the provider's Lambda role needs for this configuration and its defaults lack."""
        stack = Stack.of(self)
        fsx_role = stack.format_arn(service="iam", region="", resource=FSX_S3_SERVICE_ROLE)
        policy = iam.ManagedPolicy(
            self,
            "ProviderPermissions",
            description="ParallelCluster provider: validate and link the data buckets, read the node script",
            statements=[
                # ParallelCluster checks every DataRepositoryPath with s3 head_bucket, and FSx for
                # Lustre needs the caller to reach the bucket when it links a data repository. The
                # actions are those of ParallelCluster's own FSx statement (Sid EnableFSxS3Access),
                # scoped to the two buckets.
                iam.PolicyStatement(
                    sid="LinkDataRepositories",
                    actions=["s3:Get*", "s3:List*", "s3:PutObject"],
                    resources=[arn for b in buckets for arn in (b.bucket_arn, b.arn_for_objects("*"))],
                ),
                # FSx creates its S3 service-linked role on first use (ParallelCluster's Sid
                # FSxS3PoliciesAttach); without it the association fails.
                iam.PolicyStatement(
                    sid="FsxS3ServiceLinkedRole",
                    actions=["iam:CreateServiceLinkedRole", "iam:AttachRolePolicy", "iam:PutRolePolicy"],
                    resources=[fsx_role],
                ),
                # The custom-action script is validated and read from the CDK asset bucket.
                iam.PolicyStatement(
                    sid="ReadNodeScript",
                    actions=["s3:GetObject"],
                    resources=[script.bucket.arn_for_objects(script.s3_object_key)],
                ),
                iam.PolicyStatement(
                    sid="FindNodeScript",
                    actions=["s3:ListBucket", "s3:GetBucketLocation"],
                    resources=[script.bucket.bucket_arn],
                ),
            ],
        )
        findings = {
            "Action::s3:Get*": "ParallelCluster's own FSx-link actions, on the dataset and checkpoint buckets only",
            "Action::s3:List*": "head_bucket validation and FSx linking, on the dataset and checkpoint buckets only",
        }
        for bucket in buckets:
            findings[f"Resource::{nag_name(stack, bucket.arn_for_objects('*'))}"] = (
                "objects of a bucket FSx links to /fsx"
            )
        _acknowledge(
            policy,
            {
                **findings,
                f"Resource::{nag_name(stack, fsx_role)}": (
                    "only FSx for Lustre's S3 service-linked role, which FSx needs for data repository associations"
                ),
            },
        )
        return policy


def _acknowledge(policy: iam.ManagedPolicy, findings: dict[str, str]) -> None:
    for finding, reason in findings.items():
        Validations.of(policy).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
