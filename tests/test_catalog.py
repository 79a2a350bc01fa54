import pytest

from config.catalog import CATALOG, AcceleratorKind, Profile, types_for

# Figures pinned from the EC2 instance-type specifications and the EFA user guide.
KNOWN = {
    # name: (vCPUs, memory GiB, accelerators, network cards = max EFA, Gbps)
    "g5.48xlarge": (192, 768, 8, 1, 100),
    "g6.12xlarge": (48, 192, 4, 1, 40),
    "g6.48xlarge": (192, 768, 8, 1, 100),
    "g6e.48xlarge": (192, 1536, 8, 4, 400),
    "p4d.24xlarge": (96, 1152, 8, 4, 400),
    "p5.48xlarge": (192, 2048, 8, 32, 3200),
    "p5e.48xlarge": (192, 2048, 8, 32, 3200),
    "p5en.48xlarge": (192, 2048, 8, 16, 3200),
    "trn1.32xlarge": (128, 512, 16, 8, 800),
    "trn1n.32xlarge": (128, 512, 16, 16, 1600),
    "trn2.48xlarge": (192, 2048, 16, 16, 3200),
}

REQUIRED = (
    ["g5.48xlarge"]
    + [f"g6.{s}" for s in ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")]
    + [f"g6e.{s}" for s in ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")]
    + ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"]
    + ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"]
)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_known_figures(name):
    spec = CATALOG[name]
    assert (spec.vcpus, spec.memory_gib, spec.accelerator_count, spec.max_efa_interfaces, spec.network_gbps) == KNOWN[
        name
    ]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_types_are_efa_capable(name):
    assert CATALOG[name].efa_supported
    assert CATALOG[name].max_efa_interfaces >= 1


def test_neuron_cores():
    assert CATALOG["trn1.32xlarge"].neuron_cores == 32
    assert CATALOG["trn1n.32xlarge"].neuron_cores == 32
    assert CATALOG["g6.12xlarge"].neuron_cores == 0


def test_profiles_split_by_accelerator():
    gpu, trn = types_for(Profile.GPU), types_for(Profile.TRAINIUM)
    assert set(gpu).isdisjoint(trn)
    assert all(CATALOG[n].accelerator_kind is AcceleratorKind.NVIDIA_GPU for n in gpu)
    assert all(CATALOG[n].accelerator_kind is AcceleratorKind.NEURON for n in trn)
    assert "g6.12xlarge" in gpu and "trn1.32xlarge" in trn


def test_types_without_efa_are_not_offered():
    assert not CATALOG["g6.4xlarge"].efa_supported
    assert CATALOG["g6.4xlarge"].max_efa_interfaces == 0
    assert "g6.4xlarge" not in types_for(Profile.GPU)


def test_figures_are_plausible():
    for spec in CATALOG.values():
        assert spec.name.count(".") == 1
        assert spec.vcpus > 0 and spec.memory_gib >= spec.vcpus  # >= 1 GiB per vCPU on every listed family
        assert 1 <= spec.network_cards <= 32


def test_processes_per_node():
    # One rank per GPU; one per logical NeuronCore (trn1: 32 cores; trn2: 128 cores in pairs, LNC 2).
    assert CATALOG["g6.12xlarge"].processes_per_node == 4
    assert CATALOG["p5.48xlarge"].processes_per_node == 8
    assert CATALOG["trn1.32xlarge"].processes_per_node == 32
    assert CATALOG["trn1n.32xlarge"].processes_per_node == 32
    assert CATALOG["trn2.48xlarge"].processes_per_node == 64
