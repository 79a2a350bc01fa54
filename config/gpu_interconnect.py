"""GPU-to-GPU bandwidth within one instance, per instance type: what the benchmark's per-node verdict
judges an intra-node all-reduce against (the job definitions pass it as NODE_GBPS).

The figure is per GPU and per direction, because that is what nccl-tests' bus bandwidth measures
("The measurement is of a unidirectional bandwidth", nccl-tests doc/PERFORMANCE.md). NVIDIA
publishes NVLink and PCIe as the total of both directions, so every figure below is half of the
published one. NVLink where the type has it (the P types, through NVSwitch); PCIe otherwise (the G
types: no NVLink between their GPUs). A type with one GPU has no intra-node all-reduce at all.

Kept apart from the catalog rows (config/catalog.py) and keyed by type name, so that it can cover
types the catalog gains in the same release; a test fails when a GPU type of the catalog has no
entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GpuInterconnect:
    """How one type's GPUs reach each other, and how fast (GB/s per GPU, per direction)."""

    link: str
    gbytes_per_second: float
    source: str

    @property
    def gbps(self) -> int:
        """The same in gigabits per second, the unit of the benchmark's busbw_gbps."""
        return round(self.gbytes_per_second * 8)

    @property
    def single_gpu(self) -> bool:
        return self.gbytes_per_second == 0


_A10G = "NVIDIA A10 datasheet (A10G is its AWS variant): PCIe Gen4 x16, 64 GB/s both directions"
_L4 = "NVIDIA L4 datasheet: PCIe Gen4 x16, 64 GB/s both directions"
_L40S = "NVIDIA L40S datasheet: PCIe Gen4 x16, 64 GB/s both directions"
_RTX_PRO_6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: PCIe Gen5 x16, 128 GB/s both directions"
_A100 = "NVIDIA A100 datasheet (SXM): NVLink 3, 600 GB/s per GPU both directions; EC2 P4d: NVSwitch"
_H100 = "NVIDIA H100 datasheet (SXM): NVLink 4, 900 GB/s per GPU both directions; EC2 P5: NVSwitch"
_H200 = "NVIDIA H200 datasheet (SXM): NVLink 4, 900 GB/s per GPU both directions; EC2 P5e/P5en: NVSwitch"
_B200 = "NVIDIA HGX B200 datasheet: NVLink 5, 1.8 TB/s per GPU both directions (NVSwitch)"
_B300 = "NVIDIA HGX B300 datasheet: NVLink 5, 1.8 TB/s per GPU both directions (NVSwitch)"
_T4 = "NVIDIA T4 datasheet: PCIe Gen3 x16, 32 GB/s both directions"
_V100 = "NVIDIA V100 datasheet (SXM2): NVLink 2, 300 GB/s per GPU both directions; EC2 P3dn: hybrid cube-mesh"
_RTX_PRO_4500 = "NVIDIA RTX PRO 4500 Blackwell Server Edition datasheet: PCIe Gen5 x16, 128 GB/s both directions"
_ONE_GPU = "one GPU per instance (EC2 instance-type specifications): no intra-node all-reduce"


def _pcie4(source: str) -> GpuInterconnect:
    return GpuInterconnect(link="PCIe Gen4 x16", gbytes_per_second=32, source=source)


def _pcie5(source: str) -> GpuInterconnect:
    return GpuInterconnect(link="PCIe Gen5 x16", gbytes_per_second=64, source=source)


def _one_gpu() -> GpuInterconnect:
    return GpuInterconnect(link="none", gbytes_per_second=0, source=_ONE_GPU)


INTRA_NODE: dict[str, GpuInterconnect] = {
    "g4dn.8xlarge": _one_gpu(),
    "g4dn.12xlarge": GpuInterconnect(link="PCIe Gen3 x16", gbytes_per_second=16, source=_T4),
    "g4dn.16xlarge": _one_gpu(),
    "g4dn.metal": GpuInterconnect(link="PCIe Gen3 x16", gbytes_per_second=16, source=_T4),
    "g5.8xlarge": _one_gpu(),
    "g5.12xlarge": _pcie4(_A10G),
    "g5.16xlarge": _one_gpu(),
    "g5.24xlarge": _pcie4(_A10G),
    "gr6.8xlarge": _one_gpu(),
    # G7 (NVIDIA RTX PRO 4500 Blackwell Server Edition): 1, 2, 4 and 8 GPUs.
    "g7.8xlarge": _one_gpu(),
    "g7.12xlarge": _pcie5(_RTX_PRO_4500),
    "g7.24xlarge": _pcie5(_RTX_PRO_4500),
    "g7.48xlarge": _pcie5(_RTX_PRO_4500),
    # V100 NVLink is a hybrid cube-mesh, not a switch: not every GPU pair has a direct link.
    "p3dn.24xlarge": GpuInterconnect(link="NVLink 2 (hybrid cube-mesh)", gbytes_per_second=150, source=_V100),
    "g5.48xlarge": _pcie4(_A10G),
    "g6.4xlarge": _one_gpu(),
    "g6.8xlarge": _one_gpu(),
    "g6.12xlarge": _pcie4(_L4),
    "g6.16xlarge": _one_gpu(),
    "g6.24xlarge": _pcie4(_L4),
    "g6.48xlarge": _pcie4(_L4),
    "g6e.8xlarge": _one_gpu(),
    "g6e.12xlarge": _pcie4(_L40S),
    "g6e.16xlarge": _one_gpu(),
    "g6e.24xlarge": _pcie4(_L40S),
    "g6e.48xlarge": _pcie4(_L40S),
    # G7e (NVIDIA RTX PRO 6000 Blackwell Server Edition): 1, 2, 4 and 8 GPUs.
    "g7e.8xlarge": _one_gpu(),
    "g7e.12xlarge": _pcie5(_RTX_PRO_6000),
    "g7e.24xlarge": _pcie5(_RTX_PRO_6000),
    "g7e.48xlarge": _pcie5(_RTX_PRO_6000),
    "p4d.24xlarge": GpuInterconnect(link="NVLink 3 (NVSwitch)", gbytes_per_second=300, source=_A100),
    "p4de.24xlarge": GpuInterconnect(link="NVLink 3 (NVSwitch)", gbytes_per_second=300, source=_A100),
    "p5.4xlarge": _one_gpu(),
    "p5.48xlarge": GpuInterconnect(link="NVLink 4 (NVSwitch)", gbytes_per_second=450, source=_H100),
    "p5e.48xlarge": GpuInterconnect(link="NVLink 4 (NVSwitch)", gbytes_per_second=450, source=_H200),
    "p5en.48xlarge": GpuInterconnect(link="NVLink 4 (NVSwitch)", gbytes_per_second=450, source=_H200),
    "p6-b200.48xlarge": GpuInterconnect(link="NVLink 5 (NVSwitch)", gbytes_per_second=900, source=_B200),
    "p6-b300.48xlarge": GpuInterconnect(link="NVLink 5 (NVSwitch)", gbytes_per_second=900, source=_B300),
}
