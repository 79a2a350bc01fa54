"""Frozen settings handed to the stacks. Built only by config.context.read_settings."""

from __future__ import annotations

from dataclasses import dataclass

from config.catalog import InstanceSpec, Profile


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    # None: the region's first Availability Zone, resolved by CloudFormation at deploy time.
    availability_zone: str | None
    nat_gateways: int
    # Short service names ("ecr.api", "logs", ...) that get an interface endpoint.
    interface_endpoints: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ProfileSettings:
    """One training profile (gpu or trainium): what its compute and jobs run on."""

    profile: Profile
    instance: InstanceSpec
    nodes: int
    max_nodes: int
    # An existing image to run instead of building one from container/.
    image_uri: str | None
    capacity_reservation_id: str | None
    # "odcr" (On-Demand Capacity Reservation) or "capacity-block" (EC2 Capacity Block for ML).
    capacity_reservation_type: str


@dataclass(frozen=True, kw_only=True)
class ParallelClusterSettings:
    """The optional Slurm cluster (the ParallelCluster stack)."""

    enabled: bool
    # One Slurm queue per compute instance type.
    instances: tuple[InstanceSpec, ...]
    max_nodes: int
    head_node_instance_type: str
    # CIDR or prefix-list id allowed to reach the head node on SSH; None: no SSH from the network.
    ssh_source: str | None
    key_name: str | None
    capacity_reservation_id: str | None
    # "odcr" or "capacity-block", as for the Batch profiles.
    capacity_reservation_type: str
    fsx_capacity_gib: int
    # FSx for Lustre PERSISTENT_2 throughput, MB/s per TiB of storage.
    fsx_throughput: int
    # What deleting the stack does to the cluster: "Retain" (default) or "Delete".
    deletion_policy: str


@dataclass(frozen=True, kw_only=True)
class Share:
    """One fair-share identifier and its relative share of a fleet (more share, more compute)."""

    identifier: str
    share: int

    @property
    def weight_factor(self) -> float:
        # Batch gives more compute to a LOWER weight factor (API ShareAttributes: a factor of
        # 1/8 gets 8 times the compute of a factor of 1), so the share is inverted.
        return round(1 / self.share, 4)


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """What every training job definition and queue shares."""

    timeout_seconds: int
    attempts: int
    shares: tuple[Share, ...]


@dataclass(frozen=True, kw_only=True)
class AppSettings:
    network: NetworkSettings
    gpu: ProfileSettings
    trainium: ProfileSettings
    parallel_cluster: ParallelClusterSettings
    jobs: JobSettings
    log_retention_days: int
    root_volume_gib: int
