"""The app's context keys as declarations: every key is a field of the pydantic model `Context` (alias =
the key, with its default, what is allowed and what it means), each fleet a `FleetModel`, and `KEYS`
is derived from them (docs/reference/context-keys.md is generated from it). The parsers here turn CLI
strings and cdk.json values into the types the fields take. The rules between keys, and the settings
built from them, are config/context.py's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, create_model

from config import limits, pcs
from config.catalog import Profile, types_for
from config.job_secrets import ALLOWED_RULE
from config.placements import FIELDS_TEXT, PlacementModel
from config.settings import (
    RESERVED_CONSTRUCT_IDS,
)

RESERVED_NAMES = {name.lower(): name for name in RESERVED_CONSTRUCT_IDS}

_GPU_TYPES = types_for(Profile.GPU)
_TRN_TYPES = types_for(Profile.TRAINIUM)
EFA_TYPES = _GPU_TYPES + _TRN_TYPES
# The flat keys that describe the two default fleets; `fleets` replaces them all.
FLAT_FLEETS = {"gpu": ("NVIDIA GPU", _GPU_TYPES, "g6.12xlarge"), "trainium": ("Trainium", _TRN_TYPES, "trn1.32xlarge")}


def upper_first(name: str) -> str:
    return name[0].upper() + name[1:]


# The fleet fields the flat keys carry: gpuNodes is the gpu fleet's nodes, and so on.
FLAT_FIELDS = ("instanceType", "nodes", "maxNodes", "image", "capacityReservationId", "capacityReservationType")
FLAT_FLEET_KEYS = tuple(p + s for p in FLAT_FLEETS for s in (*map(upper_first, FLAT_FIELDS), "PurchaseOption"))


class ConfigError(ValueError):
    """A context value the app cannot use. The message is one line, fit for the user."""


def _int(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("not an integer")
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?\d+", value.strip()):
            raise ValueError("not an integer")
        return int(value)
    return value


def _bool(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ValueError("not a boolean")
    return value


def once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook for every JSON context value (_json_object): an object that repeats a key is
    refused, where json.loads keeps the last one without a word (`{"llama": 1, "llama": 2}` would lose a
    team's first budget)."""
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise ValueError(f"key {json.dumps(name)} is given twice: give each key once")
        found[name] = value
    return found


