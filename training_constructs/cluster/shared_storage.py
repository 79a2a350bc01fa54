"""The shared FSx for Lustre file system of a Slurm cluster, as both Slurm options build it: what it
is (PERSISTENT_2, LZ4, retained, at /fsx) and how it links the data buckets. No CDK in here:
ParallelCluster renders it into its cluster configuration (cluster_config.py), where ParallelCluster
creates the file system; the PCS stack creates it itself (lustre_file_system.py)."""

from __future__ import annotations

from dataclasses import dataclass

MOUNT_DIR = "/fsx"
DEPLOYMENT_TYPE = "PERSISTENT_2"
COMPRESSION = "LZ4"
# Events of a data repository association (FSx for Lustre user guide, "Automatically import updates
# from your S3 bucket" and "Automatically export updates to your S3 bucket").
EXPORTED_CHANGES = ("NEW", "CHANGED")
IMPORTED_CHANGES = ("NEW", "CHANGED", "DELETED")


@dataclass(frozen=True)
class RepositoryLink:
    """One data repository association: a bucket under a path of the file system. PERSISTENT_2
    links S3 through associations only (ImportPath and ExportPath do not apply to it)."""

    name: str
    file_system_path: str
    imported: tuple[str, ...]
    # Empty: nothing goes back to S3.
    exported: tuple[str, ...]


# /fsx/datasets reads the dataset bucket; /fsx/checkpoints reads the checkpoint bucket and writes new
# and changed files back to it (a file deleted on /fsx stays in S3).
DATASETS = RepositoryLink("datasets", "/datasets", IMPORTED_CHANGES, ())
CHECKPOINTS = RepositoryLink("checkpoints", "/checkpoints", IMPORTED_CHANGES, EXPORTED_CHANGES)


def repository_links(dataset_bucket: str, checkpoint_bucket: str) -> list[tuple[RepositoryLink, str]]:
    """Each association with the name of its bucket, datasets first."""
    return [(DATASETS, dataset_bucket), (CHECKPOINTS, checkpoint_bucket)]
