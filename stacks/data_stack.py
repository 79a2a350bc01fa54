from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_s3 as s3
from constructs import Construct

from training_constructs.data.training_data import TrainingData


@dataclass(frozen=True)
class ExportedBucket:
    """A bucket shared with other stacks through a named CloudFormation export.

    A named export keeps the reference stable and readable: IAM policies in other stacks then
    name `<export>/*`, which cdk-nag findings and their acknowledgements can name exactly.
    """

    export_name: str
    # Fn::ImportValue of the bucket's ARN, for use in other stacks.
    bucket_arn: str

    def bucket(self, scope: Construct, construct_id: str) -> s3.IBucket:
        """The bucket as seen from another stack (grants and names resolve through the export)."""
        return s3.Bucket.from_bucket_arn(scope, construct_id, self.bucket_arn)


class DataStack(Stack):
    """Stateful: the dataset and checkpoint buckets and their access logs, retained, with
    termination protection so that `cdk destroy` cannot take them by accident."""

    def __init__(self, scope: Construct, construct_id: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, termination_protection=True, **kwargs)
        self.data = TrainingData(self, "Data")
        self.datasets = self._export("DatasetBucket", self.data.datasets, "datasets (jobs read)")
        self.checkpoints = self._export("CheckpointBucket", self.data.checkpoints, "checkpoints (jobs write)")

    def _export(self, name: str, bucket: s3.IBucket, description: str) -> ExportedBucket:
        CfnOutput(self, name, value=bucket.bucket_name, description=description)
        export_name = f"{self.stack_name}-{name}Arn"
        return ExportedBucket(export_name, self.export_value(bucket.bucket_arn, name=export_name))
