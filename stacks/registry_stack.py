from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aws_cdk import Annotations, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.catalog import AcceleratorKind
from config.settings import FleetSettings, ImageSettings
from training_constructs.images.training_image import CONTAINER_DIR, TrainingImage

if TYPE_CHECKING:
    from training_constructs.images.cloud_image_build import CloudBuiltImage, CloudImageBuild

UNTAGGED_IMAGE_DAYS = 14
TAGGED_IMAGES_KEPT = 200
# One image per accelerator kind: construct id and Dockerfile under container/.
IMAGES = {
    AcceleratorKind.NVIDIA_GPU: ("GpuImage", "gpu/Dockerfile"),
    AcceleratorKind.NEURON: ("TrainiumImage", "trainium/Dockerfile"),
}


def _image_name(kind: AcceleratorKind) -> str:
    """gpu or trainium: the Dockerfile's folder, which starts the image's tag."""
    return IMAGES[kind][1].split("/")[0]


class RegistryStack(Stack):
    """Training images built from container/: one per accelerator kind that a fleet without its own
    `image` runs on, none otherwise; and the team ECR repository. Images are DockerImageAssets
    (Docker on the deploying machine), or with imageBuild=cloud built in CodeBuild at deploy and
    pushed to the team repository under a content tag. Stateful: the repository is retained.

    Attributes `images`: accelerator kind -> TrainingImage or CloudBuiltImage; `cloud_build`
    (CloudImageBuild or None); `image_uri(fleet)` is what a fleet runs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleets: Sequence[FleetSettings],
        images: ImageSettings,
        log_retention: logs.RetentionDays,
        container_dir: Path = CONTAINER_DIR,
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
        # Exported whether or not the job definitions use it now: switching imageBuild back to local
        # must not remove an export that the deployed jobs stack still imports.
        self.export_value(self.repository.repository_arn)
        self.export_value(self.repository.repository_name)
        needed = sorted(
            dict.fromkeys(f.instance.accelerator_kind for f in fleets if not f.image_uri), key=list(IMAGES).index
        )
        self.cloud_build: CloudImageBuild | None = None
        self.images: dict[AcceleratorKind, TrainingImage | CloudBuiltImage] = {}
        if images.build == "cloud" and needed:
            # Imported here: the default synth does not load CodeBuild, Lambda and custom resources.
            from training_constructs.images.cloud_image_build import CloudImageBuild

            self.cloud_build = CloudImageBuild(
                self,
                "ImageBuild",
                repository=self.repository,
                dockerfiles={_image_name(kind): IMAGES[kind][1] for kind in needed},
                source_dir=container_dir,
                ngc_secret=images.ngc_secret,
                log_retention=log_retention,
            )
            self.images = {kind: self.cloud_build.images[_image_name(kind)] for kind in needed}
        else:
            self.images = {
                kind: TrainingImage(self, IMAGES[kind][0], dockerfile=IMAGES[kind][1], directory=container_dir)
                for kind in needed
            }

        for fleet in fleets:
            _warn_on_blackwell(self, fleet)

    def image_uri(self, fleet: FleetSettings) -> str:
        return fleet.image_uri or self.images[fleet.instance.accelerator_kind].image_uri


def _warn_on_blackwell(scope: Construct, fleet: FleetSettings) -> None:
    """Blackwell GPUs (the catalog gives exactly them a minimum driver) cannot run the GPU image that
    container/gpu builds: Isaac Lab 2.1.0 pins PyTorch 2.5.1, whose kernels stop at sm_90
    (HybridRobotics/berkeley-humanoid-lite#43; PyTorch added Blackwell with 2.7 and CUDA 12.8,
    isaac-sim/IsaacLab#2998), and Isaac Sim 4.5 crashes on RTX Blackwell (isaac-sim/IsaacSim#671).
    Synth says so; on a node the preflight's EXPECT_TORCH_CUDA check stops the job with the CUDA error."""
    spec = fleet.instance
    if fleet.image_uri or spec.accelerator_kind is not AcceleratorKind.NVIDIA_GPU or not spec.min_nvidia_driver:
        return
    Annotations.of(scope).add_warning_v2(
        "training:blackwell-image",
        f"fleet {fleet.name} ({spec.name}, {spec.accelerator_model}): the GPU image built from container/gpu "
        "(Isaac Lab 2.1.0, PyTorch 2.5.1) has no kernels for Blackwell GPUs; give the fleet an `image` with PyTorch "
        "2.7+ built for CUDA 12.8 (Isaac Lab 2.2+ on Isaac Sim 5), or the job preflight stops every node",
    )
