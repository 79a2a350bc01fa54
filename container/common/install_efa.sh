#!/usr/bin/env bash
# Build step of both NVIDIA images (pytorch/, isaaclab/): the EFA user space (libfabric) and the
# aws-ofi-nccl plugin from the pinned EFA installer, made visible to NCCL. The build fails when NCCL
# could not load the plugin: without it NCCL falls back to TCP sockets without a word.
#
#   install_efa.sh EFA_INSTALLER_VERSION
set -euo pipefail

version="$1"
# Where the installer puts the plugin: lib/x86_64-linux-gnu on Ubuntu, lib64 on Amazon Linux 2023
# from installer 1.44 on, lib before that (aws/deep-learning-containers install_efa_amzn2023.sh
# checks the first two; AWS's Ubuntu training Dockerfiles export the first).
readonly LIBRARY_DIRS=(
  /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu /opt/amazon/ofi-nccl/lib64 /opt/amazon/ofi-nccl/lib
  /opt/amazon/efa/lib /opt/amazon/efa/lib64
)

apt-get update
apt-get install -y --no-install-recommends curl ca-certificates
curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${version}.tar.gz" -o /tmp/efa.tar.gz
tar -xzf /tmp/efa.tar.gz -C /tmp
# --skip-kmod: the host AMI carries the EFA kernel module; --skip-limit-conf: memlock comes from the
# job definition's ulimits; --no-verify: no device at build time (EC2 user guide, "Install the EFA
# software in a container"). --disable-ngc: from 1.48 on the installer detects NGC-style images
# (/opt/nvidia/nvidia_entrypoint.sh) and then leaves out the aws-ofi-nccl package; AWS's own
# PyTorch containers pass this flag to force the standard install (aws/deep-learning-containers,
# scripts/docker/common/install_efa_amzn2023.sh), and so do both images here, whatever their base.
(cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify --disable-ngc)
rm -rf /tmp/aws-efa-installer /tmp/efa.tar.gz /var/lib/apt/lists/*

printf '%s\n' "${LIBRARY_DIRS[@]}" >/etc/ld.so.conf.d/000-aws-ofi-nccl.conf

# NCCL dlopens "libnccl-net.so" unless NCCL_NET_PLUGIN names another (NCCL environment variables);
# aws-ofi-nccl builds libnccl-net-ofi.so and installs libnccl-net.so beside it (aws/aws-ofi-nccl
# #808, #993). Only that exact name counts: NGC images rename the plugin (libnccl-net-aws.so).
plugin=""
for dir in "${LIBRARY_DIRS[@]}"; do
  if [[ -e "$dir/libnccl-net.so" ]]; then
    plugin="$dir/libnccl-net.so"
    break
  fi
done
if [[ -z "$plugin" ]]; then
  echo "install_efa.sh: aws-ofi-nccl plugin libnccl-net.so not found under /opt/amazon/ofi-nccl: NCCL would use TCP" >&2
  exit 1
fi

# The plugin loads the CUDA runtime by its unversioned name, libcudart.so (aws/aws-ofi-nccl 1.21.1
# release notes, --enable-cudart-dynamic); runtime-only images and pip's CUDA wheels ship only
# libcudart.so.<major>. Link the newest one found and put its folder on the loader path.
# (ldconfig -p is read whole first: under pipefail, `ldconfig -p | grep -q` fails when grep stops
# reading at its first match.)
ldconfig
if ! grep -q 'libcudart\.so ' <<<"$(ldconfig -p)"; then
  runtime=$(find / -xdev -name 'libcudart.so.[0-9]*' -not -path '/proc/*' 2>/dev/null | sort -V | tail -n 1)
  if [[ -z "$runtime" ]]; then
    echo "install_efa.sh: no libcudart.so.* in the image: the aws-ofi-nccl plugin cannot load" >&2
    exit 1
  fi
  ln -sf "$(basename "$runtime")" "$(dirname "$runtime")/libcudart.so"
  dirname "$runtime" >/etc/ld.so.conf.d/001-cudart.conf
  ldconfig
fi
cache=$(ldconfig -p)
grep -q 'libcudart\.so ' <<<"$cache" || { echo "install_efa.sh: libcudart.so is not on the loader path" >&2; exit 1; }
echo "install_efa.sh: EFA installer $version, plugin $plugin, $(grep -m1 'libcudart\.so ' <<<"$cache")"
