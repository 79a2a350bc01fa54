"""Frozen settings handed to the stacks. Built only by config.context.read_settings."""

from __future__ import annotations

from dataclasses import dataclass

from config.catalog import InstanceSpec
from config.pcs import LOGIN_NODES


@dataclass(frozen=True, kw_only=True)
class NetworkSettings:
    # The AZ of fleets that name none, and of the Slurm cluster; it gets a training subnet of its own.
    # None: the VPC's first training subnet, in the region's first AZ (Fn::GetAZs at deploy time).
    availability_zone: str | None
    # Further AZs that fleets name; each gets a training subnet of its own (compute stack).
    fleet_availability_zones: tuple[str, ...] = ()
    nat_gateways: int
    # Short service names ("ecr.api", "logs", ...) that get an interface endpoint.
    interface_endpoints: tuple[str, ...]
    # Regions whose AZ names were not checked against config/availability_zones.json (skipZoneTable).
    zone_table_skipped: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CapacityReservation:
    reservation_id: str
    # "odcr" (On-Demand Capacity Reservation) or "capacity-block" (EC2 Capacity Block for ML).
    kind: str


@dataclass(frozen=True, kw_only=True)
class CapacityWindow:
    """When a Capacity Block runs: ISO 8601 UTC times (2026-12-01T11:30:00Z)."""

    start: str
    end: str


@dataclass(frozen=True, kw_only=True)
class Placement:
    """One place a fleet's jobs may run: an instance type in an AZ, maybe in a reservation. A fleet's
    own place is its first placement; `fallback` placements follow (config/placements.py)."""

    instance: InstanceSpec
    # None: the network's default AZ.
    availability_zone: str | None
    capacity_reservation: CapacityReservation | None
    # A Capacity Block's window: jobs are sent there only inside it.
    window: CapacityWindow | None = None

    @property
    def label(self) -> str:
        """One line for people: "us-west-2c p5.48xlarge cr-... (capacity-block 2026-12-01T11:30Z..)"."""
        parts = [self.availability_zone or "default-AZ", self.instance.name]
        if self.capacity_reservation:
            parts.append(f"{self.capacity_reservation.reservation_id} ({self.capacity_reservation.kind}")
            parts[-1] += f" {self.window.start[:16]}Z..{self.window.end[:16]}Z)" if self.window else ")"
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class RootVolume:
    """The gp3 root volume of every training node: images are pulled and unpacked here."""

    size_gib: int
    throughput_mibps: int
    iops: int


# Construct ids the stacks give their own children beside the fleets' (a fleet's construct id is its
# name with a capital first letter, see fleet_construct_id). A fleet named like one of these would
# collide with it ("There is already a Construct with name ..."), so config.context refuses such
# names, case-insensitively. tests/test_replay.py walks every stack of a synth and fails on a child
# id missing here: a construct added later is caught there.
RESERVED_CONSTRUCT_IDS = frozenset(
    {
        # Every stack: CDK's own children, and what cross-stack references add.
        "BootstrapVersion",
        "CheckBootstrapVersion",
        "CDKMetadata",
        "Exports",
        # Network, compute, registry, data.
        "Network",
        "Subnets",
        "TeamImages",
        "PytorchImage",
        "IsaacLabImage",
        "TrainiumImage",
        "Data",
        "DatasetBucket",
        "CheckpointBucket",
        # Jobs and ParallelCluster.
        "Datasets",
        "Checkpoints",
        "JobRole",
        "FairShare",
        "JobAlerts",
        "ResumedJobAlerts",
        "AlertTopic",
        "BootCircuitBreaker",
        "Slurm",
        "ClusterName",
        "HeadNodeInstanceId",
        # The PCS stack (its subnets, buckets and Slurm construct reuse the ids above).
        "ClusterId",
        "QueueName",
        "LoginNodeGroupId",
        # Job metrics and the monitoring stack.
        "JobMetrics",
        "Dashboard",
        "DashboardUrl",
        # Capacity fallback (the jobs stack).
        "CapacityFallback",
        # Team budgets (the jobs stack) and their output.
        "TeamBudgets",
        "Budgets",
    }
)


# What the stacks append to a fleet's construct id for its own stack-level children: the fleet's
# construct itself (""), the jobs stack's outputs (names the README's commands read) and its
# health construct. Fleets `gpu` and `gpuJobQueue` would both claim `GpuJobQueue`, so
# config.context refuses two fleets whose ids plus suffixes meet. tests/test_replay.py walks every
# stack and fails on a fleet's child id that is not its construct id plus one of these.
FLEET_ID_SUFFIXES = (
    "",
    "JobQueue",
    "TrainingJobDefinition",
    "BenchmarkJobDefinition",
    "LogGroup",
    "Health",
    "Placements",
)


def fleet_construct_id(name: str) -> str:
    """A fleet's name as it starts construct ids and output names: gpu -> Gpu."""
    return name[0].upper() + name[1:]


@dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """One named fleet: its compute path, queue and job definitions, all of one instance type."""

    name: str
    instance: InstanceSpec
    nodes: int
    max_nodes: int
    # None: the network's default AZ.
    availability_zone: str | None
    # An existing image to run instead of building one from container/.
    image_uri: str | None
    capacity_reservation: CapacityReservation | None
    # A fixed AMI instead of AWS's current ECS-optimized one (see README, "Changing a deployed fleet").
    ami_id: str | None
    # Where the fleet's jobs go, in order, when its own place has no capacity (config/placements.py).
    fallback: tuple[Placement, ...] = ()
    # The window of the fleet's own Capacity Block, when it gives one (config/placements.py own_window).
    window: CapacityWindow | None = None

    @property
    def construct_id(self) -> str:
        return fleet_construct_id(self.name)

    @property
    def own_placement(self) -> Placement:
        return Placement(
            instance=self.instance,
            availability_zone=self.availability_zone,
            capacity_reservation=self.capacity_reservation,
            window=self.window,
        )

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The fleet's own placement, then its fallback placements."""
        return (self.own_placement, *self.fallback)


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
class PcsSettings:
    """The managed Slurm option (the PCS stack, `slurm=pcs`)."""

    # One compute node group per instance type, each scaling 0..max_nodes.
    instances: tuple[InstanceSpec, ...]
    max_nodes: int
    login_instance_type: str
    # The pinned AMI of every node: PCS agent and Slurm of config.pcs.SLURM_VERSION.
    ami_id: str
    accounting_purge_days: int

    @property
    def cluster_nodes(self) -> int:
        """Every node the cluster may run at once: the compute node groups at their max, and login."""
        return len(self.instances) * self.max_nodes + LOGIN_NODES


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
class HealthCheckSchedule:
    """When the fleet check (the benchmark job) runs on every fleet, and how long after a run its
    verdict may be awaited before the check counts as not finished."""

    # An EventBridge schedule expression: rate(...) or cron(...).
    expression: str
    # The longest time between two runs (a cron expression that runs every day counts as a day).
    interval_seconds: int


@dataclass(frozen=True, kw_only=True)
class TeamBudget:
    """One team's monthly budget in US dollars (the `budgets` key)."""

    team: str
    monthly_usd: float


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    """Team budgets (config/budgets.py reads them): what the ledger, the enforcement and trainctl share."""

    teams: tuple[TeamBudget, ...]
    # USD per instance-hour of each fleet's placements, by fleet name then instance type: the
    # budgetPrices figure where given (every placement of that fleet), else config/prices.py's.
    prices: tuple[tuple[str, str, float], ...]
    # FIFO queues: the team of a job that names none (None: such a job counts against no budget).
    default_team: str | None
    # Teams are share identifiers (fair-share queues) rather than the trainctl:team tag.
    fair_share: bool

    def price(self, fleet: str, instance_type: str) -> float:
        return next(usd for f, t, usd in self.prices if f == fleet and t == instance_type)


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """What every training job definition and queue shares."""

    timeout_seconds: int
    attempts: int
    # Empty: FIFO queues. Otherwise one fair-share policy with these identifiers.
    shares: tuple[Share, ...]
    # Jobs RUNNABLE this long for lack of capacity or a misfit are cancelled with the reason.
    runnable_timeout_minutes: int
    # Who hears about failed and cancelled jobs (besides the SNS topic itself); None: nobody.
    alert_email: str | None
    # None: no scheduled fleet check (each run launches the fleet's nodes).
    health_check_schedule: HealthCheckSchedule | None = None
    # ECS Exec into job containers (`trainctl exec`): the job definitions enable it, the job role may.
    ecs_exec: bool = True
    # None: no budgets, and nothing deployed for them.
    budgets: BudgetSettings | None = None
    # ARNs (a trailing * allowed) of the secrets and parameters jobs may read; empty: no execution role.
    job_secrets: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ImageSettings:
    """Where the training images that fleets without their own `image` run are built."""

    # "local": DockerImageAsset, built by Docker on the machine that runs cdk deploy.
    # "cloud": AWS CodeBuild at deploy time, pushed to the team repository under a content tag.
    build: str = "local"
    # Secrets Manager secret (name) holding an NGC API key for the cloud build; None: anonymous pull.
    ngc_secret: str | None = None


@dataclass(frozen=True, kw_only=True)
class AppSettings:
    network: NetworkSettings
    fleets: tuple[FleetSettings, ...]
    parallel_cluster: ParallelClusterSettings
    jobs: JobSettings
    log_retention_days: int
    root_volume: RootVolume
    images: ImageSettings = ImageSettings()
    # The managed Slurm option; None unless slurm=pcs.
    pcs: PcsSettings | None = None
    # CloudFormation's own validation at synth (the templateValidation key).
    template_validation: bool = False

    @property
    def root_volume_gib(self) -> int:
        return self.root_volume.size_gib

    def fleet(self, name: str) -> FleetSettings:
        return next(f for f in self.fleets if f.name == name)
