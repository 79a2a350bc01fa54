"""Environment variables that old EFA samples set and that defeat aws-ofi-nccl on NVIDIA fleets.

aws/aws-ofi-nccl doc/efa-env-var.md: FI_PROVIDER=efa and NCCL_PROTO=simple are for aws-ofi-nccl <= 1.5.0,
FI_EFA_USE_DEVICE_RDMA is not to be set with libfabric >= 1.18 and aws-ofi-nccl >= 1.7, FI_EFA_FORK_SAFE is
"not needed anymore" (the plugin sets it). src/platform-aws.cpp selects the efa provider itself when
FI_PROVIDER is unset, and src/tuner/nccl_ofi_tuner.cpp falls back to NCCL's internal tuner when NCCL_ALGO
or NCCL_PROTO is set. The job definitions set none of these on NVIDIA fleets (Trainium keeps what the Neuron
samples ask); `submit` and `run` say so in one line when a user passes them, and submit anyway.
"""

from __future__ import annotations

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
