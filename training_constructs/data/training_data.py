"""Where training data lives: a dataset bucket, a versioned checkpoint bucket and the bucket that
receives both buckets' server access logs. All three are retained when the stack goes."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_s3 as s3
from constructs import Construct

# Versioning keeps what an overwrite or delete replaced. Keep the newest few old versions for a
# month, so that a bad checkpoint save can be rolled back without paying for every version of a
# multi-GB file forever.
NONCURRENT_VERSION_DAYS = 30
NONCURRENT_VERSIONS_KEPT = 3
# Interrupted multipart uploads of large checkpoints and datasets are billed until aborted.
ABORT_MULTIPART_DAYS = 7


def _bucket(scope: Construct, construct_id: str, **kwargs) -> s3.Bucket:
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        removal_policy=RemovalPolicy.RETAIN,
        **kwargs,
    )


class TrainingData(Construct):
    """Attributes: `datasets`, `checkpoints`, `access_logs` (s3.Bucket)."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.access_logs = _bucket(self, "AccessLogs", versioned=True)
        Validations.of(self.access_logs).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1",
                reason="this bucket is the access-log destination of the dataset and checkpoint buckets; "
                "logging it into itself would log every log delivery",
            )
        )
        # Both are versioned: an overwritten or deleted object stays recoverable for a month.
        lifecycle = [
            s3.LifecycleRule(abort_incomplete_multipart_upload_after=Duration.days(ABORT_MULTIPART_DAYS)),
            s3.LifecycleRule(
                noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
                noncurrent_versions_to_retain=NONCURRENT_VERSIONS_KEPT,
            ),
        ]
        self.datasets = _bucket(
            self,
            "Datasets",
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="datasets/",
            lifecycle_rules=lifecycle,
        )
        self.checkpoints = _bucket(
            self,
            "Checkpoints",
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="checkpoints/",
            lifecycle_rules=lifecycle,
        )
