"""The Slurm cluster's FSx for Lustre file system as CDK resources (the PCS stack's; ParallelCluster
creates its own from the same description, shared_storage.py), and the commands that mount it."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_s3 as s3
from constructs import Construct

from training_constructs.cluster.shared_storage import COMPRESSION, DEPLOYMENT_TYPE, MOUNT_DIR, repository_links

# Mount options of the FSx for Lustre user guide ("Mounting Amazon FSx automatically": an fstab line
# that waits for the network and mounts on first use).
FSTAB_OPTIONS = "defaults,relatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network.service"


class SharedLustre(Construct):
    """A retained PERSISTENT_2 file system in one subnet, with the data buckets linked under /datasets
    and /checkpoints. The L2 file system has no data repository associations, hence the L1 ones.

    Attributes: `file_system` (fsx.LustreFileSystem), `associations` (name -> L1 association).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        capacity_gib: int,
        throughput: int,
        dataset_bucket: s3.IBucket,
        checkpoint_bucket: s3.IBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        self.file_system = fsx.LustreFileSystem(
            self,
            "FileSystem",
            vpc=vpc,
            vpc_subnet=subnet,
            security_group=security_group,
            storage_capacity_gib=capacity_gib,
            # PERSISTENT_2 runs Lustre 2.12 or 2.15 (FSx for Lustre user guide, "Lustre file system versions").
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType(DEPLOYMENT_TYPE),
                per_unit_storage_throughput=throughput,
                data_compression_type=fsx.LustreDataCompressionType(COMPRESSION),
            ),
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.associations: dict[str, fsx.CfnDataRepositoryAssociation] = {}
        for link, bucket in repository_links(dataset_bucket.bucket_name, checkpoint_bucket.bucket_name):
            export = (
                fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=list(link.exported))
                if link.exported
                else None
            )
            association = fsx.CfnDataRepositoryAssociation(
                self,
                link.name.capitalize(),
                file_system_id=self.file_system.file_system_id,
                file_system_path=link.file_system_path,
                data_repository_path=f"s3://{bucket}",
                batch_import_meta_data_on_create=True,
                s3=fsx.CfnDataRepositoryAssociation.S3Property(
                    auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                        events=list(link.imported)
                    ),
                    auto_export_policy=export,
                ),
            )
            association.apply_removal_policy(RemovalPolicy.RETAIN)
            self.associations[link.name] = association

    def mount_commands(self) -> list[str]:
        """Shell commands that mount the file system at /fsx on a node, now and at every boot. The
        Lustre client comes from the AMI, or from Amazon Linux's repository where the AMI lacks it
        (FSx for Lustre user guide, "Installing the Lustre client")."""
        source = f"{self.file_system.dns_name}@tcp:/{self.file_system.mount_name}"
        entry = f"{source} {MOUNT_DIR} lustre {FSTAB_OPTIONS} 0 0"
        return [
            "command -v mount.lustre >/dev/null || dnf install -y lustre-client",
            f"mkdir -p {MOUNT_DIR}",
            f"grep -q ' {MOUNT_DIR} lustre ' /etc/fstab || echo '{entry}' >> /etc/fstab",
            f"mount {MOUNT_DIR}",
        ]
