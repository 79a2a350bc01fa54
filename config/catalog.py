"""Instance types the training profiles may run on, with the figures the stacks derive from.

Figures come from the EC2 instance-type specifications ("Accelerated computing",
https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html: vCPUs, memory, accelerators,
network bandwidth, network cards, EFA support) unless a line cites something else. The maximum
number of EFA interfaces equals the number of network cards for every type listed here (EC2 user
guide, efa-acc-inst-types: one EFA interface per network card).

Interfaces per network card (`interfaces_per_card`) are EC2 DescribeInstanceTypes'
NetworkInfo.NetworkCards[].MaximumNetworkInterfaces; the same figures are kept in
aws/amazon-vpc-cni-k8s pkg/vpc/vpc_ip_resource_limit.go (read 2026-08). Every card of the types
listed here takes the same number, so one figure per type is enough.

Isaac Sim needs an NVIDIA RTX GPU with RT cores; A100, H100 and H200 have none and are listed as
unsupported (Isaac Sim documentation, "Isaac Sim Requirements": GPUs without RT cores are not
supported). L4, L40S and A10G are RTX-class data-centre GPUs with RT cores.
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
    network_cards: int
    # Network interfaces each network card takes (card 0 holds the primary interface and, on
    # Batch, the job's own awsvpc task ENI).
    interfaces_per_card: int
    network_gbps: int
    efa_supported: bool = True
    # Whether the GPU can run Isaac Sim (RT cores); False for every non-GPU type.
    runs_isaac_sim: bool = False

    @property
    def profile(self) -> Profile:
        if self.accelerator_kind is AcceleratorKind.NEURON:
            return Profile.TRAINIUM
        return Profile.GPU

    @property
    def max_efa_interfaces(self) -> int:
        return self.network_cards if self.efa_supported else 0

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
RT_CORE_GPUS = frozenset({"A10G", "L4", "L40S"})


def _gpu(name: str, vcpus: int, mem: int, model: str, count: int, cards: int, per_card: int, gbps: int) -> InstanceSpec:
    return InstanceSpec(
        name=name,
        vcpus=vcpus,
        memory_gib=mem,
        accelerator_kind=AcceleratorKind.NVIDIA_GPU,
        accelerator_model=model,
        accelerator_count=count,
        network_cards=cards,
        interfaces_per_card=per_card,
        network_gbps=gbps,
        runs_isaac_sim=model in RT_CORE_GPUS,
    )


def _trainium(
    name: str,
    vcpus: int,
    mem: int,
    model: str,
    cores_per_device: int,
    cards: int,
    per_card: int,
    gbps: int,
    lnc: int = 1,
) -> InstanceSpec:
    # Every Trainium type here carries 16 Neuron devices.
    return InstanceSpec(
        name=name,
        vcpus=vcpus,
        memory_gib=mem,
        accelerator_kind=AcceleratorKind.NEURON,
        accelerator_model=model,
        accelerator_count=16,
        neuron_cores_per_device=cores_per_device,
        logical_core_group=lnc,
        network_cards=cards,
        interfaces_per_card=per_card,
        network_gbps=gbps,
    )


_SPECS: tuple[InstanceSpec, ...] = (
    # G5 (NVIDIA A10G).
    _gpu("g5.48xlarge", 192, 768, "A10G", 8, 1, 7, 100),
    # G6 (NVIDIA L4): EFA on 8xlarge and larger, one network card each.
    _gpu("g6.8xlarge", 32, 128, "L4", 1, 1, 8, 25),
    _gpu("g6.12xlarge", 48, 192, "L4", 4, 1, 8, 40),
    _gpu("g6.16xlarge", 64, 256, "L4", 1, 1, 15, 25),
    _gpu("g6.24xlarge", 96, 384, "L4", 4, 1, 15, 50),
    _gpu("g6.48xlarge", 192, 768, "L4", 8, 1, 15, 100),
    # Types without EFA, listed so that asking for them is refused with a reason rather than
    # "unknown type" (in G5, G6 and G6e, EFA starts at the 8xlarge size).
    InstanceSpec(
        name="g6.4xlarge",
        vcpus=16,
        memory_gib=64,
        accelerator_kind=AcceleratorKind.NVIDIA_GPU,
        accelerator_model="L4",
        accelerator_count=1,
        network_cards=1,
        interfaces_per_card=8,
        network_gbps=25,
        efa_supported=False,
    ),
    # G6e (NVIDIA L40S): up to four network cards / 400 Gbps on the 48xlarge
    # (EC2 user guide, efa-acc-inst-types: "G6e instances support up to four network cards").
    _gpu("g6e.8xlarge", 32, 256, "L40S", 1, 1, 8, 25),
    _gpu("g6e.12xlarge", 48, 384, "L40S", 4, 1, 10, 100),
    _gpu("g6e.16xlarge", 64, 512, "L40S", 1, 1, 15, 35),
    _gpu("g6e.24xlarge", 96, 768, "L40S", 4, 2, 10, 200),
    _gpu("g6e.48xlarge", 192, 1536, "L40S", 8, 4, 10, 400),
    # P4d / P4de (NVIDIA A100 40 GB / 80 GB): four network cards, 400 Gbps.
    _gpu("p4d.24xlarge", 96, 1152, "A100", 8, 4, 15, 400),
    _gpu("p4de.24xlarge", 96, 1152, "A100", 8, 4, 15, 400),
    # P5 / P5e (H100 / H200): 32 network cards, 3200 Gbps (EC2 user guide, efa-acc-inst-types,
    # "P5 and P5e instances support up to 32 network cards"). P5en: 16 cards, 3200 Gbps.
    _gpu("p5.48xlarge", 192, 2048, "H100", 8, 32, 2, 3200),
    _gpu("p5e.48xlarge", 192, 2048, "H200", 8, 32, 2, 3200),
    _gpu("p5en.48xlarge", 192, 2048, "H200", 8, 16, 4, 3200),
    # Trainium: 8 network cards on trn1.32xlarge, 16 on trn1n.32xlarge (Neuron docs, multi-node
    # setup "EFA interfaces per instance"); trn2.48xlarge 16 cards, 3200 Gbps. Trainium1 devices
    # have 2 NeuronCores each, Trainium2 devices 8 (Neuron docs, Trainium / Trainium2 architecture).
    # Trainium2 runs with Logical NeuronCore configuration 2 by default: 64 ranks per trn2.48xlarge
    # (Neuron docs, "Best practices for training on AWS Neuron" and "Logical NeuronCore configuration").
    _trainium("trn1.32xlarge", 128, 512, "Trainium", 2, 8, 5, 800),
    _trainium("trn1n.32xlarge", 128, 512, "Trainium", 2, 16, 5, 1600),
    _trainium("trn2.48xlarge", 192, 2048, "Trainium2", 8, 16, 2, 3200, lnc=2),
)

CATALOG: dict[str, InstanceSpec] = {spec.name: spec for spec in _SPECS}


def types_for(profile: Profile) -> tuple[str, ...]:
    """Instance types a profile accepts: its accelerator family, EFA-capable."""
    return tuple(s.name for s in _SPECS if s.profile is profile and s.efa_supported)
