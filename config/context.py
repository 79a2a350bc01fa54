"""Reads the app's context keys once, parses CLI strings, validates them and builds AppSettings.

Every key the app understands is listed in KEYS with its default and what is allowed; the README
table documents the same list (a test keeps the two in step). Values from `-c key=value` arrive as
strings, values from cdk.json as JSON types; both are accepted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from config.catalog import CATALOG, InstanceSpec, Profile, types_for
from config.settings import (
    AppSettings,
    JobSettings,
    NetworkSettings,
    ParallelClusterSettings,
    ProfileSettings,
    Share,
)

# AWS Batch multi-node parallel jobs: at most 1,000 nodes (Batch user guide, multi-node-parallel-jobs).
MAX_NODES = 1000
# A multi-node job needs at least two nodes; a single node is an ordinary Batch job.
MIN_NODES = 2
# Values CloudWatch Logs accepts for RetentionInDays (CloudWatch Logs API, PutRetentionPolicy).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)
# Root volume bounds: big training images (Isaac Sim, Neuron DLC) unpack to tens of GiB each;
# 16 TiB is the gp3 maximum (EBS user guide, volume types).
MIN_ROOT_GIB = 100
MAX_ROOT_GIB = 16384
# Job attempt timeout: Batch's minimum is 60 s (API JobTimeout). The 14-day ceiling is this app's,
# so that a forgotten job on a large fleet cannot bill for weeks; submit-job --timeout can go higher.
MIN_TIMEOUT_SECONDS = 60
MAX_TIMEOUT_SECONDS = 14 * 24 * 3600
# Batch retry strategy: 1..10 attempts (API RetryStrategy).
MAX_ATTEMPTS = 10
# Fair-share identifiers: up to 255 alphanumeric characters, optionally ending in '*' for a prefix;
# at most 500 active in a queue (API ShareAttributes). Shares are relative: 1..1000.
MAX_SHARE_IDENTIFIERS = 500
MAX_SHARE = 1000
# FSx for Lustre PERSISTENT_2 (SSD): 1200 GiB, 2400 GiB, then steps of 2400 GiB; throughput 125,
# 250, 500 or 1000 MB/s per TiB (FSx for Lustre user guide, "Managing storage capacity" and
# "Performance"). The upper bound is this app's, a guard against a typo costing a fortune.
FSX_CAPACITY_STEP_GIB = 2400
FSX_MIN_CAPACITY_GIB = 1200
FSX_MAX_CAPACITY_GIB = 100 * FSX_CAPACITY_STEP_GIB
FSX_THROUGHPUTS = (125, 250, 500, 1000)
# Interface endpoints the network stack can add on request (short service names).
INTERFACE_ENDPOINTS = (
    "batch",
    "ec2messages",
    "ecr.api",
    "ecr.dkr",
    "ecs",
    "ecs-agent",
    "ecs-telemetry",
    "logs",
    "monitoring",
    "ssm",
    "ssmmessages",
    "sts",
)


class ConfigError(ValueError):
    """A context value the app cannot use. The message is one line, fit for the user."""


@dataclass(frozen=True)
class ContextKey:
    name: str
    default: Any
    allowed: str
    meaning: str


def _key(name: str, default: Any, allowed: str, meaning: str) -> ContextKey:
    return ContextKey(name, default, allowed, meaning)


_GPU_TYPES = types_for(Profile.GPU)
_TRN_TYPES = types_for(Profile.TRAINIUM)
_EFA_TYPES = _GPU_TYPES + _TRN_TYPES

KEYS: dict[str, ContextKey] = {
    k.name: k
    for k in (
        _key(
            "gpuInstanceType",
            "g6.12xlarge",
            "EFA-capable NVIDIA types: " + ", ".join(_GPU_TYPES),
            "GPU profile instance type",
        ),
        _key("gpuNodes", 2, f"integer {MIN_NODES}..{MAX_NODES}", "nodes per GPU multi-node job"),
        _key("gpuMaxNodes", 4, f"integer gpuNodes..{MAX_NODES}", "nodes the GPU compute environment may scale to"),
        _key(
            "trainiumInstanceType",
            "trn1.32xlarge",
            "EFA-capable Trainium types: " + ", ".join(_TRN_TYPES),
            "Trainium profile instance type",
        ),
        _key("trainiumNodes", 2, f"integer {MIN_NODES}..{MAX_NODES}", "nodes per Trainium multi-node job"),
        _key(
            "trainiumMaxNodes",
            4,
            f"integer trainiumNodes..{MAX_NODES}",
            "nodes the Trainium compute environment may scale to",
        ),
        _key(
            "availabilityZone",
            None,
            "an AZ name such as us-east-1a, in the stack's region",
            "AZ of the training subnet and placement groups (default: the region's first AZ)",
        ),
        _key("natGateways", 1, "integer 1..2 (1 when availabilityZone is set)", "NAT gateways for outbound traffic"),
        _key(
            "interfaceEndpoints",
            "",
            "comma-separated subset of: " + ", ".join(INTERFACE_ENDPOINTS),
            "VPC interface endpoints to add (each costs money per hour and AZ)",
        ),
        _key(
            "logRetentionDays",
            30,
            "one of " + ", ".join(map(str, LOG_RETENTION_DAYS)),
            "retention of the app's CloudWatch log groups",
        ),
        _key(
            "gpuImage",
            None,
            "an image URI (registry/repository:tag or @sha256:digest)",
            "existing GPU image to use instead of building container/gpu",
        ),
        _key(
            "trainiumImage",
            None,
            "an image URI (registry/repository:tag or @sha256:digest)",
            "existing Trainium image to use instead of building container/trainium",
        ),
        _key(
            "gpuCapacityReservationId",
            None,
            "cr- followed by 17 hex digits",
            "ODCR or capacity block for the GPU profile",
        ),
        _key(
            "trainiumCapacityReservationId",
            None,
            "cr- followed by 17 hex digits",
            "ODCR or capacity block for the Trainium profile",
        ),
        _key("gpuCapacityReservationType", "odcr", "odcr or capacity-block", "what gpuCapacityReservationId names"),
        _key(
            "trainiumCapacityReservationType",
            "odcr",
            "odcr or capacity-block",
            "what trainiumCapacityReservationId names",
        ),
        _key("gpuPurchaseOption", "on-demand", "on-demand (multi-node jobs do not run on Spot)", "GPU purchase option"),
        _key(
            "trainiumPurchaseOption",
            "on-demand",
            "on-demand (multi-node jobs do not run on Spot)",
            "Trainium purchase option",
        ),
        _key(
            "rootVolumeGib",
            300,
            f"integer {MIN_ROOT_GIB}..{MAX_ROOT_GIB}",
            "encrypted gp3 root volume of each training node (images unpack here)",
        ),
        _key(
            "jobTimeoutSeconds",
            3600,
            f"integer {MIN_TIMEOUT_SECONDS}..{MAX_TIMEOUT_SECONDS}",
            "attempt timeout of the training job definitions (submit-job --timeout overrides it)",
        ),
        _key(
            "jobAttempts",
            3,
            f"integer 1..{MAX_ATTEMPTS}",
            "attempts per training job; only infrastructure failures are retried",
        ),
        _key(
            "shares",
            "default:1",
            f"comma list of identifier:share; identifier up to 255 letters and digits (a trailing * "
            f"makes it a prefix), share 1..{MAX_SHARE}, at most {MAX_SHARE_IDENTIFIERS} identifiers",
            "fair-share identifiers of the job queues and their relative shares of the fleet",
        ),
        _key("parallelCluster", False, "true or false", "add the optional ParallelCluster (Slurm) stack"),
        _key(
            "pclusterInstanceType",
            "p5e.48xlarge",
            "comma list of EFA-capable types: " + ", ".join(_EFA_TYPES),
            "Slurm compute instance types, one queue each",
        ),
        _key("pclusterMaxNodes", 2, f"integer 1..{MAX_NODES}", "Slurm queue MaxCount"),
        _key(
            "pclusterHeadNodeInstanceType",
            "m7i.xlarge",
            "an EC2 instance type name such as m7i.2xlarge",
            "Slurm head node instance type",
        ),
        _key(
            "pclusterSshSource",
            None,
            "an IPv4 CIDR such as 203.0.113.0/24, or a prefix list id pl-...",
            "who may reach the head node on SSH (default: nobody; use SSM Session Manager)",
        ),
        _key("pclusterKeyName", None, "an EC2 key pair name", "key pair installed on the head node"),
        _key(
            "pclusterCapacityReservationId",
            None,
            "cr- followed by 17 hex digits",
            "ODCR or capacity block for the Slurm compute nodes",
        ),
        _key(
            "pclusterCapacityReservationType",
            "odcr",
            "odcr or capacity-block",
            "what pclusterCapacityReservationId names",
        ),
        _key(
            "fsxCapacityGib",
            FSX_MIN_CAPACITY_GIB,
            f"1200, 2400, then steps of {FSX_CAPACITY_STEP_GIB} up to {FSX_MAX_CAPACITY_GIB}",
            "FSx for Lustre (PERSISTENT_2) capacity of the Slurm cluster",
        ),
        _key(
            "fsxThroughput",
            250,
            "one of " + ", ".join(map(str, FSX_THROUGHPUTS)),
            "FSx for Lustre throughput, MB/s per TiB",
        ),
        _key(
            "pclusterDeletionPolicy",
            "Retain",
            "Retain or Delete",
            "whether deleting the stack deletes the running cluster",
        ),
    )
}

_PLAIN_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_SHARE = re.compile(r"^(?P<identifier>[A-Za-z0-9]{1,255}\*?):(?P<share>\d{1,4})$")
# An IPv4 CIDR or a managed prefix list id.
_SSH_SOURCE = re.compile(
    r"^(((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)/(3[0-2]|[12]?\d)|pl-[0-9a-f]{8,17})$"
)
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_KEY_NAME = re.compile(r"^[\x20-\x7e]{1,255}$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_RESERVATION = re.compile(r"^cr-[0-9a-f]{17}$")
_IMAGE = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$"
)


class _Reader:
    def __init__(self, context: Mapping[str, Any]) -> None:
        self._context = context

    def raw(self, key: str) -> Any:
        value = self._context.get(key)
        return KEYS[key].default if value is None else value

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"context key {key}={self.raw(key)!r}: {problem}; allowed: {KEYS[key].allowed}")

    def integer(self, key: str, low: int, high: int) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise self.fail(key, "not an integer")
        if isinstance(value, str):
            if not re.fullmatch(r"[+-]?\d+", value.strip()):
                raise self.fail(key, "not an integer")
            value = int(value)
        if not low <= value <= high:
            raise self.fail(key, f"out of range {low}..{high}")
        return value

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise self.fail(key, "not a boolean")

    def choice(self, key: str, options: tuple[str, ...]) -> str:
        value = self.raw(key)
        if value not in options:
            raise self.fail(key, "not a known option")
        return value

    def required(self, key: str, pattern: re.Pattern[str]) -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise self.fail(key, "malformed")
        return value

    def optional(self, key: str, pattern: re.Pattern[str]) -> str | None:
        value = self.raw(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise self.fail(key, "malformed")
        return value

    def instance_type(self, key: str, allowed: tuple[str, ...], family: str) -> InstanceSpec:
        return self._instance(key, self.raw(key), allowed, family)

    def _instance(self, key: str, name: Any, allowed: tuple[str, ...], family: str) -> InstanceSpec:
        spec = CATALOG.get(name) if isinstance(name, str) else None
        if spec is None:
            raise self.fail(key, f"{name} is not in the instance catalog")
        if not spec.efa_supported:
            raise self.fail(key, f"{name} has no EFA (multi-node training needs it)")
        if name not in allowed:
            raise self.fail(key, f"{name} is a {spec.accelerator_kind} type, not {family}")
        return spec

    def instance_types(self, key: str, allowed: tuple[str, ...], family: str) -> tuple[InstanceSpec, ...]:
        raw = self.raw(key)
        if not isinstance(raw, str):
            raise self.fail(key, "not a comma-separated list")
        names = list(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
        if not names:
            raise self.fail(key, "empty")
        return tuple(self._instance(key, name, allowed, family) for name in names)


def check_keys(context: Mapping[str, Any]) -> None:
    """Refuse context keys that look like ours but are not: a wrong case or a near miss."""
    known = {k.lower(): k for k in KEYS}
    for key in sorted(context):
        if key in KEYS or not _PLAIN_KEY.match(key):
            continue  # namespaced keys (feature flags, aws:cdk:*) belong to CDK
        guess = known.get(key.lower()) or next(iter(difflib.get_close_matches(key, KEYS, n=1, cutoff=0.75)), None)
        hint = f"did you mean {guess}?" if guess else "known keys: " + ", ".join(KEYS)
        raise ConfigError(f"unknown context key {key!r}: {hint}")


def _profile(r: _Reader, profile: Profile, prefix: str, family: str, allowed: tuple[str, ...]) -> ProfileSettings:
    nodes = r.integer(f"{prefix}Nodes", MIN_NODES, MAX_NODES)
    purchase = r.choice(f"{prefix}PurchaseOption", ("on-demand", "spot"))
    if purchase == "spot":
        # Batch user guide, multi-node-parallel-jobs: MNP jobs are not supported on Spot.
        raise r.fail(
            f"{prefix}PurchaseOption", "AWS Batch multi-node parallel jobs do not run on Spot compute environments"
        )
    reservation = r.optional(f"{prefix}CapacityReservationId", _RESERVATION)
    reservation_type = r.choice(f"{prefix}CapacityReservationType", ("odcr", "capacity-block"))
    if reservation_type == "capacity-block" and not reservation:
        raise r.fail(f"{prefix}CapacityReservationType", f"needs {prefix}CapacityReservationId, the block's cr- id")
    return ProfileSettings(
        profile=profile,
        instance=r.instance_type(f"{prefix}InstanceType", allowed, family),
        nodes=nodes,
        max_nodes=r.integer(f"{prefix}MaxNodes", nodes, MAX_NODES),
        image_uri=r.optional(f"{prefix}Image", _IMAGE),
        capacity_reservation_id=reservation,
        capacity_reservation_type=reservation_type,
    )


def _endpoints(r: _Reader) -> tuple[str, ...]:
    raw = r.raw("interfaceEndpoints")
    if not isinstance(raw, str):
        raise r.fail("interfaceEndpoints", "not a comma-separated string")
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    unknown = [n for n in names if n not in INTERFACE_ENDPOINTS]
    if unknown:
        raise r.fail("interfaceEndpoints", f"unknown service {unknown[0]!r}")
    return names


def _network(r: _Reader, region: str | None) -> NetworkSettings:
    az = r.optional("availabilityZone", _AZ)
    if az and region and not az.startswith(region):
        raise r.fail("availabilityZone", f"is not in the stack's region {region}")
    return NetworkSettings(
        availability_zone=az,
        nat_gateways=r.integer("natGateways", 1, 1 if az else 2),
        interface_endpoints=_endpoints(r),
    )


def _shares(r: _Reader) -> tuple[Share, ...]:
    raw = r.raw("shares")
    if not isinstance(raw, str) or not raw.strip():
        raise r.fail("shares", "not a comma-separated list")
    shares: list[Share] = []
    for item in (i.strip() for i in raw.split(",")):
        match = _SHARE.fullmatch(item)
        if not match or not 1 <= int(match["share"]) <= MAX_SHARE:
            raise r.fail("shares", f"entry {item!r} is not identifier:share")
        shares.append(Share(identifier=match["identifier"], share=int(match["share"])))
    if len(shares) > MAX_SHARE_IDENTIFIERS:
        raise r.fail("shares", f"{len(shares)} identifiers")
    for i, a in enumerate(shares):
        for b in shares[i + 1 :]:
            # Batch refuses overlapping entries: a duplicate, or a prefix entry covering another.
            if a.identifier == b.identifier or any(
                x.identifier.endswith("*") and y.identifier.startswith(x.identifier[:-1]) for x, y in ((a, b), (b, a))
            ):
                raise r.fail("shares", f"{a.identifier!r} and {b.identifier!r} overlap")
    return tuple(shares)


def _jobs(r: _Reader) -> JobSettings:
    return JobSettings(
        timeout_seconds=r.integer("jobTimeoutSeconds", MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS),
        attempts=r.integer("jobAttempts", 1, MAX_ATTEMPTS),
        shares=_shares(r),
    )


def _parallel_cluster(r: _Reader) -> ParallelClusterSettings:
    capacity = r.integer("fsxCapacityGib", FSX_MIN_CAPACITY_GIB, FSX_MAX_CAPACITY_GIB)
    if capacity != FSX_MIN_CAPACITY_GIB and capacity % FSX_CAPACITY_STEP_GIB:
        raise r.fail("fsxCapacityGib", f"not 1200 or a multiple of {FSX_CAPACITY_STEP_GIB}")
    throughput = r.integer("fsxThroughput", min(FSX_THROUGHPUTS), max(FSX_THROUGHPUTS))
    if throughput not in FSX_THROUGHPUTS:
        raise r.fail("fsxThroughput", "not a PERSISTENT_2 throughput")
    reservation = r.optional("pclusterCapacityReservationId", _RESERVATION)
    reservation_type = r.choice("pclusterCapacityReservationType", ("odcr", "capacity-block"))
    if reservation_type == "capacity-block" and not reservation:
        raise r.fail("pclusterCapacityReservationType", "needs pclusterCapacityReservationId, the block's cr- id")
    return ParallelClusterSettings(
        enabled=r.boolean("parallelCluster"),
        instances=r.instance_types("pclusterInstanceType", _EFA_TYPES, "EFA-capable"),
        max_nodes=r.integer("pclusterMaxNodes", 1, MAX_NODES),
        head_node_instance_type=r.required("pclusterHeadNodeInstanceType", _INSTANCE_TYPE),
        ssh_source=r.optional("pclusterSshSource", _SSH_SOURCE),
        key_name=r.optional("pclusterKeyName", _KEY_NAME),
        capacity_reservation_id=reservation,
        capacity_reservation_type=reservation_type,
        fsx_capacity_gib=capacity,
        fsx_throughput=throughput,
        deletion_policy=r.choice("pclusterDeletionPolicy", ("Retain", "Delete")),
    )


def _retention(r: _Reader) -> int:
    days = r.integer("logRetentionDays", 1, max(LOG_RETENTION_DAYS))
    if days not in LOG_RETENTION_DAYS:
        raise r.fail("logRetentionDays", "not a value CloudWatch Logs accepts")
    return days


def read_settings(context: Mapping[str, Any], *, region: str | None = None) -> AppSettings:
    """Build AppSettings from the app's context. Raises ConfigError on the first bad value."""
    check_keys(context)
    r = _Reader(context)
    return AppSettings(
        network=_network(r, region),
        gpu=_profile(r, Profile.GPU, "gpu", "NVIDIA GPU", _GPU_TYPES),
        trainium=_profile(r, Profile.TRAINIUM, "trainium", "Trainium", _TRN_TYPES),
        parallel_cluster=_parallel_cluster(r),
        jobs=_jobs(r),
        log_retention_days=_retention(r),
        root_volume_gib=r.integer("rootVolumeGib", MIN_ROOT_GIB, MAX_ROOT_GIB),
    )