def _json_object(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value, object_pairs_hook=once_each)
        except json.JSONDecodeError as error:
            raise ValueError(f"malformed JSON ({error.msg} at column {error.colno})") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _comma_list(value: Any) -> Any:
    """A comma list given as one string (-c key=a,b) or, in cdk.json, as a JSON list of strings."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ",".join(value)
    return value


def _pattern(regex: str, max_length: int | None = None) -> Any:
    """An optional string of this shape; an empty string counts as not given."""
    return Annotated[
        Annotated[str, StringConstraints(pattern=regex, max_length=max_length)] | None,
        BeforeValidator(lambda v: None if v in ("", None) else v),
    ]


Int = Annotated[int, BeforeValidator(_int)]
Bool = Annotated[bool, BeforeValidator(_bool)]
Reservation = _pattern(r"^cr-[0-9a-f]{17}$")
ReservationType = Literal["odcr", "capacity-block"]
Az = _pattern(r"^[a-z]{2,4}(-[a-z]+)+-\d[a-z]$")
Time = _pattern(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?Z$")
_TIME_TEXT = "a UTC time such as 2026-12-01T11:30Z"
# An image reference as Batch and Docker take it (distribution/reference grammar): an optional
# registry host (a dot or a port, or localhost), path components of lower-case letters and digits
# joined by . _ __ or dashes, then an optional tag and an optional sha256 digest. Docker Hub short
# names (ubuntu:22.04, library/ubuntu, user/repo:tag) included; Batch takes up to 255 characters
# (API ContainerProperties.image).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:localhost(?::\d+)?|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+(?::\d+)?|[A-Za-z0-9-]+:\d+)"
Image = _pattern(
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$",
    max_length=255,
)
Ami = _pattern(r"^ami-[0-9a-f]{8}([0-9a-f]{9})?$")
# An IPv4 CIDR or a managed prefix list id.
SshSource = _pattern(
    r"^(((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)/(3[0-2]|[12]?\d)|pl-[0-9a-f]{8,17})$"
)
KeyName = _pattern(r"^[\x20-\x7e]{1,255}$")
Email = _pattern(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
# Secrets Manager CreateSecret Name: 1..512 of letters, digits and /_+=.@- (API reference).
SecretName = _pattern(r"^[A-Za-z0-9/_+=.@-]{1,512}$")
# A team on FIFO queues: the value of the trainctl:team tag (budget_ledger/ledger.py).
TEAM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
TeamName = _pattern(TEAM_PATTERN)
_IMAGE_TEXT = "an image as Batch takes it: ubuntu:22.04, user/repo:tag, registry/repo:tag or @sha256:digest"
_RESERVATION_TEXT = "cr- followed by 17 hex digits"


def key(alias: str, default: Any, allowed: str, meaning: str, **constraints: Any) -> Any:
    return Field(default, alias=alias, description=meaning, json_schema_extra={"allowed": allowed}, **constraints)


def ranged(alias: str, default: int, bounds: tuple[int, int], meaning: str, note: str = "") -> Any:
    """An integer key within `bounds`, both ends included."""
    allowed = f"integer {bounds[0]}..{bounds[1]}{note}"
    return key(alias, default, allowed, meaning, ge=bounds[0], le=bounds[1])


class FleetModel(BaseModel):
    """One entry of the `fleets` key."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    instance_type: str = key("instanceType", ..., "EFA-capable catalog types: " + ", ".join(EFA_TYPES), "instance type")
    nodes: Int = ranged("nodes", limits.MIN_NODES, (limits.MIN_NODES, limits.MAX_NODES), "nodes per multi-node job")
    max_nodes: Int | None = key(
        "maxNodes", None, f"integer nodes..{limits.MAX_NODES} (default: the larger of nodes and 4)",
        "nodes the compute environment may scale to", ge=limits.MIN_NODES, le=limits.MAX_NODES,
    )  # fmt: skip
    availability_zone: Az = key(
        "availabilityZone", None, "an AZ name such as us-east-1b, in the stack's region", "AZ of the fleet"
    )
    capacity_reservation_id: Reservation = key(
        "capacityReservationId", None, _RESERVATION_TEXT, "ODCR or capacity block"
    )
    capacity_reservation_type: ReservationType = key(
        "capacityReservationType", "odcr", "odcr or capacity-block", "what capacityReservationId names"
    )
    # A Capacity Block's window when the fleet's own placement is one (config/placements.py own_window).
    start: Time = key("start", None, _TIME_TEXT, "Capacity Block's start, with capacityReservationType capacity-block")
    end: Time = key("end", None, _TIME_TEXT, "Capacity Block's end, with capacityReservationType capacity-block")
    image: Image = key("image", None, _IMAGE_TEXT, "existing image to use instead of building one")
    ami_id: Ami = key("amiId", None, "ami- followed by 8 or 17 hex digits", "fixed Neuron AMI")
    fallback: list[PlacementModel] | None = key(
        "fallback", None, FIELDS_TEXT, "where jobs go, in order, when the fleet's own place has no capacity"
    )


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _flat_fleet_keys(prefix: str, family: str, types: tuple[str, ...], default_type: str) -> dict[str, Any]:
    """The flat keys of one default fleet: the fleet fields under prefixed names, plus the purchase
    option (only on-demand exists for multi-node jobs, but the key is a documented promise)."""
    fields: dict[str, Any] = {}
    for name in FLAT_FIELDS:
        suffix = upper_first(name)
        source = FleetModel.model_fields[snake(name)]
        allowed = source.json_schema_extra["allowed"].replace("nodes", f"{prefix}Nodes")
        default = source.default
        if name == "instanceType":
            allowed, default = f"none, or EFA-capable {family} types: " + ", ".join(types), default_type
        meaning = source.description.replace("capacityReservationId", f"{prefix}CapacityReservationId")
        meaning = f"{family} fleet `{prefix}`: {meaning}"
        # The fleet field's type with its validators and bounds, under the flat key's name.
        kind = Annotated[source.annotation, *source.metadata] if source.metadata else source.annotation
        fields[f"{prefix}_{snake(suffix)}"] = (kind, key(prefix + suffix, default, allowed, meaning))
    spot = "on-demand (multi-node jobs do not run on Spot)"
    option = key(f"{prefix}PurchaseOption", "on-demand", spot, f"{family} fleet `{prefix}`: purchase option")
    fields[f"{prefix}_purchase_option"] = (Literal["on-demand", "spot"], option)
    return fields


