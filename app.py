#!/usr/bin/env python3
"""CDK entry point: read the context once, build the stacks, check them with cdk-nag (and with
CloudFormation's own validation when templateValidation=true)."""

from __future__ import annotations

import functools
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import Duration
from cdk_nag import AwsSolutionsChecks

from config.context import ConfigError, read_settings
from config.settings import AppSettings
from stacks.compute_stack import ComputeStack
from stacks.data_stack import DataStack
from stacks.jobs_stack import JobsStack
from stacks.monitoring_stack import MonitoringStack
from stacks.network_stack import NetworkStack
from stacks.parallel_cluster_stack import ParallelClusterStack
from stacks.pcs_stack import PcsStack
from stacks.registry_stack import RegistryStack
from training_constructs.common.retention import retention_days
from training_constructs.images.training_image import CONTAINER_DIR

STACK_PREFIX = "Training"


@functools.cache
def cloudformation_validation() -> cdk.CloudFormationValidatePlugin:
    """CDK's CloudFormation validation plugin, made once per process (its engine takes about 1.5 s to
    build) and shared by every App that asks, as CDK shares its built-in instance."""
    return cdk.CloudFormationValidatePlugin()


def build_app(
    app: cdk.App,
    settings: AppSettings,
    env: cdk.Environment,
    *,
    container_dir: Path = CONTAINER_DIR,
    nag: bool = True,
) -> None:
    """Add every stack to `app`. Tests call this with their own App and settings, another
    container/ folder, or `nag=False`, which leaves cdk-nag out, for tests that only compare or read
    templates (the templates are the same)."""
    retention = retention_days(settings.log_retention_days)
    network = NetworkStack(
        app,
        f"{STACK_PREFIX}Network",
        settings=settings.network,
        log_retention=retention,
        env=env,
        description="Training platform: VPC, training subnet, NAT, S3 endpoint, flow logs, EFA security group",
    )
    compute = ComputeStack(
        app,
        f"{STACK_PREFIX}Compute",
        network=network.network,
        fleets=settings.fleets,
        root_volume=settings.root_volume,
        log_retention=retention,
        default_availability_zone=settings.network.availability_zone,
        env=env,
        description="Training platform: EFA launch templates, placement groups, Batch compute environments",
    )
    registry = RegistryStack(
        app,
        f"{STACK_PREFIX}Registry",
        fleets=settings.fleets,
        images=settings.images,
        log_retention=retention,
        container_dir=container_dir,
        env=env,
        description="Training platform: training images (built from container/) and the team ECR repository",
    )
    data = DataStack(
        app,
        f"{STACK_PREFIX}Data",
        env=env,
        description="Training platform: dataset and checkpoint buckets (retained) and their access logs",
    )
    jobs = JobsStack(
        app,
        f"{STACK_PREFIX}Jobs",
        fleets=settings.fleets,
        compute=compute.fleets,
        registry=registry,
        datasets=data.datasets,
        checkpoints=data.checkpoints,
        jobs=settings.jobs,
        log_retention=retention,
        env=env,
        description="Training platform: multi-node job definitions, job queues, job role, job logs, job alerts",
    )
    # Built images are published with the registry stack; job definitions must not point at an
    # image before it exists.
    jobs.add_stack_dependency(registry)
    # The jobs stack reads the buckets through named exports, which CDK does not track as a
    # reference between the stacks.
    jobs.add_stack_dependency(data)
    MonitoringStack(
        app,
        f"{STACK_PREFIX}Monitoring",
        fleets=settings.fleets,
        alert_topic=jobs.alerts.topic,
        job_events=jobs.job_metrics.log_group,
        runnable_timeout=Duration.minutes(settings.jobs.runnable_timeout_minutes),
        budgets=settings.jobs.budgets,
        env=env,
        description="Training platform: dashboard of jobs, nodes, GPUs and EFA per fleet, and alarms to the job alerts",
    )
    if settings.parallel_cluster.enabled:
        cluster = ParallelClusterStack(
            app,
            f"{STACK_PREFIX}ParallelCluster",
            network=network.network,
            datasets=data.datasets,
            checkpoints=data.checkpoints,
            team_repository=registry.repository,
            settings=settings.parallel_cluster,
            log_retention_days=settings.log_retention_days,
            root_volume_gib=settings.root_volume_gib,
            availability_zone=settings.network.availability_zone,
            env=env,
            description="Training platform: optional AWS ParallelCluster (Slurm) cluster with FSx for Lustre",
        )
        cluster.add_stack_dependency(data)
    if settings.pcs:
        managed = PcsStack(
            app,
            f"{STACK_PREFIX}Pcs",
            network=network.network,
            datasets=data.datasets,
            checkpoints=data.checkpoints,
            team_repository=registry.repository,
            settings=settings.pcs,
            fsx_capacity_gib=settings.parallel_cluster.fsx_capacity_gib,
            fsx_throughput=settings.parallel_cluster.fsx_throughput,
            root_volume=settings.root_volume,
            availability_zone=settings.network.availability_zone,
            env=env,
            description="Training platform: optional managed Slurm on AWS PCS with FSx for Lustre",
        )
        # The buckets come through named exports, which CDK does not track as a reference.
        managed.add_stack_dependency(data)
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    if settings.template_validation:
        # CloudFormation's own validation (aws-cdk-lib's plugin, a WASM engine) costs about 2 s of
        # every synth, so main() turns CDK's built-in instance off and this adds it on request
        # (`make deploy` asks). The tests validate every template shape this way (tests/harness.py).
        cdk.Validations.of(app).add_plugins(cloudformation_validation())


def main() -> None:
    app = cdk.App(builtin_cloud_formation_validation=False)  # templateValidation=true adds it (build_app)
    # Set by the CDK CLI when it knows them; without them the stacks are environment-agnostic.
    env = cdk.Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION"))
    try:
        settings = read_settings(app.node.get_all_context(), region=env.region, now=datetime.now(UTC))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    build_app(app, settings, env)
    app.synth()


if __name__ == "__main__":
    main()
