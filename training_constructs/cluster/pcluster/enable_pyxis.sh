#!/usr/bin/env bash
# Switch on Pyxis and Enroot on a ParallelCluster node, so that
# `srun --container-image=<registry>#<repository>:<tag>` runs a job step in a container.
#
#   enable_pyxis.sh head      HeadNode CustomActions OnNodeConfigured
#   enable_pyxis.sh compute   SlurmQueues CustomActions OnNodeStart
#
# ParallelCluster AMIs (3.11.1 and later) ship Pyxis and Enroot installed but disabled, with sample
# configuration files under /opt/parallelcluster/examples. Shipped from this repository as a CDK
# asset: nothing is downloaded at boot.
set -euo pipefail

readonly EXAMPLES=/opt/parallelcluster/examples
readonly SLURM_ETC=/opt/slurm/etc

role="${1:-}"
[[ "$role" == head || "$role" == compute ]] || {
  echo "usage: $0 head|compute" >&2
  exit 2
}

# Enroot: per-user runtime state in tmpfs; image layers and unpacked containers on local disk.
install -d -m 1777 /run/enroot /var/enroot/cache /var/enroot/data
cat >/etc/enroot/enroot.conf <<'CONF'
ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)
ENROOT_CACHE_PATH /var/enroot/cache/group-$(id -g)
ENROOT_DATA_PATH /var/enroot/data/user-$(id -u)
ENROOT_MOUNT_HOME y
ENROOT_RESTRICT_DEV n
ENROOT_ROOTFS_WRITABLE y
CONF
chmod 0644 /etc/enroot/enroot.conf

# Pyxis keeps its runtime state here (the sample pyxis.conf points at it).
install -d -m 1777 /run/pyxis

if [[ "$role" == head ]]; then
  # /opt/slurm is shared with the compute nodes over NFS: the head node configures the SPANK
  # plugin stack once for the whole cluster, then tells Slurm to read it again.
  install -d -m 0755 "$SLURM_ETC/plugstack.conf.d"
  install -m 0644 "$EXAMPLES/spank/plugstack.conf" "$SLURM_ETC/plugstack.conf"
  install -m 0644 "$EXAMPLES/pyxis/pyxis.conf" "$SLURM_ETC/plugstack.conf.d/pyxis.conf"
  /opt/slurm/bin/scontrol reconfigure
fi
echo "enable_pyxis.sh: Pyxis and Enroot enabled on this $role node"