class _ContextBase(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=False)

    fleets: Annotated[dict[str, FleetModel] | None, BeforeValidator(_json_object)] = key(
        "fleets", None, "a JSON object: fleet name (a letter, then letters and digits) -> {" + ", ".join(
            f.alias for f in FleetModel.model_fields.values()) + "}", "named fleets instead of the flat fleet keys"
    )  # fmt: skip
    availability_zone: Az = key(
        "availabilityZone", None, "an AZ name such as us-east-1a, in the stack's region", "default AZ of the fleets"
    )
    skip_zone_table: str = key(
        "skipZoneTable", "", "empty, or a comma list of region names such as cn-north-1",
        "regions whose AZ names synth takes without checking config/availability_zones.json (a synth warning "
        "says so; for a zone AWS added after the table's date)",
    )  # fmt: skip
    nat_gateways: Int = key("natGateways", 1, "integer 1..2", "NAT gateways", ge=1)
    interface_endpoints: str = key(
        "interfaceEndpoints", "", "comma-separated subset of: " + ", ".join(limits.INTERFACE_ENDPOINTS), "endpoints"
    )
    log_retention_days: Int = key(
        "logRetentionDays", 30, "one of " + ", ".join(map(str, limits.LOG_RETENTION_DAYS)), "log retention"
    )
    root_volume_gib: Int = ranged("rootVolumeGib", 300, (limits.MIN_ROOT_GIB, limits.MAX_ROOT_GIB), "root GiB")
    root_volume_throughput: Int = ranged(
        "rootVolumeThroughput", 500, limits.GP3_THROUGHPUT, "root volume MiB/s", " MiB/s, at most rootVolumeIops / 4"
    )
    root_volume_iops: Int = ranged("rootVolumeIops", 6000, limits.GP3_IOPS, "root volume IOPS")
    job_timeout_seconds: Int = ranged("jobTimeoutSeconds", 3600, limits.JOB_TIMEOUT_SECONDS, "attempt timeout")
    job_attempts: Int = ranged("jobAttempts", 3, (1, limits.MAX_ATTEMPTS), "attempts per job (infrastructure failures)")
    runnable_timeout_minutes: Int = ranged(
        "runnableTimeoutMinutes",
        60,
        limits.RUNNABLE_TIMEOUT_MINUTES,
        "minutes before a job that cannot run is cancelled",
    )
    alert_email: Email = key("alertEmail", None, "an email address", "subscriber of the job-alert topic")
    health_check_schedule: str = key(
        "healthCheckSchedule", "", "empty (none), rate(N minutes|hours|days) from 1 hour to "
        f"{limits.MAX_HEALTH_CHECK_DAYS} days, or cron(min hour * * ? *) with every day in its day fields, one minute "
        "value and any hours (at most once an hour)",
        "scheduled fleet check (the benchmark job) per fleet, with alarms to the job-alert topic",
    )  # fmt: skip
    shares: str = key(
        "shares", "", "empty (FIFO queues), or a comma list of identifier:share; identifier up to 255 letters and "
        f"digits (a trailing * makes it a prefix), share 1..{limits.MAX_SHARE}, at most "
        f"{limits.MAX_SHARE_IDENTIFIERS} identifiers", "fair-share identifiers and their relative shares",
    )  # fmt: skip
    budgets: Annotated[dict[str, Any] | None, BeforeValidator(_json_object)] = key(
        "budgets", None, "empty (none), or a JSON object: team -> monthly US dollars (a number above 0); a team is a "
        "`shares` identifier on fair-share queues, else a name of letters, digits, - and _ (the trainctl:team tag)",
        "monthly budgets in US dollars per team: jobs that would overspend are refused, a team at 100% is stopped "
        "(docs/budgets.md)",
    )  # fmt: skip
    budget_prices: Annotated[dict[str, Any] | None, BeforeValidator(_json_object)] = key(
        "budgetPrices", None, "a JSON object: fleet name -> US dollars per instance-hour (a number above 0)",
        "what an instance-hour of a fleet costs for budgets, instead of config/prices.py (a reservation's price); "
        "outside us-east-1 every fleet needs one",
    )  # fmt: skip
    budget_default_team: TeamName = key(
        "budgetDefaultTeam", None, "a team of `budgets`; only with FIFO queues (no `shares`)",
        "the team a job that names none counts against (FIFO queues; default: such jobs count against no budget)",
    )  # fmt: skip
    job_secrets: Annotated[str, BeforeValidator(_comma_list)] = key(
        "jobSecrets", "", f"empty (none), or {ALLOWED_RULE}",
        "the Secrets Manager secrets and SSM parameters jobs may take as `secrets:` (docs/jobs.md, Secrets): an "
        "execution role that reads exactly these goes on every job definition",
    )  # fmt: skip
    ecs_exec: Bool = key(
        "ecsExec", True, "true or false", "ECS Exec into job containers (`trainctl exec`); false removes it and its IAM"
    )
    template_validation: Bool = key(
        "templateValidation", False, "true or false (true in make deploy)",
        "CloudFormation's own validation of every template at synth (about 2 s more); an error fails synth",
    )  # fmt: skip
    parallel_cluster: Bool = key(
        "parallelCluster",
        False,
        "true or false (true is slurm=parallelcluster)",
        "add the optional ParallelCluster stack",
    )
    slurm: Literal["none", "parallelcluster", "pcs"] = key(
        "slurm", "none", "none, parallelcluster or pcs (AWS Parallel Computing Service, managed Slurm)",
        "which optional Slurm cluster to add (docs/slurm.md); one at most",
    )  # fmt: skip
    pcs_instance_type: str = key(
        "pcsInstanceType", "p5e.48xlarge", "comma list of EFA-capable types: " + ", ".join(EFA_TYPES),
        "PCS compute node groups, one per type",
    )  # fmt: skip
    pcs_max_nodes: Int = ranged(
        "pcsMaxNodes", 2, (1, pcs.MAX_CLUSTER_NODES), "PCS compute node group MaxInstanceCount",
        "; all groups plus the login node at most 2048 (PCS size LARGE)",
    )  # fmt: skip
    pcs_login_instance_type: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")] = key(
        "pcsLoginInstanceType", "m7i.xlarge", "an EC2 instance type name such as m7i.2xlarge", "PCS login node type"
    )
    pcs_ami_id: Ami = key(
        "pcsAmiId", None, "ami- followed by 8 or 17 hex digits; required with slurm=pcs",
        "pinned AMI of the PCS nodes: PCS agent and Slurm 25.11 (docs/slurm.md, finding the AMI)",
    )  # fmt: skip
    pcs_accounting_purge_days: Int = ranged(
        "pcsAccountingPurgeDays", 365, pcs.PURGE_DAYS, "days PCS keeps Slurm accounting records (sacct)"
    )
    pcluster_instance_type: str = key(
        "pclusterInstanceType", "p5e.48xlarge", "comma list of EFA-capable types: " + ", ".join(EFA_TYPES), "queues"
    )
    pcluster_max_nodes: Int = ranged("pclusterMaxNodes", 2, (1, limits.MAX_NODES), "Slurm queue MaxCount")
    pcluster_head_node_instance_type: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")] = key(
        "pclusterHeadNodeInstanceType", "m7i.xlarge", "an EC2 instance type name such as m7i.2xlarge", "head node type"
    )
    pcluster_ssh_source: SshSource = key(
        "pclusterSshSource", None, "an IPv4 CIDR such as 203.0.113.0/24, or a prefix list id pl-...", "SSH source"
    )
    pcluster_key_name: KeyName = key("pclusterKeyName", None, "an EC2 key pair name", "key pair of the head node")
    pcluster_capacity_reservation_id: Reservation = key(
        "pclusterCapacityReservationId", None, _RESERVATION_TEXT, "ODCR or capacity block for the Slurm nodes"
    )
    pcluster_capacity_reservation_type: ReservationType = key(
        "pclusterCapacityReservationType", "odcr", "odcr or capacity-block", "what pclusterCapacityReservationId names"
    )
    fsx_capacity_gib: Int = ranged(
        "fsxCapacityGib", limits.FSX_MIN_CAPACITY_GIB, (limits.FSX_MIN_CAPACITY_GIB, limits.FSX_MAX_CAPACITY_GIB),
        "FSx for Lustre GiB", f": 1200, 2400, then steps of {limits.FSX_CAPACITY_STEP_GIB}",
    )  # fmt: skip
    fsx_throughput: Int = key(
        "fsxThroughput", 250, "one of " + ", ".join(map(str, limits.FSX_THROUGHPUTS)), "FSx for Lustre MB/s per TiB"
    )
    pcluster_deletion_policy: Literal["Retain", "Delete"] = key(
        "pclusterDeletionPolicy", "Retain", "Retain or Delete", "whether deleting the stack deletes the cluster"
    )
    image_build: Literal["local", "cloud"] = key(
        "imageBuild", "local", "local (Docker on the deploying machine) or cloud (AWS CodeBuild at deploy)",
        "where the training images are built",
    )  # fmt: skip
    ngc_secret: SecretName = key(
        "ngcSecret", None, "a Secrets Manager secret name (letters, digits, /_+=.@-)",
        "secret holding an NGC API key for the cloud build's nvcr.io login",
    )  # fmt: skip


def _context_model() -> type[BaseModel]:
    fields = {k: v for prefix, spec in FLAT_FLEETS.items() for k, v in _flat_fleet_keys(prefix, *spec).items()}
    return create_model("Context", __base__=_ContextBase, **fields)


Context = _context_model()


@dataclass(frozen=True)
class ContextKey:
    name: str
    default: Any
    allowed: str
    meaning: str


KEYS: dict[str, ContextKey] = {
    f.alias: ContextKey(f.alias, f.default, f.json_schema_extra["allowed"], f.description)
    for f in sorted(Context.model_fields.values(), key=lambda f: f.alias.lower())
}
