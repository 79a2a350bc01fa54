from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from constructs import Construct

from training_constructs.training_image import TrainingImage

UNTAGGED_IMAGE_DAYS = 14
TAGGED_IMAGES_KEPT = 200


class RegistryStack(Stack):
    """Training images: built from container/ (DockerImageAsset) or given as URIs, and an ECR
    repository for images a team pushes itself. Stateful: the repository is retained."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        gpu_image_uri: str | None,
        trainium_image_uri: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, termination_protection=True, **kwargs)

        self.repository = ecr.Repository(
            self,
            "TeamImages",
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description="drop untagged layers left by re-pushes",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=Duration.days(UNTAGGED_IMAGE_DAYS),
                    rule_priority=1,
                ),
                ecr.LifecycleRule(
                    description=f"keep the newest {TAGGED_IMAGES_KEPT} images",
                    tag_status=ecr.TagStatus.ANY,
                    max_image_count=TAGGED_IMAGES_KEPT,
                    rule_priority=2,
                ),
            ],
        )
        self.gpu_image = TrainingImage(self, "GpuImage", dockerfile="gpu/Dockerfile", image_uri=gpu_image_uri)
        self.trainium_image = TrainingImage(
            self, "TrainiumImage", dockerfile="trainium/Dockerfile", image_uri=trainium_image_uri
        )
