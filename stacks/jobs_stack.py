from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Acknowledgment, CfnOutput, Duration, Fn, Stack, Validations
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.metrics import FLEET_ENV
from config.settings import FleetSettings, JobSettings
from stacks.data_stack import ExportedBucket
from stacks.registry_stack import RegistryStack
from training_constructs.budgets.team_budgets import PricedQueue, TeamBudgets
from training_constructs.budgets.team_policies import TeamPolicies
from training_constructs.common.small_functions import alarm_on_errors
from training_constructs.compute.training_fleet import TrainingFleet
from training_constructs.health.boot_breaker import BootCircuitBreaker, BreakerFleet
from training_constructs.health.fleet_health import FleetHealth
from training_constructs.jobs.capacity_block_expiry.construct import CapacityBlockExpiry, block_placements
from training_constructs.jobs.capacity_fallback.construct import CapacityFallback
from training_constructs.jobs.capacity_fallback.routes import FallbackRoute
from training_constructs.jobs.job_secrets import JobSecretsAccess
from training_constructs.jobs.training_jobs import (
    BENCHMARK_TIMEOUT_SECONDS,
    TrainingJobs,
    grant_ecs_exec,
    grant_node_watch,
)
from training_constructs.observability.job_alerts import JobAlerts
from training_constructs.observability.job_metrics import JobMetrics
from training_constructs.observability.recovery_alerts import ResumedJobAlerts

# How long past usage counts against a share: an hour, so a team whose run just ended does not
# jump ahead of one that has been waiting (Batch user guide, fair-share scheduling).
SHARE_DECAY = Duration.hours(1)


