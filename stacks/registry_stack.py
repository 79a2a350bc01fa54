from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from constructs import Construct

from config.catalog import AcceleratorKind
from config.settings import FleetSettings
from training_constructs.training_image import TrainingImage

UNTAGGED_IMAGE_DAYS = 14
TAGGED_IMAGES_KEPT = 200
# One image per accelerator kind: construct id and Dockerfile under container/.
IMAGES = {
    AcceleratorKind.NVIDIA_GPU: ("GpuImage", "gpu/Dockerfile"),
    AcceleratorKind.NEURON: ("TrainiumImage", "trainium/Dockerfile"),
}


class RegistryStack(Stack):
    """Training images built from container/ (DockerImageAsset): one per accelerator kind that a
    fleet without its own `image` runs on, none otherwise; and an ECR repository for images a team
    pushes itself. Stateful: the repository is retained.

    Attribute `images`: accelerator kind -> TrainingImage; `image_uri(fleet)` is what a fleet runs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleets: Sequence[FleetSettings],
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
        needed = dict.fromkeys(f.instance.accelerator_kind for f in fleets if not f.image_uri)
        self.images = {
            kind: TrainingImage(self, IMAGES[kind][0], dockerfile=IMAGES[kind][1])
            for kind in sorted(needed, key=list(IMAGES).index)
        }

    def image_uri(self, fleet: FleetSettings) -> str:
        return fleet.image_uri or self.images[fleet.instance.accelerator_kind].image_uri
