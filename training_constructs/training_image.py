"""A training image: built from container/ by CDK at deploy time, or an existing image URI."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from constructs import Construct

CONTAINER_DIR = Path(__file__).resolve().parent.parent / "container"


class TrainingImage(Construct):
    """Attributes: `image_uri`, `container_image` (for job definitions), `asset` (None when an
    existing image is used)."""

    def __init__(self, scope: Construct, construct_id: str, *, dockerfile: str, image_uri: str | None) -> None:
        super().__init__(scope, construct_id)
        self.asset: ecr_assets.DockerImageAsset | None = None
        if image_uri:
            self.image_uri = image_uri
            self.container_image = ecs.ContainerImage.from_registry(image_uri)
            return
        # Staged at synth (no Docker needed); built and pushed to the bootstrap repository at deploy.
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(CONTAINER_DIR),
            file=dockerfile,
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.image_uri = self.asset.image_uri
        self.container_image = ecs.ContainerImage.from_docker_image_asset(self.asset)
