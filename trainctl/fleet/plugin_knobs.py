"""Environment variables that old EFA samples set and that defeat aws-ofi-nccl on NVIDIA fleets.

aws/aws-ofi-nccl doc/efa-env-var.md: FI_PROVIDER=efa and NCCL_PROTO=simple are for aws-ofi-nccl <= 1.5.0,
FI_EFA_USE_DEVICE_RDMA is not to be set with libfabric >= 1.18 and aws-ofi-nccl >= 1.7, FI_EFA_FORK_SAFE is
"not needed anymore" (the plugin sets it). src/platform-aws.cpp selects the efa provider itself when
FI_PROVIDER is unset, and src/tuner/nccl_ofi_tuner.cpp falls back to NCCL's internal tuner when NCCL_ALGO
or NCCL_PROTO is set. The job definitions set none of these on NVIDIA fleets (Trainium keeps what the Neuron
samples ask); `submit` and `run` say so in one line when a user passes them, and submit anyway.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from config.catalog import CATALOG, AcceleratorKind

PLUGIN_DEFEATING = frozenset({"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NCCL_PROTO", "NCCL_ALGO"})
PLUGIN_DOC = "https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md"


def _containers(definition: Mapping[str, Any]) -> list[dict[str, Any]]:
    ranges = definition.get("nodeProperties", {}).get("nodeRangeProperties", [])
    single = definition.get("containerProperties")
    return [r["container"] for r in ranges if r.get("container")] + ([single] if single else [])


def runs_nvidia(definition: Mapping[str, Any]) -> bool:
    """Whether a described job definition runs on NVIDIA GPUs: by its instance type where the catalog
    knows it, else by the GPU count the preflight is given (EXPECTED_GPUS, set only on GPU fleets)."""
    for container in _containers(definition):
        spec = CATALOG.get(str(container.get("instanceType") or ""))
        if spec is not None:
            return spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU
        if any(item.get("name") == "EXPECTED_GPUS" for item in container.get("environment") or []):
            return True
    return False


def plugin_knob_warning(definition: Mapping[str, Any], environment: Mapping[str, str]) -> str | None:
    """One line naming the variables of `environment` that defeat the plugin, on an NVIDIA fleet; else None."""
    found = sorted(PLUGIN_DEFEATING & set(environment))
    if not found or not runs_nvidia(definition):
        return None
    return (
        f"warning: {', '.join(found)} set for an NVIDIA fleet: aws-ofi-nccl picks the EFA provider and fork safety "
        f"itself and its tuner steps aside when NCCL_PROTO/NCCL_ALGO are set; leave them out ({PLUGIN_DOC})"
    )


# GPU-initiated networking (GIN) stays off unless a job opts in with NCCL_GIN_TYPE, and only where aws-ofi-nccl
# supports it (doc/gin-getting-started.md, src/platform-aws.cpp at 2daf7d30): its proxy mode needs the plugin's
# RDMA protocol, which platform-aws.cpp defaults to on these types (p4d, p4de, p5.4xlarge, g5 and types it does
# not list use SENDRECV); EFA-GDA (NCCL_GIN_TYPE=5) only on P5en, P6-B200 and P6-B300.
GIN_VARIABLE = "NCCL_GIN_TYPE"
GIN_EFA_GDA = "5"
GIN_PROXY_TYPES = re.compile(r"^(p5e?\.48xlarge|p5en\..*|p6.*|g7e\.(12|24|48)xlarge)$")
GIN_EFA_GDA_TYPES = frozenset({"p5en.48xlarge", "p6-b200.48xlarge", "p6-b300.48xlarge"})
# Named, not linked, in the refusal: the line stays within 200 characters (docs/jobs.md links it).
GIN_SOURCE = "aws-ofi-nccl doc/gin-getting-started.md"


def instance_type_of(definition: Mapping[str, Any]) -> str | None:
    for container in _containers(definition):
        if container.get("instanceType"):
            return str(container["instanceType"])
    return None


def gin_refusal(definition: Mapping[str, Any], environment: Mapping[str, str]) -> str | None:
    """The one line refusing NCCL_GIN_TYPE on a type where aws-ofi-nccl cannot do that kind of GIN; None when
    the job does not ask for GIN, or its type is one the plugin supports, or cannot be told (never refused on a
    guess)."""
    value = environment.get(GIN_VARIABLE)
    if value is None:
        return None
    instance_type = instance_type_of(definition)
    if instance_type is None:
        return None
    if value.strip() == GIN_EFA_GDA:
        if instance_type in GIN_EFA_GDA_TYPES:
            return None
        allowed = ", ".join(sorted(GIN_EFA_GDA_TYPES))
        return f"{GIN_VARIABLE}={value[:20]}: EFA-GDA runs on {allowed} only, not {instance_type} ({GIN_SOURCE})"
    if GIN_PROXY_TYPES.match(instance_type):
        return None
    return (
        f"{GIN_VARIABLE}={value[:20]}: GIN needs aws-ofi-nccl's RDMA protocol, not used on {instance_type} "
        f"(p5, p5e, p5en, p6, g7e.12/24/48xlarge use it); leave it out ({GIN_SOURCE})"
    )
