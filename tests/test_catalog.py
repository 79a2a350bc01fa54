import dataclasses
import json

import pytest

from config.catalog import CATALOG, AcceleratorKind, InstanceSpec, Profile, types_for
from tests.docs_text import page
from tests.harness import ROOT

SOURCES = json.loads((ROOT / "config" / "instance_network_sources.json").read_text())

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
    "p5.4xlarge": (16, 256, 1, 1, 100),
    "p6-b200.48xlarge": (192, 2048, 8, 8, 3200),
    "p6-b300.48xlarge": (192, 4096, 8, 16, 6400),
    "g7e.8xlarge": (32, 256, 1, 1, 100),
    "g7e.12xlarge": (48, 512, 2, 1, 400),
    "g7e.24xlarge": (96, 1024, 4, 2, 800),
    "g7e.48xlarge": (192, 2048, 8, 4, 1600),
    "g4dn.metal": (96, 384, 8, 1, 100),
    "g5.24xlarge": (96, 384, 4, 1, 50),
    "gr6.8xlarge": (32, 256, 1, 1, 25),
    "g7.8xlarge": (32, 128, 1, 1, 80),
    "g7.48xlarge": (192, 768, 8, 2, 700),
    "p3dn.24xlarge": (96, 768, 8, 1, 100),
}

REQUIRED = (
    ["g5.48xlarge"]
    + [f"g6.{s}" for s in ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")]
    + [f"g6e.{s}" for s in ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")]
    + ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"]
    + ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"]
    + ["p5.4xlarge", "p6-b200.48xlarge", "p6-b300.48xlarge"]
    + [f"g7e.{s}" for s in ("8xlarge", "12xlarge", "24xlarge", "48xlarge")]
    # Every other EFA-capable NVIDIA type in the karpenter reference (issue 23 follow-up).
    + [f"g7.{s}" for s in ("8xlarge", "12xlarge", "24xlarge", "48xlarge")]
    + [f"g5.{s}" for s in ("8xlarge", "12xlarge", "16xlarge", "24xlarge")]
    + [f"g4dn.{s}" for s in ("8xlarge", "12xlarge", "16xlarge", "metal")]
    + ["p3dn.24xlarge", "gr6.8xlarge"]
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
        assert spec.efa_interfaces in (0, spec.network_cards, spec.network_cards - 1)


def disagreements(spec: InstanceSpec, published: dict) -> list[str]:
    """Where a catalog row differs from the published figures (config/instance_network_sources.json)."""
    ours = {
        "vcpus": spec.vcpus,
        "memory_mib": spec.memory_gib * 1024,
        "network_gbps": spec.network_gbps,
        "max_efa_interfaces": spec.efa_interfaces,
        "interfaces_per_card": list(spec.card_interfaces),
    }
    return [
        f"{spec.name} {k}: catalog {v}, published {published.get(k)}" for k, v in ours.items() if published.get(k) != v
    ]


def test_the_source_file_is_dated_and_says_where_each_field_was_read():
    assert SOURCES["read_on"] >= "2026-08-20"
    fields = {k for row in SOURCES["types"].values() for k in row}
    assert fields == set(SOURCES["sources"])
    assert all("DescribeInstanceTypes" in SOURCES["sources"][f] for f in ("interfaces_per_card", "max_efa_interfaces"))


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_row_agrees_with_the_published_figures(name):
    assert name in SOURCES["types"], f"{name} has no published figures in config/instance_network_sources.json"
    assert disagreements(CATALOG[name], SOURCES["types"][name]) == []


@pytest.mark.parametrize(
    "change",
    [
        {"card_interfaces": (4,) * 16 + (3,)},
        {"efa_interfaces": 17},
        {"network_gbps": 3200},
        {"memory_gib": 2048},
    ],
    ids=["one-card-limit", "efa-count", "bandwidth", "memory"],
)
def test_one_changed_figure_is_a_disagreement(change):
    spec = dataclasses.replace(CATALOG["p6-b300.48xlarge"], **change)
    (problem,) = disagreements(spec, SOURCES["types"][spec.name])
    assert problem.startswith("p6-b300.48xlarge ")


def test_card_0_without_efa_only_where_one_card_lacks_it():
    b300 = CATALOG["p6-b300.48xlarge"]
    assert (b300.network_cards, b300.efa_interfaces) == (17, 16)
    assert b300.efa_cards == tuple(range(1, 17)) and not b300.card_0_has_efa
    assert b300.node_interfaces == 17  # ENA-only primary + 16 EFA
    assert all(s.card_0_has_efa for s in CATALOG.values() if s.efa_supported and s.name != b300.name)
    with pytest.raises(ValueError, match="EFA interfaces on"):
        dataclasses.replace(b300, efa_interfaces=8)


def test_catalog_page_lists_every_efa_type_with_its_figures():
    # The generated page (tools/docs_reference.py), read back and checked against the catalog.
    rows = {}
    for line in page("reference/catalog.md").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0] in CATALOG:
            rows[cells[0]] = cells
    assert set(rows) == {n for n, s in CATALOG.items() if s.efa_supported}
    for name, (_, vcpus, mem, _, cards, efa, per_card, gbps, isaac, driver, image) in rows.items():
        spec = CATALOG[name]
        first, last = spec.efa_cards[0], spec.efa_cards[-1]
        assert (int(vcpus), int(mem), int(cards), int(gbps)) == (
            spec.vcpus,
            spec.memory_gib,
            spec.network_cards,
            spec.network_gbps,
        ), name
        assert efa == (str(first) if first == last else f"{first}-{last}"), name
        assert {int(per_card)} == set(spec.card_interfaces), name
        if spec.accelerator_kind is AcceleratorKind.NVIDIA_GPU:
            assert isaac == ("yes" if spec.runs_isaac_sim else "no"), name
        # Trainium has no NVIDIA driver ("-"); a GPU without a documented minimum leaves it blank.
        neuron = spec.accelerator_kind is AcceleratorKind.NEURON
        assert driver == ("-" if neuron else spec.min_nvidia_driver or ""), name
        # The image a fleet of the type runs by default: Isaac Lab exactly where Isaac Sim runs.
        expected = "trainium" if neuron else ("isaaclab" if spec.runs_isaac_sim else "pytorch")
        assert image == expected, name


def test_isaac_sim_exactly_on_rt_core_gpus():
    isaac = {n for n, s in CATALOG.items() if s.runs_isaac_sim and s.efa_supported}
    assert {n.split(".")[0] for n in isaac} == {"g4dn", "g5", "g6", "gr6", "g6e", "g7", "g7e"}
    for name in (
        "p3dn.24xlarge",
        "p6-b200.48xlarge",
        "p6-b300.48xlarge",
        "p5.4xlarge",
        "p5en.48xlarge",
        "trn2.48xlarge",
    ):
        assert not CATALOG[name].runs_isaac_sim


def test_processes_per_node():
    # One rank per GPU; one per logical NeuronCore (trn1: 32 cores; trn2: 128 cores in pairs, LNC 2).
    assert CATALOG["g6.12xlarge"].processes_per_node == 4
    assert CATALOG["p5.48xlarge"].processes_per_node == 8
    assert CATALOG["trn1.32xlarge"].processes_per_node == 32
    assert CATALOG["trn1n.32xlarge"].processes_per_node == 32
    assert CATALOG["trn2.48xlarge"].processes_per_node == 64
    assert CATALOG["g7e.12xlarge"].processes_per_node == 2
    assert CATALOG["p5.4xlarge"].processes_per_node == 1
