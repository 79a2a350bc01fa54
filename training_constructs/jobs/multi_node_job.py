"""An AWS Batch multi-node parallel job definition that fills one instance per node: every vCPU,
the memory ECS can place, every GPU, every EFA device and, on Trainium, every Neuron device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import Stack
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config.catalog import AcceleratorKind, InstanceSpec
from training_constructs.health.node_recovery import NODE_STATE_DIR

NODE_STATE_VOLUME = "training-node"

# The ECS agent registers less memory than the instance has installed (kernel, firmware and
# driver reservations, plus ECS_RESERVED_MEMORY), and a job asking for more than the agent
# registered stays RUNNABLE forever. AWS Batch recommends a 5% buffer (Batch user guide,
# "Reserve system memory").
MEMORY_RESERVE_FRACTION = 0.05
# /dev/shm for PyTorch data-loader workers and NCCL's intra-node transport. tmpfs takes memory
# only as it fills, and what it holds counts against the container's memory limit, so a generous
# ceiling costs nothing; a third of the job's memory matches the seed's 60000 MiB on g6.12xlarge.
SHARED_MEMORY_FRACTION = 1 / 3
# What a container needs on the EFA and Neuron devices (Batch user guide, "EFA").
EFA_DEVICE_PERMISSIONS = ("READ", "WRITE", "MKNOD")


@dataclass(frozen=True)
class NodeResources:
    """What one node of a job asks for, derived from the instance type alone."""

    vcpus: int
    memory_mib: int
    shared_memory_mib: int
    gpus: int
    devices: tuple[str, ...]


def node_resources(instance: InstanceSpec) -> NodeResources:
    installed_mib = instance.memory_gib * 1024
    memory_mib = int(installed_mib * (1 - MEMORY_RESERVE_FRACTION))
    # One uverbs device per EFA interface the launch template attaches (Batch user guide, "EFA").
    devices = [f"/dev/infiniband/uverbs{i}" for i in range(instance.max_efa_interfaces)]
    gpus = 0
    if instance.accelerator_kind is AcceleratorKind.NEURON:
        # Every Neuron device is mapped into the container (aws-neuron-samples, aws-batch).
        devices += [f"/dev/neuron{i}" for i in range(instance.accelerator_count)]
    else:
        gpus = instance.accelerator_count
    return NodeResources(
        vcpus=instance.vcpus,
        memory_mib=memory_mib,
        shared_memory_mib=int(memory_mib * SHARED_MEMORY_FRACTION),
        gpus=gpus,
        devices=tuple(devices),
    )


@dataclass(frozen=True)
class RetryRule:
    action: str
    on_status_reason: str | None = None
    on_reason: str | None = None
    on_exit_code: str | None = None


# The launcher's exit code for a node that failed its preflight (container/launcher/preflight.py
# PREFLIGHT_EXIT; a test keeps the two equal).
PREFLIGHT_EXIT_CODE = 75


# Retry what the infrastructure broke, stop on what the application did. Rules are evaluated in
# order and an unmatched failure would be retried (API EvaluateOnExit), hence the final EXIT.
# "Host EC2*" is the status reason of a terminated or lost host (the pattern behind CDK's
# batch.Reason.SPOT_INSTANCE_RECLAIMED); AGENT and "Task failed to start" are the Batch user
# guide's examples ("Automated job retries"). A node fault (PREFLIGHT_EXIT_CODE: a failed preflight, or
# a hardware fault during training) is a node, not the application: retried. Only a main-node failure
# retries a multi-node job, and the job's statusReason and exit code are the main node's (Batch user
# guide, "Multi-node parallel jobs"): a child that fails tells the main node, which then exits 75
# (container/launcher/node_fault.py).
RETRY_RULES = (
    RetryRule("RETRY", on_status_reason="Host EC2*"),
    RetryRule("RETRY", on_reason="AGENT"),
    RetryRule("RETRY", on_status_reason="Task failed to start"),
    RetryRule("RETRY", on_exit_code=str(PREFLIGHT_EXIT_CODE)),
    RetryRule("EXIT", on_reason="*"),
)


class MultiNodeJobDefinition(Construct):
    """A multi-node parallel job definition of `nodes` nodes of one instance type.

    L1 on purpose: the L2 MultiNodeJobDefinition renders every node range closed
    ("start:end"), and Batch only accepts a node-count override at submit time when a range is
    open-ended ("0:"; API NodeOverrides.numNodes). One open range covers every node.

    With `ecs_exec`, every node's container takes ECS Exec sessions (the job role needs
    ECS_EXEC_ACTIONS, training_jobs.grant_ecs_exec). With `execution_role`, the container names it, so
    that a revision trainctl registers with `secrets` can have them read (job_secrets.py).

    Attributes: `job_definition` (L1), `job_definition_arn`, `resources` (NodeResources).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        instance: InstanceSpec,
        nodes: int,
        image_uri: str,
        job_role: iam.IRole,
        log_group: logs.ILogGroup,
        log_stream_prefix: str,
        command: Sequence[str],
        environment: Mapping[str, str],
        timeout_seconds: int,
        attempts: int,
        ecs_exec: bool,
        execution_role: iam.IRole | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.resources = node_resources(instance)
        r = self.resources
        requirements = [
            batch.CfnJobDefinition.ResourceRequirementProperty(type="VCPU", value=str(r.vcpus)),
            batch.CfnJobDefinition.ResourceRequirementProperty(type="MEMORY", value=str(r.memory_mib)),
        ]
        if r.gpus:
            requirements.append(batch.CfnJobDefinition.ResourceRequirementProperty(type="GPU", value=str(r.gpus)))

        container = batch.CfnJobDefinition.ContainerPropertiesProperty(
            image=image_uri,
            command=list(command),
            environment=[
                batch.CfnJobDefinition.EnvironmentProperty(name=k, value=v) for k, v in sorted(environment.items())
            ],
            instance_type=instance.name,
            job_role_arn=job_role.role_arn,
            # Only with jobSecrets: the role the ECS agent reads a job's `secrets` with (job_secrets.py).
            execution_role_arn=execution_role.role_arn if execution_role else None,
            # `trainctl exec`: Batch added ECS Exec (Batch user guide, document history, April 15 2025:
            # "Adds support for FireLens and ECS Exec command"), and a multi-node node range's container
            # takes it (CloudFormation, AWS::Batch::JobDefinition MultiNodeContainerProperties,
            # EnableExecuteCommand).
            enable_execute_command=True if ecs_exec else None,
            resource_requirements=requirements,
            # EFA and collective libraries pin their buffers in memory.
            ulimits=[batch.CfnJobDefinition.UlimitProperty(name="memlock", soft_limit=-1, hard_limit=-1)],
            # The node's state, shared with its host: the boot check's shared-fault file, the Xid
            # watcher's records, and the take-out marker the launcher writes (node_recovery.py).
            volumes=[
                batch.CfnJobDefinition.VolumesProperty(
                    name=NODE_STATE_VOLUME, host=batch.CfnJobDefinition.VolumesHostProperty(source_path=NODE_STATE_DIR)
                )
            ],
            mount_points=[
                batch.CfnJobDefinition.MountPointsProperty(
                    source_volume=NODE_STATE_VOLUME, container_path=NODE_STATE_DIR, read_only=False
                )
            ],
            linux_parameters=batch.CfnJobDefinition.LinuxParametersProperty(
                devices=[
                    batch.CfnJobDefinition.DeviceProperty(
                        host_path=path, container_path=path, permissions=list(EFA_DEVICE_PERMISSIONS)
                    )
                    for path in r.devices
                ],
                shared_memory_size=r.shared_memory_mib,
            ),
            log_configuration=batch.CfnJobDefinition.LogConfigurationProperty(
                log_driver="awslogs",
                options={
                    "awslogs-group": log_group.log_group_name,
                    "awslogs-region": Stack.of(self).region,
                    "awslogs-stream-prefix": log_stream_prefix,
                },
            ),
        )
        self.job_definition = batch.CfnJobDefinition(
            self,
            "Resource",
            type="multinode",
            platform_capabilities=["EC2"],
            propagate_tags=True,
            node_properties=batch.CfnJobDefinition.NodePropertiesProperty(
                num_nodes=nodes,
                main_node=0,
                node_range_properties=[
                    batch.CfnJobDefinition.NodeRangePropertyProperty(target_nodes="0:", container=container)
                ],
            ),
            retry_strategy=batch.CfnJobDefinition.RetryStrategyProperty(
                attempts=attempts,
                evaluate_on_exit=[
                    batch.CfnJobDefinition.EvaluateOnExitProperty(
                        action=rule.action,
                        on_status_reason=rule.on_status_reason,
                        on_reason=rule.on_reason,
                        on_exit_code=rule.on_exit_code,
                    )
                    for rule in RETRY_RULES
                ],
            ),
            timeout=batch.CfnJobDefinition.TimeoutProperty(attempt_duration_seconds=timeout_seconds),
        )

    @property
    def job_definition_arn(self) -> str:
        # Ref of AWS::Batch::JobDefinition is the ARN with its revision.
        return self.job_definition.ref
