"""The VPC a training fleet runs in: one training subnet, NAT egress, an S3 gateway endpoint,
flow logs, and the security groups EFA needs."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from config import limits

VPC_CIDR = "10.0.0.0/16"
TRAINING_SUBNETS = "Training"
PUBLIC_SUBNETS = "Public"


class TrainingNetwork(Construct):
    """A VPC with a public and a private training subnet in each of the region's first two AZs.

    Public attributes: `vpc`, `training_subnet` (in the first AZ, the subnet of fleets that name no
    AZ), `training_route_table_id` (its route table: NAT egress and the S3 endpoint, which the
    subnets of named AZs share, see AzSubnet), `efa_security_group` (all traffic to and from itself,
    nothing else) and `node_security_group` (outbound only, for the host's own traffic: ECS, ECR,
    S3, logs).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        availability_zones: Sequence[str],
        nat_gateways: int,
        interface_endpoints: Sequence[str],
        flow_log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            availability_zones=list(availability_zones),
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name=PUBLIC_SUBNETS, subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # /18: room for one task ENI per node plus one address per EFA-with-ENA interface
                # on fleets of hundreds of nodes.
                ec2.SubnetConfiguration(
                    name=TRAINING_SUBNETS,
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=limits.TRAINING_SUBNET_MASK,
                ),
            ],
            # Batch multi-node jobs with EFA interfaces in the launch template cannot name security
            # groups on the compute environment, so each job container's ENI (awsvpc) gets the VPC's
            # default security group (Batch user guide, mnp-ce; aws/aws-cdk#21577). AWS creates that
            # group allowing inbound from itself and all outbound, which is exactly what node-to-node
            # rendezvous and S3/ECR access from the container need, and nothing from outside the group.
            # restrictDefaultSecurityGroup would strip those rules, so it is off on purpose.
            restrict_default_security_group=False,
        )
        # CDK creates one subnet of the group per AZ, in the order the AZs were given.
        self.training_subnet: ec2.ISubnet = self.vpc.select_subnets(subnet_group_name=TRAINING_SUBNETS).subnets[0]
        self.training_route_table_id = self.training_subnet.route_table.route_table_id

        # Image layers, datasets and checkpoints go to S3 without paying for NAT traffic.
        self.vpc.add_gateway_endpoint(
            "S3Endpoint",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[ec2.SubnetSelection(subnet_group_name=TRAINING_SUBNETS)],
        )
        if interface_endpoints:
            # One group for all endpoints, HTTPS from inside the VPC only.
            endpoint_group = ec2.SecurityGroup(
                self,
                "EndpointSecurityGroup",
                vpc=self.vpc,
                description="Interface endpoints: HTTPS from the VPC",
                allow_all_outbound=False,
            )
            endpoint_group.add_ingress_rule(ec2.Peer.ipv4(VPC_CIDR), ec2.Port.tcp(443), "HTTPS from the VPC")
            for name in interface_endpoints:
                self.vpc.add_interface_endpoint(
                    _endpoint_id(name),
                    service=ec2.InterfaceVpcEndpointAwsService(name),
                    subnets=ec2.SubnetSelection(subnets=[self.training_subnet]),
                    security_groups=[endpoint_group],
                    open=False,
                    private_dns_enabled=True,
                )

        flow_logs = logs.LogGroup(self, "FlowLogs", retention=flow_log_retention, removal_policy=RemovalPolicy.RETAIN)
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

        # EFA needs all traffic to and from the group itself (EC2 user guide, efa-start,
        # "Prepare an EFA-enabled security group"); nothing else gets in or out through it.
        self.efa_security_group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=self.vpc,
            description="EFA: all traffic between members of this group only",
            allow_all_outbound=False,
        )
        self.efa_security_group.add_ingress_rule(
            self.efa_security_group, ec2.Port.all_traffic(), "EFA and NCCL traffic from group members"
        )
        self.efa_security_group.add_egress_rule(
            self.efa_security_group, ec2.Port.all_traffic(), "EFA and NCCL traffic to group members"
        )

        self.node_security_group = ec2.SecurityGroup(
            self,
            "NodeSecurityGroup",
            vpc=self.vpc,
            description="Training hosts: outbound to AWS APIs, ECR and S3; no inbound",
            allow_all_outbound=True,
        )

        # Exported whether or not another stack imports them now: CDK deploys this stack first, and a
        # deployed compute or ParallelCluster stack may still import any of them (CloudFormation
        # refuses to delete an export in use). These never change, so no deploy ever removes one.
        for value in (
            self.vpc.vpc_id,
            self.training_subnet.subnet_id,
            self.training_route_table_id,
            self.efa_security_group.security_group_id,
            self.node_security_group.security_group_id,
        ):
            Stack.of(self).export_value(value)


def _endpoint_id(service: str) -> str:
    return "".join(part.capitalize() for part in service.replace("-", ".").split(".")) + "Endpoint"
