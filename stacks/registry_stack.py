from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aws_cdk import Annotations, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.settings import FleetSettings, ImageSettings
from training_constructs.images.image_versions import VERSIONS_FILE, load_versions
from training_constructs.images.training_image import CONTAINER_DIR, TrainingImage

if TYPE_CHECKING:
    from training_constructs.images.cloud_image_build import CloudBuiltImage, CloudImageBuild

UNTAGGED_IMAGE_DAYS = 14
TAGGED_IMAGES_KEPT = 200
# The images built from container/, by name (InstanceSpec.default_image: the Dockerfile's folder,
# which also starts the cloud build's tag): construct id and Dockerfile.
IMAGES = {
    "pytorch": ("PytorchImage", "pytorch/Dockerfile"),
    "isaaclab": ("IsaacLabImage", "isaaclab/Dockerfile"),
    "trainium": ("TrainiumImage", "trainium/Dockerfile"),
}
# GPUs the PyTorch image has no kernels for: its PyTorch is a CUDA 13 build, and CUDA 13 dropped
# Volta (sm_70) (CUDA 13.0 release notes, "Deprecated architectures"; NVIDIA/cuDecomp#97: "CUDA 13.0
# dropped support for Volta (SM70)"); PyTorch's CUDA 12.8+ builds dropped it from 2.9 on
# (pytorch/pytorch#157517). Seen on an H200 (2026-11-26): PyTorch 2.11.0+cu130 lists sm_75, sm_80,
# sm_86, sm_90, sm_100 and sm_120 in torch.cuda.get_arch_list().
PYTORCH_IMAGE_WITHOUT_KERNELS = frozenset({"V100"})


class RegistryStack(Stack):
    """Training images built from container/: each image that a fleet without its own `image` runs by
    default (InstanceSpec.default_image), none otherwise, with the pins of container/versions.toml as
    build arguments; and the team ECR repository. Images are DockerImageAssets (Docker on the
    deploying machine), or with imageBuild=cloud built in CodeBuild at deploy and pushed to the team
    repository under a content tag. Stateful: the repository is retained.

    Attributes `images`: image name (pytorch, isaaclab, trainium) -> TrainingImage or CloudBuiltImage;
    `cloud_build` (CloudImageBuild or None); `image_uri(fleet)` is what a fleet runs."""

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
            dict.fromkeys(f.instance.default_image for f in fleets if not f.image_uri), key=list(IMAGES).index
        )
        self.cloud_build: CloudImageBuild | None = None
        self.images: dict[str, TrainingImage | CloudBuiltImage] = {}
        if images.build == "cloud" and needed:
            # Imported here: the default synth does not load CodeBuild, Lambda and custom resources.
            from training_constructs.images.cloud_image_build import CloudImageBuild

            self.cloud_build = CloudImageBuild(
                self,
                "ImageBuild",
                repository=self.repository,
                dockerfiles={name: IMAGES[name][1] for name in needed},
                source_dir=container_dir,
                ngc_secret=images.ngc_secret,
                log_retention=log_retention,
            )
            self.images = {name: self.cloud_build.images[name] for name in needed}
        else:
            versions = load_versions(container_dir / VERSIONS_FILE.name)
            self.images = {
                name: TrainingImage(
                    self,
                    IMAGES[name][0],
                    dockerfile=IMAGES[name][1],
                    directory=container_dir,
                    build_args=versions.build_args(name),
                )
                for name in needed
            }

        for fleet in fleets:
            _warn_without_kernels(self, fleet)

    def image_uri(self, fleet: FleetSettings) -> str:
        return fleet.image_uri or self.images[fleet.instance.default_image].image_uri


def _warn_without_kernels(scope: Construct, fleet: FleetSettings) -> None:
    """A fleet on the PyTorch image whose GPU that image has no kernels for (V100) is told at synth;
    on a node the preflight's EXPECT_TORCH_CUDA check stops the job with CUDA's own error."""
    spec = fleet.instance
    if (
        fleet.image_uri
        or spec.default_image != "pytorch"
        or spec.accelerator_model not in PYTORCH_IMAGE_WITHOUT_KERNELS
    ):
        return
    Annotations.of(scope).add_warning_v2(
        "training:image-without-kernels",
        f"fleet {fleet.name} ({spec.name}, {spec.accelerator_model}): the PyTorch image built from container/pytorch "
        "is a CUDA 13 build, which has no kernels for Volta GPUs; give the fleet an `image` with a PyTorch built "
        "for CUDA 12.6 or older, or the job preflight stops every node",
    )