class JobsStack(Stack):
    """Per fleet: a job queue (FIFO, or fair share when shares are given), the training and
    all-reduce job definitions and their log group; one job role for all, allowed to read datasets,
    write checkpoints and describe jobs (the main node watches its children); alerts for failed jobs
    (not those `trainctl cancel` ended) and resumed ones; with budgets, the team budgets' ledger and
    enforcement (output `Budgets`); with jobSecrets, the execution role every job definition names, which reads
    those secrets when a node starts (outputs `JobExecutionRole`, `JobSecrets`; docs/jobs.md, Secrets).

    Attribute `fleets`: fleet name -> TrainingJobs.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        fleets: Sequence[FleetSettings],
        compute: dict[str, TrainingFleet],
        registry: RegistryStack,
        datasets: ExportedBucket,
        checkpoints: ExportedBucket,
        jobs: JobSettings,
        log_retention: logs.RetentionDays,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)

        self.job_role = iam.Role(
            self,
            "JobRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description="Training job containers: read datasets, read and write checkpoints",
        )
        dataset_bucket = datasets.bucket(self, "Datasets")
        checkpoint_bucket = checkpoints.bucket(self, "Checkpoints")
        dataset_bucket.grant_read(self.job_role)
        checkpoint_bucket.grant_read(self.job_role)
        checkpoint_bucket.grant_put(self.job_role)
        # Rotation may delete a checkpoint: s3:DeleteObject on a versioned bucket only adds a delete
        # marker, and the older versions stay recoverable. Deleting a version (s3:DeleteObjectVersion)
        # would erase it for good: never granted (grant_read_write would, through s3:DeleteObject*),
        # and denied outright so that no later grant can add it.
        checkpoint_objects = checkpoint_bucket.arn_for_objects("*")
        every_object = [checkpoint_objects, dataset_bucket.arn_for_objects("*")]
        self.job_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:DeleteObject"], resources=[checkpoint_objects])
        )
        self.job_role.add_to_principal_policy(
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=["s3:DeleteObjectVersion"], resources=every_object)
        )
        self._acknowledge_bucket_grants(datasets, checkpoints)
        grant_node_watch(self.job_role)

        self.scheduling_policy: batch.FairshareSchedulingPolicy | None = None
        if jobs.shares:
            self.scheduling_policy = batch.FairshareSchedulingPolicy(
                self,
                "FairShare",
                share_decay=SHARE_DECAY,
                shares=[batch.Share(share_identifier=s.identifier, weight_factor=s.weight_factor) for s in jobs.shares],
            )
        environment = {
            "DATASET_BUCKET": dataset_bucket.bucket_name,
            "CHECKPOINT_BUCKET": checkpoint_bucket.bucket_name,
        }

        # With jobSecrets: the execution role every job definition names, which reads those secrets (and only
        # those) when a node starts; trainctl writes a job's `secrets` into its revision.
        self.job_secrets: JobSecretsAccess | None = None
        if jobs.job_secrets:
            self.job_secrets = JobSecretsAccess(self, "JobSecretsAccess", allowed=jobs.job_secrets)
        self.fleets: dict[str, TrainingJobs] = {}
        for fleet in fleets:
            created = TrainingJobs(
                self,
                fleet.construct_id,
                instance=fleet.instance,
                nodes=fleet.nodes,
                image_uri=registry.image_uri(fleet),
                compute_environment_arn=compute[fleet.name].compute_environment_arn,
                scheduling_policy=self.scheduling_policy,
                runnable_timeout=Duration.minutes(jobs.runnable_timeout_minutes),
                job_role=self.job_role,
                # The fleet's name: the Fleet dimension of what its jobs emit.
                environment={**environment, FLEET_ENV: fleet.name},
                checkpoint_uri=f"s3://{checkpoint_bucket.bucket_name}/{fleet.name}",
                timeout_seconds=jobs.timeout_seconds,
                attempts=jobs.attempts,
                log_retention=log_retention,
                ecs_exec=jobs.ecs_exec,
                fallback_compute_environment_arns=[
                    p.compute_environment_arn for p in compute[fleet.name].placements[1:]
                ],
                execution_role=self.job_secrets.role if self.job_secrets else None,
            )
            # Stable output names: the README's commands read them.
            for name, value in (
                ("JobQueue", created.job_queue.job_queue_arn),
                ("TrainingJobDefinition", created.training.job_definition_arn),
                ("BenchmarkJobDefinition", created.benchmark.job_definition_arn),
                ("LogGroup", created.log_group.log_group_name),
            ):
                CfnOutput(self, f"{fleet.construct_id}{name}", value=value)
            self.fleets[fleet.name] = created
            if fleet.fallback:
                # trainctl reads a fleet's placements from this: "<label>|<queue ARN>" in order, ';'-joined.
                CfnOutput(
                    self,
                    f"{fleet.construct_id}Placements",
                    value=Fn.join(
                        ";",
                        [
                            f"{p.label}|{q.job_queue_arn}"
                            for p, q in zip(fleet.placements, created.placement_queues, strict=True)
                        ],
                    ),
                )
        if self.job_secrets:
            self.job_secrets.allow_logs([f.log_group for f in self.fleets.values()])
            # trainctl reads these (trainctl/submitting/secrets.py): the role its revisions name, and what it may read.
            CfnOutput(self, "JobExecutionRole", value=self.job_secrets.role.role_arn)
            CfnOutput(self, "JobSecrets", value=",".join(jobs.job_secrets))
        if jobs.ecs_exec:
            grant_ecs_exec(self.job_role, [f.log_group for f in self.fleets.values()])
        self.capacity_fallback: CapacityFallback | None = None
        routes = [
            FallbackRoute(
                fleet=fleet.name,
                placements=fleet.placements,
                queues=self.fleets[fleet.name].placement_queues,
                job_definition_arns=[
                    self.fleets[fleet.name].training.job_definition_arn,
                    self.fleets[fleet.name].benchmark.job_definition_arn,
                ],
            )
            for fleet in fleets
            if fleet.fallback
        ]
        if routes:
            self.capacity_fallback = CapacityFallback(
                self, "CapacityFallback", routes=routes, log_retention=log_retention
            )

        self.alerts = JobAlerts(
            self,
            "JobAlerts",
            # Every placement's queue: a job sent on by the capacity fallback still alerts when it fails.
            job_queue_arns=[q.job_queue_arn for jobs_ in self.fleets.values() for q in jobs_.placement_queues],
            email=jobs.alert_email,
        )
        CfnOutput(self, "AlertTopic", value=self.alerts.topic.topic_arn)
        if routes:
            alarm_on_errors(
                self.capacity_fallback.function,
                self.alerts.topic,
                "jobs cancelled for lack of capacity are not sent to their fleet's next placement",
            )
        self.block_expiry: CapacityBlockExpiry | None = None
        blocks = block_placements(fleets, {name: jobs_.placement_queues for name, jobs_ in self.fleets.items()})
        if blocks:
            self.block_expiry = CapacityBlockExpiry(
                self, "CapacityBlockExpiry", blocks=blocks, topic=self.alerts.topic, log_retention=log_retention
            )
        self.resumed_alerts = ResumedJobAlerts(
            self,
            "ResumedJobAlerts",
            # The same queues as the failure alerts: a job resumed on a fallback placement is told too.
            job_queue_arns=[q.job_queue_arn for jobs_ in self.fleets.values() for q in jobs_.placement_queues],
            topic=self.alerts.topic,
            log_retention=log_retention,
        )
        self.job_metrics = JobMetrics(
            self,
            "JobMetrics",
            job_queue_arns={
                name: [q.job_queue_arn for q in jobs_.placement_queues] for name, jobs_ in self.fleets.items()
            },
            retention=log_retention,
        )

        self.budgets: TeamBudgets | None = None
        if jobs.budgets:
            self.budgets = TeamBudgets(
                self,
                "TeamBudgets",
                settings=jobs.budgets,
                queues=[
                    PricedQueue(
                        fleet=fleet.name,
                        instance_type=placement.instance.name,
                        queue=queue,
                        usd_per_hour=jobs.budgets.price(fleet.name, placement.instance.name),
                    )
                    for fleet in fleets
                    for placement, queue in zip(fleet.placements, self.fleets[fleet.name].placement_queues, strict=True)
                ],
                timeout_seconds=jobs.timeout_seconds,
                attempts=jobs.attempts,
                check_definitions=[self.fleets[fleet.name].benchmark.job_definition_arn for fleet in fleets],
                topic=self.alerts.topic,
                log_retention=log_retention,
            )
            # trainctl reads the budgets from this (budget_ledger/ledger.py, Budgets.parse).
            CfnOutput(self, "Budgets", value=self.budgets.document)
            self.team_policies = TeamPolicies(
                self,
                "TeamPolicies",
                teams=[t.team for t in jobs.budgets.teams],
                fair_share=jobs.budgets.fair_share,
                queue_arns=[q.job_queue_arn for f in fleets for q in self.fleets[f.name].placement_queues],
            )

        # Boot-check alarms, and with healthCheckSchedule the scheduled fleet check and its alarms.
        self.health = {
            fleet.name: FleetHealth(
                self,
                f"{fleet.construct_id}Health",
                fleet=fleet.name,
                job_queue=self.fleets[fleet.name].job_queue,
                benchmark=self.fleets[fleet.name].benchmark,
                topic=self.alerts.topic,
                schedule=jobs.health_check_schedule,
                check_seconds=jobs.runnable_timeout_minutes * 60 + BENCHMARK_TIMEOUT_SECONDS,
                fair_share=bool(jobs.shares),
            )
            for fleet in fleets
        }
        # Per fleet: node faults (boot check and take-outs) in an hour disable the fleet's compute environment.
        self.boot_breaker = BootCircuitBreaker(
            self,
            "BootCircuitBreaker",
            fleets=[
                BreakerFleet(
                    name=fleet.name,
                    compute_environment_arns=tuple(p.compute_environment_arn for p in compute[fleet.name].placements),
                    boot_check_log_group=compute[fleet.name].boot_check_log_group,
                    max_nodes=fleet.max_nodes,
                )
                for fleet in fleets
            ],
            topic=self.alerts.topic,
            log_retention=log_retention,
        )

    def _acknowledge_bucket_grants(self, datasets: ExportedBucket, checkpoints: ExportedBucket) -> None:
        # grant_read / grant_read_write: object-level actions need `<bucket>/*`, and CDK's grants use
        # action families (GetObject*, List*, ...). Scoped to exactly the two buckets, never `*`.
        findings = {
            f"Resource::{datasets.export_name}/*": "objects of the dataset bucket, read only",
            f"Resource::{checkpoints.export_name}/*": "objects of the checkpoint bucket, read and write",
            "Action::s3:GetObject*": "read objects and their versions, on the two buckets only",
            "Action::s3:GetBucket*": "bucket location and settings the S3 clients ask for, on the two buckets only",
            "Action::s3:List*": "list the two buckets (data loaders and checkpoint discovery)",
            "Action::s3:Abort*": "abort multipart uploads of large checkpoints that failed",
        }
        policy = self.job_role.node.find_child("DefaultPolicy")
        for finding, reason in findings.items():
            Validations.of(policy).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
