"""Validate a ParallelCluster configuration with aws-parallelcluster's own schema and validators.

Runs in the separate environment that tests/test_parallelcluster_schema.py builds (aws-parallelcluster
cannot share a virtualenv with aws-cdk-lib v2). Reads {"cluster_name": ..., "configurations":
{name: configuration}} as JSON on stdin, so that one process (one import of aws-parallelcluster)
checks them all, and prints one JSON line: {"errors": {name: [...]}}, empty where ParallelCluster
accepts the configuration.
"""

import json
import os
import sys
from unittest import mock

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from marshmallow import ValidationError
from pcluster.schemas.cluster_schema import ClusterSchema
from pcluster.validators.cluster_validators import ComputeResourceSizeValidator
from pcluster.validators.common import FailureLevel
from pcluster.validators.ec2_validators import InstanceTypeOSCompatibleValidator
from pcluster.validators.fsx_validators import (
    FsxDraValidator,
    FsxPersistentOptionsValidator,
    FsxStorageCapacityValidator,
)


def errors(configuration: dict, cluster_name: str) -> list[str]:
    # The schema looks capacity reservations up in EC2 when it sees one; offline there are none.
    with mock.patch("pcluster.aws.ec2.Ec2Client.describe_capacity_reservations", return_value=[]):
        try:
            cluster = ClusterSchema(cluster_name=cluster_name).load(configuration)
        except ValidationError as error:
            return [json.dumps(error.messages, sort_keys=True)]
    results = []
    for queue in cluster.scheduling.queues:
        for resource in queue.compute_resources:
            # Instance type against the OS (refuses e.g. p6e-gb200 on RHEL); offline, no EC2 call.
            for instance_type in resource.instance_types:
                results += InstanceTypeOSCompatibleValidator().execute(instance_type=instance_type, os=cluster.image.os)
            results += ComputeResourceSizeValidator().execute(
                min_count=resource.min_count, max_count=resource.max_count, capacity_type=queue.capacity_type
            )
    for storage in cluster.shared_storage or []:
        results += FsxStorageCapacityValidator().execute(
            storage_capacity=storage.storage_capacity,
            deployment_type=storage.deployment_type,
            fsx_storage_type=storage.fsx_storage_type,
            per_unit_storage_throughput=storage.per_unit_storage_throughput,
            file_system_id=storage.file_system_id,
            backup_id=storage.backup_id,
        )
        results += FsxDraValidator().execute(
            data_repository_associations=storage.data_repository_associations,
            import_path=storage.import_path,
            export_path=storage.export_path,
        )
        results += FsxPersistentOptionsValidator().execute(
            deployment_type=storage.deployment_type,
            kms_key_id=storage.kms_key_id,
            per_unit_storage_throughput=storage.per_unit_storage_throughput,
        )
    return [f"{r.validator_type}: {r.message}" for r in results if r.level == FailureLevel.ERROR]


if __name__ == "__main__":
    request = json.load(sys.stdin)
    checked = {name: errors(config, request["cluster_name"]) for name, config in request["configurations"].items()}
    print(json.dumps({"errors": checked}))
