"""A training image, built from container/ by CDK at deploy time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

CONTAINER_DIR = Path(__file__).resolve().parents[2] / "container"


class TrainingImage(Construct):
    """Attributes: `image_uri`, `asset`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        dockerfile: str,
        directory: Path = CONTAINER_DIR,
        build_args: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        # Staged at synth (no Docker needed); built and pushed to the bootstrap repository at deploy.
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(directory),
            file=dockerfile,
            # The pins of container/versions.toml (image_versions.py).
            build_args=dict(build_args or {}),
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.image_uri = self.asset.image_uri
