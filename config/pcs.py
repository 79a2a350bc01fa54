"""AWS Parallel Computing Service (PCS) facts the PCS stack and its context keys rely on, each with
its source. No CDK in here: config.context checks the keys against these, and the stack reads them."""

from __future__ import annotations

# The Slurm release the cluster runs: the newest PCS offers (PCS user guide, "Release notes for Slurm
# versions in AWS PCS"; AWS's sample AMIs for it are named aws-pcs-sample_ami-al2023-<arch>-slurm-25.11,
# "AWS PCS sample AMIs release notes"). Slurm accounting needs 24.11 or later (PCS user guide, "Slurm
# accounting in AWS PCS"). A node's AMI must carry the PCS agent and this Slurm major release.
SLURM_VERSION = "25.11"
# PCS cluster sizes and the compute nodes each may manage, login nodes included (PCS API reference,
# Cluster.size and CreateCluster: SMALL 32 nodes and 256 jobs, MEDIUM 512 and 8,192, LARGE 2,048 and
# 16,384). The controller's price grows with the size (PCS pricing page).
SIZES = (("SMALL", 32), ("MEDIUM", 512), ("LARGE", 2048))
MAX_CLUSTER_NODES = SIZES[-1][1]
# Nodes in the login node group: one small instance for `sbatch`, `squeue` and `sacct`.
LOGIN_NODES = 1
# Accounting's DefaultPurgeTimeInDays: -1 (keep records while the cluster exists) or 1..10000; 0 is
# refused (PCS API reference, Accounting; the AWS::PCS::Cluster schema cfn-lint ships). This app offers
# days only: records that never expire are a cost nobody chose.
PURGE_DAYS = (1, 10000)
# The AWS managed policy that lets a node register with its cluster: pcs:RegisterComputeNodeGroupInstance
# (PCS user guide, "AWS managed policies for AWS PCS", AWSPCSComputeNodePolicy).
NODE_POLICY = "AWSPCSComputeNodePolicy"
# The role in a node's instance profile must be named AWSPCS... or sit under this path (PCS user guide,
# "Create an instance profile for AWS PCS"; PCS API reference, ComputeNodeGroup.iamInstanceProfileArn).
NODE_ROLE_PATH = "/aws-pcs/"


def cluster_size(nodes: int) -> str:
    """The smallest PCS size that manages `nodes` compute nodes (login nodes count): 32 -> SMALL,
    33 -> MEDIUM, 600 -> LARGE. Raises ValueError above LARGE."""
    for size, limit in SIZES:
        if nodes <= limit:
            return size
    raise ValueError(f"{nodes} nodes: over the largest PCS cluster size ({MAX_CLUSTER_NODES})")
