"""config/gpu_interconnect.py: every GPU type of the catalog has an intra-node figure with a source;
NVLink on the P types, PCIe on the G types, none where a type has one GPU."""

from __future__ import annotations

import pytest

from config.catalog import CATALOG, AcceleratorKind
from config.gpu_interconnect import INTRA_NODE

GPU_TYPES = sorted(name for name, spec in CATALOG.items() if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU)


@pytest.mark.parametrize("name", GPU_TYPES)
def test_every_gpu_type_has_a_figure_with_its_source(name):
    assert name in INTRA_NODE, f"{name}: no intra-node GPU bandwidth in config/gpu_interconnect.py"
    link, spec = INTRA_NODE[name], CATALOG[name]
    assert link.source.strip()
    # One GPU: nothing to reduce within the node, and the table says so rather than inventing a figure.
    assert link.single_gpu == (spec.accelerator_count == 1)
    if not link.single_gpu:
        assert link.gbytes_per_second > 0
        # NVLink through NVSwitch on the P types; the G types' GPUs talk over PCIe.
        assert link.link.startswith("NVLink" if name.startswith("p") else "PCIe"), link.link


def test_no_figure_for_an_unknown_type():
    assert set(INTRA_NODE) <= set(CATALOG)
    assert all(CATALOG[name].accelerator_kind is AcceleratorKind.NVIDIA_GPU for name in INTRA_NODE)


@pytest.mark.parametrize(
    ("name", "gbytes"),
    [
        # Half of NVIDIA's both-directions figures: nccl-tests' busbw is one direction.
        ("p4d.24xlarge", 300),  # A100 NVLink 3: 600 GB/s
        ("p5.48xlarge", 450),  # H100 NVLink 4: 900 GB/s
        ("p5en.48xlarge", 450),  # H200 NVLink 4: 900 GB/s
        ("p6-b200.48xlarge", 900),  # B200 NVLink 5: 1.8 TB/s
        ("g6.12xlarge", 32),  # L4 PCIe Gen4 x16: 64 GB/s
        ("g6e.48xlarge", 32),  # L40S PCIe Gen4 x16: 64 GB/s
        ("g7e.48xlarge", 64),  # RTX PRO 6000 PCIe Gen5 x16: 128 GB/s
        ("g7.48xlarge", 64),  # RTX PRO 4500 PCIe Gen5 x16: 128 GB/s
        ("g4dn.metal", 16),  # T4 PCIe Gen3 x16: 32 GB/s
        ("p3dn.24xlarge", 150),  # V100 NVLink 2: 300 GB/s
    ],
)
def test_published_figures_per_direction(name, gbytes):
    assert INTRA_NODE[name].gbytes_per_second == gbytes
    assert INTRA_NODE[name].gbps == gbytes * 8  # the unit of the benchmark's NODE_GBPS and busbw_gbps
