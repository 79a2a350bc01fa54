"""The AWS ParallelCluster 3 cluster configuration, as a plain dict built from typed settings.

No CDK in here: the stack passes CDK tokens in `ClusterInputs`; the tests pass literal values and
validate the result with ParallelCluster's own schema, in the release pinned below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.catalog import AcceleratorKind, InstanceSpec
from config.settings import ParallelClusterSettings
from training_constructs.cluster.shared_storage import (
    COMPRESSION,
    DEPLOYMENT_TYPE,
    MOUNT_DIR,
    RepositoryLink,
    repository_links,
)


def _pinned_release() -> str:
    """The one place the ParallelCluster release is named: requirements-pcluster.txt, whose pin the
    schema check installs. The provider template of the same release runs the cluster."""
    text = (Path(__file__).resolve().parents[2] / "requirements-pcluster.txt").read_text()
    return re.search(r"^aws-parallelcluster==(\S+)$", text, re.M).group(1)


PCLUSTER_VERSION = _pinned_release()
# ParallelCluster 3.16 supports alinux2023, ubuntu2204, ubuntu2404, rhel8/9, rocky8/9; alinux2 is gone.
OS = "alinux2023"
# Without a source, SSH is opened to the loopback address only, which no other host can use: the
# head node is reached with SSM Session Manager. (ParallelCluster opens 0.0.0.0/0 when unset.)
NO_SSH = "127.0.0.1/32"
# Node policies. The provider may attach to node roles only customer managed policies named
# parallelcluster* or under the path /parallelcluster/, and a short list of AWS managed policies
# (aws/aws-parallelcluster cloudformation/policies/parallelcluster-policies.yaml, Sid IamPolicy).
# SSM's is on that list; ECR pull is a policy of this app under /parallelcluster/ (ClusterInputs).
SSM_POLICY = "arn:{partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
# Minutes an idle dynamic node waits before ParallelCluster terminates it.
SCALEDOWN_IDLE_MINUTES = 10


@dataclass(frozen=True)
class ClusterInputs:
    """Values the deployment supplies: CDK tokens in the stack, literals in tests."""

    partition: str
    subnet_id: str
    dataset_bucket: str
    checkpoint_bucket: str
    # s3:// URL of enable_pyxis.sh and the bucket that holds it.
    pyxis_script_url: str
    script_bucket: str
    # ARN of the customer managed policy that lets nodes pull training images from ECR.
    ecr_pull_policy: str
    # ARN of the customer managed policy that lets compute nodes write checkpoints as Batch jobs do.
    checkpoint_write_policy: str


def queue_name(instance: InstanceSpec) -> str:
    # Queue and compute-resource names: lowercase letters, digits and hyphens, starting with a letter.
    return instance.name.replace(".", "-")


def _compute_queue(
    settings: ParallelClusterSettings, inputs: ClusterInputs, instance: InstanceSpec, reserved: bool, root_gib: int
) -> dict[str, Any]:
    capacity_block = reserved and settings.capacity_reservation_type == "capacity-block"
    resource: dict[str, Any] = {
        "Name": queue_name(instance),
        "Instances": [{"InstanceType": instance.name}],
        # Idle costs nothing: nodes exist only while jobs need them. A capacity block is paid for
        # whether used or not, so its nodes are static for the block's lifetime.
        "MinCount": settings.max_nodes if capacity_block else 0,
        "MaxCount": settings.max_nodes,
        "Efa": {"Enabled": True},
    }
    if instance.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        resource["HealthChecks"] = {"Gpu": {"Enabled": True}}
    if reserved:
        resource["CapacityReservationTarget"] = {"CapacityReservationId": settings.capacity_reservation_id}
    return {
        "Name": queue_name(instance),
        "CapacityType": "CAPACITY_BLOCK" if capacity_block else "ONDEMAND",
        "ComputeResources": [resource],
        "Networking": {
            "SubnetIds": [inputs.subnet_id],
            # A placement group on top of a targeted reservation or a capacity block causes
            # capacity errors (the reservation decides placement).
            "PlacementGroup": {"Enabled": not reserved},
        },
        "ComputeSettings": {"LocalStorage": {"RootVolume": {"Size": root_gib, "Encrypted": True}}},
        "Iam": {
            "AdditionalIamPolicies": [{"Policy": inputs.ecr_pull_policy}, {"Policy": inputs.checkpoint_write_policy}],
            # Read only: ParallelCluster renders EnableWriteAccess as s3:* on the bucket (versions purged,
            # versioning suspended, a lifecycle or bucket policy set by any job). Checkpoint writes come from
            # the checkpoint-write policy, the Batch job role's grants and denies.
            "S3Access": [
                {"BucketName": inputs.dataset_bucket, "EnableWriteAccess": False},
                {"BucketName": inputs.checkpoint_bucket, "EnableWriteAccess": False},
                {"BucketName": inputs.script_bucket, "EnableWriteAccess": False},
            ],
        },
        "CustomActions": {"OnNodeStart": {"Script": inputs.pyxis_script_url, "Args": ["compute"]}},
    }


def _association(link: RepositoryLink, bucket: str) -> dict[str, Any]:
    association: dict[str, Any] = {
        "Name": link.name,
        "DataRepositoryPath": f"s3://{bucket}",
        "FileSystemPath": link.file_system_path,
        "BatchImportMetaDataOnCreate": True,
        "AutoImportPolicy": list(link.imported),
    }
    if link.exported:
        association["AutoExportPolicy"] = list(link.exported)
    return association


def _shared_storage(settings: ParallelClusterSettings, inputs: ClusterInputs) -> dict[str, Any]:
    links = repository_links(inputs.dataset_bucket, inputs.checkpoint_bucket)
    return {
        "Name": "fsx",
        "MountDir": MOUNT_DIR,
        "StorageType": "FsxLustre",
        "FsxLustreSettings": {
            "DeploymentType": DEPLOYMENT_TYPE,
            "StorageCapacity": settings.fsx_capacity_gib,
            "PerUnitStorageThroughput": settings.fsx_throughput,
            "DataCompressionType": COMPRESSION,
            # The file system outlives the cluster: deleting the cluster keeps the data.
            "DeletionPolicy": "Retain",
            "DataRepositoryAssociations": [_association(link, bucket) for link, bucket in links],
        },
    }


def cluster_configuration(
    settings: ParallelClusterSettings, inputs: ClusterInputs, *, log_retention_days: int, root_volume_gib: int
) -> dict[str, Any]:
    ssh: dict[str, Any] = {"AllowedIps": settings.ssh_source or NO_SSH}
    if settings.key_name:
        ssh["KeyName"] = settings.key_name
    queues = [
        # A reservation belongs to one instance type: the first one listed.
        _compute_queue(settings, inputs, instance, i == 0 and bool(settings.capacity_reservation_id), root_volume_gib)
        for i, instance in enumerate(settings.instances)
    ]
    return {
        "Image": {"Os": OS},
        "Imds": {"ImdsSupport": "v2.0"},
        "HeadNode": {
            "InstanceType": settings.head_node_instance_type,
            "Networking": {"SubnetId": inputs.subnet_id},
            "Ssh": ssh,
            "LocalStorage": {"RootVolume": {"Encrypted": True}},
            "Iam": {
                "AdditionalIamPolicies": [
                    {"Policy": SSM_POLICY.format(partition=inputs.partition)},
                    {"Policy": inputs.ecr_pull_policy},
                ],
                "S3Access": [{"BucketName": inputs.script_bucket, "EnableWriteAccess": False}],
            },
            "CustomActions": {"OnNodeConfigured": {"Script": inputs.pyxis_script_url, "Args": ["head"]}},
        },
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": {"ScaledownIdletime": SCALEDOWN_IDLE_MINUTES},
            "SlurmQueues": queues,
        },
        "SharedStorage": [_shared_storage(settings, inputs)],
        "Monitoring": {
            "DetailedMonitoring": True,
            "Logs": {
                "CloudWatch": {"Enabled": True, "RetentionInDays": log_retention_days, "DeletionPolicy": "Retain"}
            },
            "Dashboards": {"CloudWatch": {"Enabled": True}},
        },
    }
