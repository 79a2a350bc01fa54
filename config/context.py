"""Reads the app's context keys once, checks the rules between them and builds AppSettings.

The keys themselves are declared in config/context_keys.py, and the fleets' keys are read in
config/context_fleets.py. Values from `-c key=value` arrive as strings, values from cdk.json as JSON
types; both are accepted. The first problem found is raised as a one-line ConfigError that names the key
(or `fleets.<name>.<field>`), the value and what is allowed (config/key_refusals.py words it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from config import limits, pcs, refusals, schedule_rules
from config.budgets import read_budgets
from config.context_fleets import check_az, instance_of, read_fleets, refuse_ended_windows, zone_table_skips
from config.context_keys import EFA_TYPES, KEYS, ConfigError, Context
from config.instance_types import botocore_version, ec2_instance_types
from config.job_secrets import ALLOWED, MAX_ALLOWED
from config.key_refusals import fail, from_pydantic
from config.settings import (
    AppSettings,
    FleetSettings,
    HealthCheckSchedule,
    ImageSettings,
    JobSettings,
    NetworkSettings,
    ParallelClusterSettings,
    PcsSettings,
    RootVolume,
    Share,
)


def check_keys(context: Mapping[str, Any]) -> None:
    """Refuse context keys that look like ours but are not: a wrong case or a near miss."""
    known = {k.lower(): k for k in KEYS}
    for name in sorted(context):
        if name in KEYS or not re.match(r"^[A-Za-z][A-Za-z0-9]*$", name):
            continue  # namespaced keys (feature flags, aws:cdk:*) belong to CDK
        guess = known.get(name.lower()) or next(iter(difflib.get_close_matches(name, KEYS, n=1, cutoff=0.75)), None)
        hint = (
            f"did you mean {guess}?" if guess else refusals.did_you_mean(name, KEYS, "docs/reference/context-keys.md")
        )
        raise ConfigError(f"unknown context key {name!r}: {hint}")


def _network(ctx: Any, fleets: tuple[FleetSettings, ...], slurm: dict[str, int], region: str | None) -> NetworkSettings:
    az = ctx.availability_zone
    skipped = zone_table_skips(ctx)
    check_az("availabilityZone", az, region, skipped)
    if ctx.nat_gateways > 2:
        raise fail("natGateways", ctx.nat_gateways, "out of range 1..2 (one per public subnet)")
    # Every placement of a fleet (its own, then its fallback ones) has a subnet in its AZ.
    zones = [p.availability_zone for f in fleets for p in f.placements]
    named = tuple(dict.fromkeys(z for z in zones if z not in (None, az)))
    # One CIDR block per named AZ of the fleets, and one for the Slurm cluster's own subnet.
    blocks = len({z or az for z in zones} - {None}) + (1 if slurm and az else 0)
    if blocks > limits.MAX_NAMED_AZ_BLOCKS:
        problem = (
            f"fleets and the Slurm cluster name {blocks} subnets; a VPC holds {limits.VPC_CIDR_BLOCKS} CIDR "
            "blocks: its own and one for a fleet's move"
        )
        allowed = f"at most {limits.MAX_NAMED_AZ_BLOCKS} named AZs, Slurm's included"
        if az:
            raise fail("availabilityZone", az, problem, allowed)
        raise fail("fleets", f"{blocks} AZs", problem, allowed)
    _check_subnet_room(fleets, slurm, az)
    names = tuple(dict.fromkeys(n.strip() for n in ctx.interface_endpoints.split(",") if n.strip()))
    unknown = [n for n in names if n not in limits.INTERFACE_ENDPOINTS]
    if unknown:
        raise fail("interfaceEndpoints", ctx.interface_endpoints, f"unknown service {refusals.shown(unknown[0])}")
    return NetworkSettings(
        availability_zone=az,
        fleet_availability_zones=named,
        nat_gateways=ctx.nat_gateways,
        interface_endpoints=names,
        zone_table_skipped=tuple(sorted(skipped)),
    )


def _check_subnet_room(fleets: tuple[FleetSettings, ...], slurm: dict[str, int], az: str | None) -> None:
    """Everything that shares a training subnet must fit in it at its largest; otherwise EC2 runs
    out of addresses while Batch or Slurm scales out, and jobs wait forever. A fleet lives in its
    AZ's subnet (the VPC's first when no AZ is named); the Slurm cluster shares the VPC's first
    subnet when availabilityZone is unset, and has a subnet of its own otherwise."""
    users: dict[str, dict[str, int]] = {}
    for fleet in fleets:
        for number, placement in enumerate(fleet.placements):
            where = placement.availability_zone or az or "the VPC's first training subnet"
            per_node = placement.instance.node_interfaces + limits.TASK_ENIS_PER_NODE
            user = f"fleet {fleet.name}" + (f" fallback {number}" if number else "")
            users.setdefault(where, {})[user] = fleet.max_nodes * per_node
    if slurm:
        where = f"the Slurm cluster's subnet in {az}" if az else "the VPC's first training subnet"
        users.setdefault(where, {}).update(slurm)
    for where, need in users.items():
        if sum(need.values()) > limits.TRAINING_SUBNET_ADDRESSES:
            # The two largest users; docs/fleets.md explains the count per node.
            largest = sorted(need.items(), key=lambda item: -item[1])
            detail = ", ".join(f"{name}: {n}" for name, n in largest[:2])
            detail += f", {len(largest) - 2} more" if len(largest) > 2 else ""
            raise ConfigError(
                f"context: {where} needs {sum(need.values())} addresses at maxNodes ({detail}), over a "
                f"/{limits.TRAINING_SUBNET_MASK}'s {limits.TRAINING_SUBNET_ADDRESSES}; lower the max nodes or set an "
                "availabilityZone"
            )


def _slurm_addresses(cluster: ParallelClusterSettings, managed: PcsSettings | None) -> dict[str, int]:
    """The addresses the Slurm cluster takes in its subnet at its largest, by user; empty without one."""
    if cluster.enabled:
        need = {f"Slurm {spec.name}": cluster.max_nodes * limits.SLURM_ADDRESSES_PER_NODE for spec in cluster.instances}
        return need | {"Slurm head node": 1}
    if managed:
        # Every launch-template interface of a PCS node takes an address (training_constructs/compute/
        # efa_launch_template.py; no task ENI on Slurm nodes); PCS's controller takes one in the subnet.
        need = {f"PCS {spec.name}": managed.max_nodes * spec.node_interfaces for spec in managed.instances}
        return need | {"PCS login and controller": pcs.LOGIN_NODES + 1}
    return {}


def _pcs(ctx: Any) -> PcsSettings | None:
    if ctx.parallel_cluster and ctx.slurm == "pcs":
        raise ConfigError(
            "context keys parallelCluster=true and slurm=pcs cannot be used together: pick one Slurm option"
        )
    if ctx.slurm != "pcs":
        return None
    if not ctx.pcs_ami_id:
        raise ConfigError(
            f"context key pcsAmiId: required with slurm=pcs, the ami- id of a PCS-ready AMI with Slurm "
            f"{pcs.SLURM_VERSION} in the stack's region (docs/slurm.md, finding the AMI)"
        )
    login = ctx.pcs_login_instance_type
    if login not in ec2_instance_types():
        allowed = refusals.did_you_mean(login, ec2_instance_types(), "aws ec2 describe-instance-types")
        raise fail("pcsLoginInstanceType", login, f"not an EC2 instance type (botocore {botocore_version})", allowed)
    names = list(dict.fromkeys(n.strip() for n in ctx.pcs_instance_type.split(",") if n.strip()))
    if not names:
        raise fail("pcsInstanceType", ctx.pcs_instance_type, "empty")
    settings = PcsSettings(
        instances=tuple(instance_of("pcsInstanceType", n, EFA_TYPES, "EFA-capable") for n in names),
        max_nodes=ctx.pcs_max_nodes,
        login_instance_type=login,
        ami_id=ctx.pcs_ami_id,
        accounting_purge_days=ctx.pcs_accounting_purge_days,
    )
    if settings.cluster_nodes > pcs.MAX_CLUSTER_NODES:
        problem = (
            f"{len(names)} node group(s) x {settings.max_nodes} + {pcs.LOGIN_NODES} login = {settings.cluster_nodes} "
            f"nodes, over PCS's largest size (LARGE, {pcs.MAX_CLUSTER_NODES})"
        )
        raise fail("pcsMaxNodes", settings.max_nodes, problem, "fewer nodes or node groups")
    return settings


def _shares(raw: str) -> tuple[Share, ...]:
    if not raw.strip():
        return ()
    shares: list[Share] = []
    for item in (i.strip() for i in raw.split(",")):
        match = re.fullmatch(r"(?P<identifier>[A-Za-z0-9]{1,255}\*?):(?P<share>\d{1,4})", item)
        if not match or not 1 <= int(match["share"]) <= limits.MAX_SHARE:
            raise fail("shares", raw, f"entry {refusals.shown(item)} is not identifier:share")
        shares.append(Share(identifier=match["identifier"], share=int(match["share"])))
    if len(shares) > limits.MAX_SHARE_IDENTIFIERS:
        raise fail("shares", raw, f"{len(shares)} identifiers")
    for i, a in enumerate(shares):
        for b in shares[i + 1 :]:
            # Batch refuses overlapping entries: a duplicate, or a prefix entry covering another.
            if a.identifier == b.identifier or any(
                x.identifier.endswith("*") and y.identifier.startswith(x.identifier[:-1]) for x, y in ((a, b), (b, a))
            ):
                raise fail("shares", raw, f"{refusals.shown(a.identifier)} and {refusals.shown(b.identifier)} overlap")
    return tuple(shares)


def _job_secrets(raw: str) -> tuple[str, ...]:
    """The jobSecrets entries, each an ARN the execution role may read (a trailing * as IAM reads it)."""
    entries = tuple(dict.fromkeys(item.strip() for item in raw.split(",") if item.strip()))
    for number, entry in enumerate(entries, start=1):
        if not ALLOWED.match(entry):
            which = "" if len(entries) == 1 else f"entry {number} {refusals.shown(entry)}: "
            raise fail("jobSecrets", raw, f"{which}not a secret or parameter ARN")
    if len(entries) > MAX_ALLOWED:
        raise fail("jobSecrets", raw, f"{len(entries)} entries, over {MAX_ALLOWED}: end shared prefixes with *")
    return entries


_RATE_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def _health_check_schedule(raw: str) -> HealthCheckSchedule | None:
    """An EventBridge schedule expression (EventBridge user guide, "Schedule expressions for rules":
    rate(value unit), unit singular for 1 and plural otherwise; cron with six fields)."""
    text = raw.strip()
    if not text:
        return None
    if len(text) > limits.MAX_SCHEDULE_EXPRESSION:
        raise fail("healthCheckSchedule", raw, f"longer than {limits.MAX_SCHEDULE_EXPRESSION} characters")
    rate = re.fullmatch(r"rate\((?P<n>[1-9]\d*) (?P<unit>minute|hour|day)(?P<plural>s?)\)", text)
    if rate:
        if (rate["n"] == "1") == bool(rate["plural"]):
            raise fail("healthCheckSchedule", raw, "the unit is singular for 1 and plural otherwise")
        interval = int(rate["n"]) * _RATE_SECONDS[rate["unit"]]
        if not 3600 <= interval <= limits.MAX_HEALTH_CHECK_DAYS * 86400:
            raise fail("healthCheckSchedule", raw, "out of range")
        return HealthCheckSchedule(expression=text, interval_seconds=interval)
    if text.startswith(("rate(", "cron(")) and not text.endswith(")"):
        # rate(1 or cron(0: the rest went to other words, where escaped parentheses left it unquoted.
        allowed = refusals.quote_schedule("healthCheckSchedule", text)
        raise fail("healthCheckSchedule", raw, "cut short at a space by the shell", allowed)
    cron = re.fullmatch(r"cron\((?P<fields>[^()]+)\)", text)
    fields = cron["fields"].split() if cron else []
    if len(fields) != 6:
        raise fail("healthCheckSchedule", raw, "not a rate(...) or six-field cron(...) expression")
    if not all(re.fullmatch(r"[0-9A-Za-z*?/,#L-]+", f) for f in fields):
        raise fail("healthCheckSchedule", raw, "malformed cron field")
    problem = schedule_rules.cron_problem(fields)
    if problem:
        raise fail("healthCheckSchedule", raw, problem)
    if fields[5] != "*":
        # A year field ends the schedule; from then on only the missing-verdict alarm would fire.
        raise fail("healthCheckSchedule", raw, "the year field must be * (a check that stops leaves its alarm firing)")
    # The missing-verdict alarm needs a bounded gap between runs: a cron that runs every day.
    if fields[2] not in ("*", "?") or fields[3] != "*" or fields[4] not in ("*", "?"):
        raise fail("healthCheckSchedule", raw, "a cron schedule must run every day (day fields * or ?)")
    # EventBridge takes a value or * in only one of day-of-month and day-of-week, and ? in the other
    # (EventBridge user guide, "Schedule expressions for rules", cron expressions).
    if sorted((fields[2], fields[4])) != ["*", "?"]:
        raise fail("healthCheckSchedule", raw, "one of day-of-month and day-of-week must be ?, the other *")
    # Each run submits a multi-node benchmark: at most once an hour, so one minute of the hour. Any hours
    # (one, a list, a range or a step) then give at most 24 runs a day.
    if not fields[0].isdigit():
        raise fail("healthCheckSchedule", raw, "runs more than once an hour; the minute must be one value (0-59)")
    hours = schedule_rules.values(schedule_rules.FIELDS[1], fields[1])
    return HealthCheckSchedule(expression=text, interval_seconds=schedule_rules.longest_gap_hours(hours) * 3600)


def _parallel_cluster(ctx: Any) -> ParallelClusterSettings:
    capacity = ctx.fsx_capacity_gib
    if capacity != limits.FSX_MIN_CAPACITY_GIB and capacity % limits.FSX_CAPACITY_STEP_GIB:
        raise fail("fsxCapacityGib", capacity, f"not 1200 or a multiple of {limits.FSX_CAPACITY_STEP_GIB}")
    if ctx.fsx_throughput not in limits.FSX_THROUGHPUTS:
        raise fail("fsxThroughput", ctx.fsx_throughput, "not a PERSISTENT_2 throughput")
    if ctx.pcluster_capacity_reservation_type == "capacity-block" and not ctx.pcluster_capacity_reservation_id:
        problem = "needs pclusterCapacityReservationId, the block's cr- id"
        raise fail("pclusterCapacityReservationType", "capacity-block", problem)
    head = ctx.pcluster_head_node_instance_type
    if head not in ec2_instance_types():
        allowed = refusals.did_you_mean(head, ec2_instance_types(), "aws ec2 describe-instance-types")
        raise fail(
            "pclusterHeadNodeInstanceType", head, f"not an EC2 instance type (botocore {botocore_version})", allowed
        )
    names = list(dict.fromkeys(n.strip() for n in ctx.pcluster_instance_type.split(",") if n.strip()))
    if not names:
        raise fail("pclusterInstanceType", ctx.pcluster_instance_type, "empty")
    return ParallelClusterSettings(
        enabled=ctx.parallel_cluster or ctx.slurm == "parallelcluster",
        instances=tuple(instance_of("pclusterInstanceType", n, EFA_TYPES, "EFA-capable") for n in names),
        max_nodes=ctx.pcluster_max_nodes,
        head_node_instance_type=ctx.pcluster_head_node_instance_type,
        ssh_source=ctx.pcluster_ssh_source,
        key_name=ctx.pcluster_key_name,
        capacity_reservation_id=ctx.pcluster_capacity_reservation_id,
        capacity_reservation_type=ctx.pcluster_capacity_reservation_type,
        fsx_capacity_gib=capacity,
        fsx_throughput=ctx.fsx_throughput,
        deletion_policy=ctx.pcluster_deletion_policy,
    )


def read_settings(context: Mapping[str, Any], *, region: str | None = None, now: datetime | None = None) -> AppSettings:
    """Build AppSettings from the app's context. Raises ConfigError on the first bad value. With `now`
    (app.py passes the clock; tests a fixed time), a Capacity Block whose window has ended is refused."""
    check_keys(context)
    given = {k: v for k, v in context.items() if k in KEYS and v is not None}
    try:
        ctx = Context.model_validate(given)
        fleets = read_fleets(ctx, given, region)
    except ValidationError as error:
        raise from_pydantic(error, given) from None
    if now is not None:
        refuse_ended_windows(fleets, now)
    if ctx.log_retention_days not in limits.LOG_RETENTION_DAYS:
        near = sorted(sorted(limits.LOG_RETENTION_DAYS, key=lambda d: abs(d - ctx.log_retention_days))[:2])
        allowed = f"a CloudWatch Logs retention such as {near[0]} or {near[1]} (docs/reference/context-keys.md)"
        raise fail("logRetentionDays", ctx.log_retention_days, "not a value CloudWatch Logs accepts", allowed)
    parallel_cluster = ctx.parallel_cluster or ctx.slurm == "parallelcluster"
    if parallel_cluster and ctx.log_retention_days not in limits.PCLUSTER_LOG_RETENTION_DAYS:
        allowed = "with parallelCluster=true one of " + ", ".join(map(str, limits.PCLUSTER_LOG_RETENTION_DAYS))
        problem = "ParallelCluster refuses it"
        raise fail("logRetentionDays", ctx.log_retention_days, problem, allowed)
    if ctx.root_volume_throughput > ctx.root_volume_iops * limits.GP3_MIBPS_PER_IOPS:
        problem = f"above {limits.GP3_MIBPS_PER_IOPS} MiB/s per IOPS (rootVolumeIops={ctx.root_volume_iops})"
        raise fail("rootVolumeThroughput", ctx.root_volume_throughput, problem)
    cluster = _parallel_cluster(ctx)
    managed = _pcs(ctx)
    shares = _shares(ctx.shares)
    budgets = read_budgets(
        ctx.budgets,
        ctx.budget_prices,
        ctx.budget_default_team,
        fleets=fleets,
        shares=shares,
        timeout_seconds=ctx.job_timeout_seconds,
        region=region,
    )
    if ctx.ngc_secret and ctx.image_build != "cloud":
        raise fail("ngcSecret", ctx.ngc_secret, "only the cloud build reads it; add -c imageBuild=cloud")
    return AppSettings(
        network=_network(ctx, fleets, _slurm_addresses(cluster, managed), region),
        fleets=fleets,
        parallel_cluster=cluster,
        jobs=JobSettings(
            timeout_seconds=ctx.job_timeout_seconds,
            attempts=ctx.job_attempts,
            shares=shares,
            runnable_timeout_minutes=ctx.runnable_timeout_minutes,
            alert_email=ctx.alert_email,
            health_check_schedule=_health_check_schedule(ctx.health_check_schedule),
            ecs_exec=ctx.ecs_exec,
            budgets=budgets,
            job_secrets=_job_secrets(ctx.job_secrets),
        ),
        log_retention_days=ctx.log_retention_days,
        root_volume=RootVolume(
            size_gib=ctx.root_volume_gib, throughput_mibps=ctx.root_volume_throughput, iops=ctx.root_volume_iops
        ),
        images=ImageSettings(build=ctx.image_build, ngc_secret=ctx.ngc_secret),
        template_validation=ctx.template_validation,
        pcs=managed,
    )
