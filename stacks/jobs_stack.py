from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, CfnOutput, Duration, Stack, Validations
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.settings import JobSettings, ProfileSettings
from stacks.data_stack import ExportedBucket
from training_constructs.training_fleet import TrainingFleet
from training_constructs.training_image import TrainingImage
from training_constructs.training_jobs import TrainingJobs

# How long past usage counts against a share: an hour, so a team whose run just ended does not
# jump ahead of one that has been waiting (Batch user guide, fair-share scheduling).
SHARE_DECAY = Duration.hours(1)


class JobsStack(Stack):
    """Per profile: a fair-share job queue, the training and all-reduce job definitions and their
    log group; one job role for both, allowed to read datasets and write checkpoints."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        gpu: ProfileSettings,
        trainium: ProfileSettings,
        gpu_fleet: TrainingFleet,
        trainium_fleet: TrainingFleet,
        gpu_image: TrainingImage,
        trainium_image: TrainingImage,
        datasets: ExportedBucket,
        checkpoints: ExportedBucket,
        jobs: JobSettings,
        log_retention: logs.RetentionDays,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)

        self.job_role = iam.Role(
            self,
            "JobRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description="Training job containers: read datasets, read and write checkpoints",
        )
        dataset_bucket = datasets.bucket(self, "Datasets")
        checkpoint_bucket = checkpoints.bucket(self, "Checkpoints")
        dataset_bucket.grant_read(self.job_role)
        checkpoint_bucket.grant_read_write(self.job_role)
        self._acknowledge_bucket_grants(datasets, checkpoints)

        self.scheduling_policy = batch.FairshareSchedulingPolicy(
            self,
            "FairShare",
            share_decay=SHARE_DECAY,
            shares=[batch.Share(share_identifier=s.identifier, weight_factor=s.weight_factor) for s in jobs.shares],
        )
        environment = {
            "DATASET_BUCKET": dataset_bucket.bucket_name,
            "CHECKPOINT_BUCKET": checkpoint_bucket.bucket_name,
        }

        def profile_jobs(
            construct_id: str, profile: ProfileSettings, fleet: TrainingFleet, image: TrainingImage
        ) -> TrainingJobs:
            created = TrainingJobs(
                self,
                construct_id,
                instance=profile.instance,
                nodes=profile.nodes,
                image_uri=image.image_uri,
                compute_environment_arn=fleet.compute_environment_arn,
                scheduling_policy=self.scheduling_policy,
                job_role=self.job_role,
                environment=environment,
                timeout_seconds=jobs.timeout_seconds,
                attempts=jobs.attempts,
                log_retention=log_retention,
            )
            # Stable output names: the README's commands read them.
            for name, value in (
                ("JobQueue", created.job_queue.job_queue_arn),
                ("TrainingJobDefinition", created.training.job_definition_arn),
                ("BenchmarkJobDefinition", created.benchmark.job_definition_arn),
                ("LogGroup", created.log_group.log_group_name),
            ):
                CfnOutput(self, f"{construct_id}{name}", value=value)
            return created

        self.gpu = profile_jobs("Gpu", gpu, gpu_fleet, gpu_image)
        self.trainium = profile_jobs("Trainium", trainium, trainium_fleet, trainium_image)

    def _acknowledge_bucket_grants(self, datasets: ExportedBucket, checkpoints: ExportedBucket) -> None:
        # grant_read / grant_read_write: object-level actions need `<bucket>/*`, and CDK's grants use
        # action families (GetObject*, List*, ...). Scoped to exactly the two buckets, never `*`.
        findings = {
            f"Resource::{datasets.export_name}/*": "objects of the dataset bucket, read only",
            f"Resource::{checkpoints.export_name}/*": "objects of the checkpoint bucket, read and write",
            "Action::s3:GetObject*": "read objects and their versions, on the two buckets only",
            "Action::s3:GetBucket*": "bucket location and settings the S3 clients ask for, on the two buckets only",
            "Action::s3:List*": "list the two buckets (data loaders and checkpoint discovery)",
            "Action::s3:DeleteObject*": "checkpoint rotation deletes old checkpoints; the bucket is versioned",
            "Action::s3:Abort*": "abort multipart uploads of large checkpoints that failed",
        }
        policy = self.job_role.node.find_child("DefaultPolicy")
        for finding, reason in findings.items():
            Validations.of(policy).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
