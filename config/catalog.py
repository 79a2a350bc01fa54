"""Instance types the training profiles may run on, with the figures the stacks derive from.

Figures come from the EC2 instance-type specifications ("Accelerated computing",
https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html: vCPUs, memory, accelerators,
network bandwidth, network cards, EFA support) unless a line cites something else.
`config/instance_network_sources.json` keeps the published network and EFA figures with their
sources and the date they were read; tests/test_catalog.py fails when a row here disagrees.

Per-card data: `card_interfaces` is EC2 DescribeInstanceTypes'
NetworkInfo.NetworkCards[].MaximumNetworkInterfaces in card order, `efa_interfaces` is
NetworkInfo.EfaInfo.MaximumEfaInterfaces. EFA is one interface per network card (EC2 user guide,
efa-acc-inst-types); where an instance has one EFA interface fewer than network cards, card 0 is
the card without EFA (the rule the pinned aws-parallelcluster applies, templates/queues_stack.py:
"MaximumEfaInterfaces < MaximumNetworkCards -> NCI-0 does NOT support EFA (e.g., B300, GB200)";
EC2 user guide, efa-acc-inst-types: "If the network card index 0 supports EFA ...").

Isaac Sim needs an NVIDIA RTX GPU with RT cores; V100, A100, H100 and H200 have none and are listed as
unsupported (Isaac Sim documentation, "Isaac Sim Requirements": GPUs without RT cores are not
supported). L4, L40S and A10G are RTX-class data-centre GPUs with RT cores, and so are the RTX PRO
4500 of g7 and the RTX PRO 6000 Blackwell Server Edition of g7e (NVIDIA's ovrtx/Omniverse RTX hardware requirements name
"8 x RTX Pro 6000 Blackwell Server Edition" as the recommended server). B200 and B300 are compute
GPUs without the RTX ray-tracing features (same page: Shader Execution Reordering, Opacity
Micro-Map and Motion BVH "No" on "Blackwell B200/B300"). T4 (Turing) has RT cores and Isaac
Sim's own cloud-deployment guides run it on a single T4 (isaac-sim/IsaacSim issue 311), but it is
below the lowest GPU NVIDIA tests a release on; NVIDIA: such GPUs are not refused, only untested
(isaac-sim/IsaacSim discussion 423). It counts as able to run Isaac Sim, at the user's risk.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Profile(enum.StrEnum):
    """A training profile: which accelerator family its compute runs on."""

    GPU = "gpu"
    TRAINIUM = "trainium"


class AcceleratorKind(enum.StrEnum):
    NVIDIA_GPU = "nvidia-gpu"
    NEURON = "neuron"


@dataclass(frozen=True, kw_only=True)
class InstanceSpec:
    """One EC2 instance type as the stacks need to know it."""

    name: str
    vcpus: int
    memory_gib: int
    accelerator_kind: AcceleratorKind
    accelerator_model: str
    accelerator_count: int
    # NeuronCores per Neuron device; 0 for GPUs.
    neuron_cores_per_device: int = 0
    # Physical NeuronCores the Neuron runtime groups into one logical core by default (LNC).
    logical_core_group: int = 1
    # Network interfaces each network card takes, by card index (card 0 holds the primary
    # interface and, on Batch, the job's own awsvpc task ENI).
    card_interfaces: tuple[int, ...]
    # EFA interfaces the instance takes (MaximumEfaInterfaces); 0 without EFA.
    efa_interfaces: int
    network_gbps: int
    # Whether the GPU can run Isaac Sim (RT cores); False for every non-GPU type.
    runs_isaac_sim: bool = False
    # The oldest NVIDIA driver NVIDIA documents for this GPU (see MIN_NVIDIA_DRIVER); None where
    # the ECS GPU AMI's driver has long covered it.
    min_nvidia_driver: str | None = None

    def __post_init__(self) -> None:
        # The only layouts EC2 publishes for the types here: EFA on every card, or on every card
        # but card 0. Anything else needs a new layout rule, not a silent guess.
        if self.efa_interfaces not in (0, self.network_cards, self.network_cards - 1):
            raise ValueError(f"{self.name}: {self.efa_interfaces} EFA interfaces on {self.network_cards} cards")

    @property
    def network_cards(self) -> int:
        return len(self.card_interfaces)

    @property
    def efa_supported(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def efa_cards(self) -> tuple[int, ...]:
        """Network cards that carry an EFA interface: all of them, or all but card 0."""
        if not self.efa_supported:
            return ()
        first = self.network_cards - self.efa_interfaces
        return tuple(range(first, self.network_cards))

    @property
    def card_0_has_efa(self) -> bool:
        return 0 in self.efa_cards

    @property
    def node_interfaces(self) -> int:
        """Interfaces the launch template attaches: one per EFA card, plus an ENA-only primary on
        card 0 where card 0 has no EFA. Each takes one private IPv4 address."""
        return self.efa_interfaces + (0 if self.card_0_has_efa else 1)

    @property
    def profile(self) -> Profile:
        if self.accelerator_kind is AcceleratorKind.NEURON:
            return Profile.TRAINIUM
        return Profile.GPU

    @property
    def default_image(self) -> str:
        """The image built from container/ (its Dockerfile's folder) that a fleet of this type runs
        unless it names its own: Isaac Lab where Isaac Sim runs, the Neuron DLC on Trainium, PyTorch
        on every other NVIDIA GPU."""
        if self.accelerator_kind is AcceleratorKind.NEURON:
            return "trainium"
        return "isaaclab" if self.runs_isaac_sim else "pytorch"

    @property
    def max_efa_interfaces(self) -> int:
        return self.efa_interfaces

    @property
    def neuron_cores(self) -> int:
        return self.accelerator_count * self.neuron_cores_per_device

    @property
    def processes_per_node(self) -> int:
        """Training processes per node: one per GPU, or one per logical NeuronCore."""
        if self.accelerator_kind is AcceleratorKind.NEURON:
            return self.neuron_cores // self.logical_core_group
        return self.accelerator_count


# GPU models with RT cores (Isaac Sim requirements; see the module docstring).
RT_CORE_GPUS = frozenset({"A10G", "L4", "L40S", "RTX PRO 6000", "RTX PRO 4500", "T4"})

# The oldest NVIDIA driver documented for each Blackwell GPU; older drivers do not know the GPU.
# The ECS AL2023 GPU AMI pins its driver per release (aws/amazon-ecs-ami NVIDIA_DRIVER_VERSION:
# 580.159.03 in the 20260820 release, above every figure here), but a fleet can meet an older AMI,
# so the job definitions carry the figure (MIN_NVIDIA_DRIVER) and container/launcher/driver_check.py
# refuses to start on an older driver.
# - B200: NVIDIA GPU Operator platform support, "HGX B200 requires a driver container version of
#   570.133.20 or later" (NVIDIA/cloud-native-docs gpu-operator/platform-support.rst).
# - B300: first supported with the 580.95.05 data-center driver (GPU Operator 25.10.0 release
#   notes: "Added support for NVIDIA HGX B300", driver 580.95.05).
# - RTX PRO 6000 Blackwell Server Edition: 575.57.08 for CUDA (GPU Operator platform support note),
#   580.95.05 for Omniverse RTX, which Isaac Sim is (Omniverse "Technical Requirements", Blackwell,
#   Data Center, R580); the Isaac Sim figure is the binding one on g7e.
# - RTX PRO 4500 Blackwell Server Edition (g7): a Blackwell RTX GPU like the RTX PRO 6000, so the
#   same Omniverse RTX figure (Omniverse "Technical Requirements", Blackwell, Data Center, R580).
MIN_NVIDIA_DRIVER = {
    "B200": "570.133.20",
    "B300": "580.95.05",
    "RTX PRO 6000": "580.95.05",
    "RTX PRO 4500": "580.95.05",
}


def _gpu(
    name: str, vcpus: int, mem: int, model: str, count: int, cards: tuple[int, ...], efa: int, gbps: int
) -> InstanceSpec:
    return InstanceSpec(
        name=name,
        vcpus=vcpus,
        memory_gib=mem,
        accelerator_kind=AcceleratorKind.NVIDIA_GPU,
        accelerator_model=model,
        accelerator_count=count,
        card_interfaces=cards,
        efa_interfaces=efa,
        network_gbps=gbps,
        runs_isaac_sim=model in RT_CORE_GPUS,
        min_nvidia_driver=MIN_NVIDIA_DRIVER.get(model),
    )


def _trainium(
    name: str,
    vcpus: int,
    mem: int,
    model: str,
    cores_per_device: int,
    cards: tuple[int, ...],
    gbps: int,
    lnc: int = 1,
) -> InstanceSpec:
    # Every Trainium type here carries 16 Neuron devices and EFA on every network card.
    return InstanceSpec(
        name=name,
        vcpus=vcpus,
        memory_gib=mem,
        accelerator_kind=AcceleratorKind.NEURON,
        accelerator_model=model,
        accelerator_count=16,
        neuron_cores_per_device=cores_per_device,
        logical_core_group=lnc,
        card_interfaces=cards,
        efa_interfaces=len(cards),
        network_gbps=gbps,
    )


def _cards(count: int, interfaces: int) -> tuple[int, ...]:
    """`count` network cards that each take `interfaces` network interfaces."""
    return (interfaces,) * count


_SPECS: tuple[InstanceSpec, ...] = (
    # G4dn (NVIDIA T4, Turing sm_75, 16 GB): EFA on 8xlarge and larger and the bare-metal size.
    _gpu("g4dn.8xlarge", 32, 128, "T4", 1, _cards(1, 4), 1, 50),
    _gpu("g4dn.12xlarge", 48, 192, "T4", 4, _cards(1, 8), 1, 50),
    _gpu("g4dn.16xlarge", 64, 256, "T4", 1, _cards(1, 4), 1, 50),
    _gpu("g4dn.metal", 96, 384, "T4", 8, _cards(1, 15), 1, 100),
    # G5 (NVIDIA A10G): EFA on 8xlarge and larger.
    _gpu("g5.8xlarge", 32, 128, "A10G", 1, _cards(1, 8), 1, 25),
    _gpu("g5.12xlarge", 48, 192, "A10G", 4, _cards(1, 15), 1, 40),
    _gpu("g5.16xlarge", 64, 256, "A10G", 1, _cards(1, 8), 1, 25),
    _gpu("g5.24xlarge", 96, 384, "A10G", 4, _cards(1, 15), 1, 50),
    _gpu("g5.48xlarge", 192, 768, "A10G", 8, _cards(1, 7), 1, 100),
    # G6 (NVIDIA L4): EFA on 8xlarge and larger, one network card each.
    _gpu("g6.8xlarge", 32, 128, "L4", 1, _cards(1, 8), 1, 25),
    _gpu("g6.12xlarge", 48, 192, "L4", 4, _cards(1, 8), 1, 40),
    _gpu("g6.16xlarge", 64, 256, "L4", 1, _cards(1, 15), 1, 25),
    _gpu("g6.24xlarge", 96, 384, "L4", 4, _cards(1, 15), 1, 50),
    _gpu("g6.48xlarge", 192, 768, "L4", 8, _cards(1, 15), 1, 100),
    # A type without EFA, listed so that asking for it is refused with a reason rather than
    # "unknown type" (in G5, G6, G6e and G7e, EFA starts at the 8xlarge size). 10 Gbps baseline.
    _gpu("g6.4xlarge", 16, 64, "L4", 1, _cards(1, 8), 0, 10),
    # Gr6 (NVIDIA L4, 1:8 vCPU:memory): EFA on the 8xlarge only.
    _gpu("gr6.8xlarge", 32, 256, "L4", 1, _cards(1, 8), 1, 25),
    # G6e (NVIDIA L40S): up to four network cards / 400 Gbps on the 48xlarge
    # (EC2 user guide, efa-acc-inst-types: "G6e instances support up to four network cards").
    _gpu("g6e.8xlarge", 32, 256, "L40S", 1, _cards(1, 8), 1, 25),
    _gpu("g6e.12xlarge", 48, 384, "L40S", 4, _cards(1, 10), 1, 100),
    _gpu("g6e.16xlarge", 64, 512, "L40S", 1, _cards(1, 15), 1, 35),
    _gpu("g6e.24xlarge", 96, 768, "L40S", 4, _cards(2, 10), 2, 200),
    _gpu("g6e.48xlarge", 192, 1536, "L40S", 8, _cards(4, 10), 4, 400),
    # G7e (NVIDIA RTX PRO 6000 Blackwell Server Edition, 96 GB): EFA from the 8xlarge size; the
    # 12xlarge has two GPUs (not four), 8 GiB of memory per vCPU up to 2 TiB on the 48xlarge.
    _gpu("g7e.8xlarge", 32, 256, "RTX PRO 6000", 1, _cards(1, 8), 1, 100),
    _gpu("g7e.12xlarge", 48, 512, "RTX PRO 6000", 2, _cards(1, 10), 1, 400),
    _gpu("g7e.24xlarge", 96, 1024, "RTX PRO 6000", 4, _cards(2, 10), 2, 800),
    _gpu("g7e.48xlarge", 192, 2048, "RTX PRO 6000", 8, _cards(4, 10), 4, 1600),
    # G7 (NVIDIA RTX PRO 4500 Blackwell Server Edition, 32 GB): EFA from the 8xlarge size; one
    # network card up to the 24xlarge, two on the 48xlarge (EFA on both).
    _gpu("g7.8xlarge", 32, 128, "RTX PRO 4500", 1, _cards(1, 10), 1, 80),
    _gpu("g7.12xlarge", 48, 192, "RTX PRO 4500", 2, _cards(1, 12), 1, 175),
    _gpu("g7.24xlarge", 96, 384, "RTX PRO 4500", 4, _cards(1, 24), 1, 350),
    _gpu("g7.48xlarge", 192, 768, "RTX PRO 4500", 8, _cards(2, 12), 2, 700),
    # P3dn (NVIDIA V100 32 GB, Volta sm_70): one network card, 100 Gbps. The PyTorch image's CUDA 13
    # builds have no sm_70 kernels (stacks/registry_stack.py warns): such a fleet needs an image of its own.
    _gpu("p3dn.24xlarge", 96, 768, "V100", 8, _cards(1, 15), 1, 100),
    # P4d / P4de (NVIDIA A100 40 GB / 80 GB): four network cards, 400 Gbps.
    _gpu("p4d.24xlarge", 96, 1152, "A100", 8, _cards(4, 15), 4, 400),
    _gpu("p4de.24xlarge", 96, 1152, "A100", 8, _cards(4, 15), 4, 400),
    # P5 / P5e (H100 / H200): 32 network cards, 3200 Gbps (EC2 user guide, efa-acc-inst-types,
    # "P5 and P5e instances support up to 32 network cards"). P5en: 16 cards, 3200 Gbps.
    # p5.4xlarge: one H100, one network card with EFA, 100 Gbps: the cheapest multi-node test.
    _gpu("p5.4xlarge", 16, 256, "H100", 1, _cards(1, 4), 1, 100),
    _gpu("p5.48xlarge", 192, 2048, "H100", 8, _cards(32, 2), 32, 3200),
    _gpu("p5e.48xlarge", 192, 2048, "H200", 8, _cards(32, 2), 32, 3200),
    _gpu("p5en.48xlarge", 192, 2048, "H200", 8, _cards(16, 4), 16, 3200),
    # P6 (Blackwell): p6-b200 has 8 cards, all with EFA, 3200 Gbps; p6-b300 has 17 cards, EFA on
    # cards 1-16 only (16 EFA interfaces), 6400 Gbps, 4 TiB of memory.
    _gpu("p6-b200.48xlarge", 192, 2048, "B200", 8, _cards(8, 4), 8, 3200),
    _gpu("p6-b300.48xlarge", 192, 4096, "B300", 8, _cards(17, 4), 16, 6400),
    # Trainium: 8 network cards on trn1.32xlarge, 16 on trn1n.32xlarge (Neuron docs, multi-node
    # setup "EFA interfaces per instance"); trn2.48xlarge 16 cards, 3200 Gbps. Trainium1 devices
    # have 2 NeuronCores each, Trainium2 devices 8 (Neuron docs, Trainium / Trainium2 architecture).
    # Trainium2 runs with Logical NeuronCore configuration 2 by default: 64 ranks per trn2.48xlarge
    # (Neuron docs, "Best practices for training on AWS Neuron" and "Logical NeuronCore configuration").
    _trainium("trn1.32xlarge", 128, 512, "Trainium", 2, _cards(8, 5), 800),
    _trainium("trn1n.32xlarge", 128, 512, "Trainium", 2, _cards(16, 5), 1600),
    _trainium("trn2.48xlarge", 192, 2048, "Trainium2", 8, _cards(16, 2), 3200, lnc=2),
)

CATALOG: dict[str, InstanceSpec] = {spec.name: spec for spec in _SPECS}


def types_for(profile: Profile) -> tuple[str, ...]:
    """Instance types a profile accepts: its accelerator family, EFA-capable."""
    return tuple(s.name for s in _SPECS if s.profile is profile and s.efa_supported)
