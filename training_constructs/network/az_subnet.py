"""A training subnet in an Availability Zone the user named, whose identity is that AZ.

The VPC's own subnets sit in the region's first two AZs (Fn::GetAZs, resolved at deploy time) and
never change. A named AZ gets a subnet in a VPC CIDR block of its own, derived from the AZ's
letter, so that its logical id (the construct id is the AZ name) and its CIDR follow from what it
is and not from where it stands in a list: adding, moving, reordering or removing fleets creates
and deletes whole subnets and never moves one to another AZ on the same CIDR.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from config import limits

if TYPE_CHECKING:
    from training_constructs.network.training_network import TrainingNetwork

# Who holds the subnet: its offset inside the AZ's /16 (10.<n>.0.0/16, n from the AZ's letter).
# The Batch fleets' subnets live in the compute stack, the Slurm cluster's in its own stack; two
# stacks never share a CIDR block.
BATCH_OFFSET = 0
SLURM_OFFSET = 64


def az_subnet_cidr(availability_zone: str, offset: int) -> str:
    """us-west-2b, 0 -> 10.2.0.0/18. Secondary VPC CIDR blocks of a 10.0.0.0/8 VPC may come from the
    rest of 10.0.0.0/8 (VPC user guide, "VPC CIDR blocks", IPv4 CIDR block association restrictions);
    the VPC's primary block is 10.0.0.0/16, so the letters a..z take 10.1 .. 10.26."""
    letter = availability_zone[-1]
    return f"10.{string.ascii_lowercase.index(letter) + 1}.{offset}.0/{limits.TRAINING_SUBNET_MASK}"


def az_construct_id(availability_zone: str) -> str:
    """us-west-2b -> UsWest2b: the construct id, hence the logical id, of the AZ's subnet."""
    return "".join(part.capitalize() for part in availability_zone.split("-"))


class AzSubnet(Construct):
    """A private training subnet in `availability_zone`, routed through `route_table_id` (the VPC's
    first training route table: NAT egress and the S3 gateway endpoint).

    L1 on purpose: the L2 Subnet always makes a route table of its own, which the network stack's S3
    endpoint and NAT route cannot reach from another stack. Attribute: `subnet` (ISubnet).
    """

    def __init__(
        self,
        scope: Construct,
        *,
        vpc_id: str,
        route_table_id: str,
        availability_zone: str,
        offset: int,
    ) -> None:
        super().__init__(scope, az_construct_id(availability_zone))
        cidr = az_subnet_cidr(availability_zone, offset)
        block = ec2.CfnVPCCidrBlock(self, "CidrBlock", vpc_id=vpc_id, cidr_block=cidr)
        subnet = ec2.CfnSubnet(self, "Subnet", vpc_id=vpc_id, availability_zone=availability_zone, cidr_block=cidr)
        # The block must be associated before a subnet can take addresses from it.
        subnet.add_resource_dependency(block)
        ec2.CfnSubnetRouteTableAssociation(self, "RouteTable", subnet_id=subnet.ref, route_table_id=route_table_id)
        reason = "the user named this AZ: placement groups and capacity reservations need a known AZ"
        Validations.of(subnet).acknowledge(Acknowledgment(id="CloudFormation-Validate::W3010", reason=reason))
        # cfn-lint reads this; the reason is the one above.
        subnet.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3010"]}})
        self.subnet = ec2.Subnet.from_subnet_attributes(
            self,
            "Imported",
            subnet_id=subnet.ref,
            availability_zone=availability_zone,
            ipv4_cidr_block=cidr,
            route_table_id=route_table_id,
        )


def slurm_subnet(
    scope: Construct, *, network: TrainingNetwork, availability_zone: str | None
) -> tuple[ec2.ISubnet, AzSubnet | None]:
    """The Slurm cluster's subnet (either Slurm option's): the network's first training subnet, or,
    in a named AZ, a subnet of the cluster's own stack (under the construct `Subnets`); one in the
    compute stack would come and go with the fleets there, under the Slurm stack's import."""
    if not availability_zone:
        return network.training_subnet, None
    own = AzSubnet(
        Construct(scope, "Subnets"),
        vpc_id=network.vpc.vpc_id,
        route_table_id=network.training_route_table_id,
        availability_zone=availability_zone,
        offset=SLURM_OFFSET,
    )
    return own.subnet, own
