"""Security- and cost-relevant properties of the network stack, asserted one by one."""

import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from tests.harness import resources, synth, synth_with

STACK = "TrainingNetwork"


@pytest.fixture(scope="module")
def template():
    return synth("default").templates[STACK]


def efa_group_id(template):
    (logical_id,) = [
        k
        for k, r in resources(template, "AWS::EC2::SecurityGroup").items()
        if r["Properties"]["GroupDescription"].startswith("EFA")
    ]
    return logical_id


def test_one_nat_gateway_and_two_azs_by_default(template):
    assert len(resources(template, "AWS::EC2::NatGateway")) == 1
    azs = {str(r["Properties"]["AvailabilityZone"]) for r in resources(template, "AWS::EC2::Subnet").values()}
    assert len(azs) == 2


def test_azs_come_from_cloudformation_not_a_lookup(template):
    subnets = resources(template, "AWS::EC2::Subnet").values()
    assert all("Fn::Select" in s["Properties"]["AvailabilityZone"] for s in subnets)


def test_environment_bound_synth_needs_no_lookup_and_passes_cdk_nag():
    # As `cdk synth` on a machine with a default region: literals instead of pseudo parameters in
    # ARNs, and so in cdk-nag's finding ids, which the acknowledgements must follow. With the optional
    # parts that carry acknowledgements of their own (the cloud image build, the fleet check).
    context = {"imageBuild": "cloud", "healthCheckSchedule": "rate(1 day)"}
    result = synth_with(context, cdk.Environment(account="123456789012", region="us-east-1"))
    assert "missing" not in result.manifest
    assert result.templates[STACK]["Resources"]
    assert resources(result.templates["TrainingRegistry"], "AWS::CodeBuild::Project")


def test_pinned_az_leaves_the_network_as_it_is(template):
    """availabilityZone moves fleets, not the VPC's subnets: they stay in the region's first two AZs,
    with the default deployment's logical ids and CIDRs (README, design decisions)."""
    pinned = synth("pinned-az-endpoints").templates[STACK]
    subnets = {k: r["Properties"] for k, r in resources(pinned, "AWS::EC2::Subnet").items()}
    assert subnets == {k: r["Properties"] for k, r in resources(template, "AWS::EC2::Subnet").items()}
    assert {k: p["CidrBlock"] for k, p in subnets.items()} == {
        "NetworkVpcPublicSubnet1Subnet36933139": "10.0.0.0/24",
        "NetworkVpcPublicSubnet2SubnetC427CCE0": "10.0.1.0/24",
        "NetworkVpcTrainingSubnet1Subnet78795A94": "10.0.64.0/18",
        "NetworkVpcTrainingSubnet2Subnet2155B0E1": "10.0.128.0/18",
    }


def test_network_exports_what_any_version_of_its_importers_may_import(template):
    """CDK deploys this stack first; an export a deployed stack still imports cannot be removed.
    So the network exports its VPC, first training subnet and route table and both security
    groups in every configuration, imported or not."""
    exported = {json.dumps(o["Value"], sort_keys=True) for o in template["Outputs"].values() if "Export" in o}
    assert exported == {
        json.dumps(v, sort_keys=True)
        for v in (
            {"Ref": "NetworkVpc7FB7348F"},
            {"Ref": "NetworkVpcTrainingSubnet1Subnet78795A94"},
            {"Ref": "NetworkVpcTrainingSubnet1RouteTable28B83122"},
            {"Fn::GetAtt": ["NetworkEfaSecurityGroup3744DDDC", "GroupId"]},
            {"Fn::GetAtt": ["NetworkNodeSecurityGroup642EFBE4", "GroupId"]},
        )
    }


def test_s3_gateway_endpoint_on_the_training_subnets(template):
    Template.from_json(template).has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {"VpcEndpointType": "Gateway", "ServiceName": Match.object_like({"Fn::Join": Match.any_value()})},
    )
    (endpoint,) = resources(template, "AWS::EC2::VPCEndpoint").values()
    assert "s3" in str(endpoint["Properties"]["ServiceName"])
    assert len(endpoint["Properties"]["RouteTableIds"]) == 2  # the two private (training) subnets


def test_no_interface_endpoints_unless_asked(template):
    types = [r["Properties"].get("VpcEndpointType") for r in resources(template, "AWS::EC2::VPCEndpoint").values()]
    assert types == ["Gateway"]


def test_interface_endpoints_on_request():
    template = synth("pinned-az-endpoints").templates[STACK]
    interface = [
        r
        for r in resources(template, "AWS::EC2::VPCEndpoint").values()
        if r["Properties"]["VpcEndpointType"] == "Interface"
    ]
    names = sorted(str(r["Properties"]["ServiceName"]) for r in interface)
    assert len(interface) == 4
    for service in ("ecr.api", "ecr.dkr", "logs", "sts"):
        assert any(service in n for n in names), names
    assert all(r["Properties"]["PrivateDnsEnabled"] for r in interface)


@pytest.mark.parametrize("variant", ["default", "pinned-az-endpoints"])
def test_the_training_subnets_reach_aws_apis_through_nat_with_or_without_interface_endpoints(variant):
    """Job containers call AWS APIs that no endpoint may carry: the main node's DescribeJobs on its child node jobs
    (container/launcher/node_watch.py) needs the Batch API, and `batch` is an interface endpoint only on request. Every
    training subnet's default route is a NAT gateway, and natGateways cannot be 0 (tests/test_context.py)."""
    template = synth(variant).templates[STACK]
    subnets = {
        k for k, r in resources(template, "AWS::EC2::Subnet").items() if not r["Properties"]["MapPublicIpOnLaunch"]
    }
    assert len(subnets) >= 2
    tables = {
        a["Properties"]["RouteTableId"]["Ref"]
        for a in resources(template, "AWS::EC2::SubnetRouteTableAssociation").values()
        if a["Properties"]["SubnetId"]["Ref"] in subnets
    }
    default_routes = {
        r["Properties"]["RouteTableId"]["Ref"]: r["Properties"]
        for r in resources(template, "AWS::EC2::Route").values()
        if r["Properties"].get("DestinationCidrBlock") == "0.0.0.0/0"
    }
    assert tables and all("NatGatewayId" in default_routes[t] for t in tables)


def test_two_nat_gateways_on_request():
    assert len(resources(synth("two-nat").templates[STACK], "AWS::EC2::NatGateway")) == 2


def test_flow_logs_all_traffic_with_retention(template):
    (flow_log,) = resources(template, "AWS::EC2::FlowLog").values()
    assert flow_log["Properties"]["TrafficType"] == "ALL"
    assert flow_log["Properties"]["LogDestinationType"] == "cloud-watch-logs"
    (group,) = resources(template, "AWS::Logs::LogGroup").values()
    assert group["Properties"]["RetentionInDays"] == 30
    assert group["DeletionPolicy"] == "Retain"


def test_flow_log_retention_follows_context():
    template = synth("pinned-az-endpoints").templates[STACK]
    (group,) = resources(template, "AWS::Logs::LogGroup").values()
    assert group["Properties"]["RetentionInDays"] == 365


def test_efa_group_allows_only_itself(template):
    sg = efa_group_id(template)
    group = template["Resources"][sg]["Properties"]
    assert "SecurityGroupIngress" not in group and "SecurityGroupEgress" not in group
    ingress = list(resources(template, "AWS::EC2::SecurityGroupIngress").values())
    egress = list(resources(template, "AWS::EC2::SecurityGroupEgress").values())
    assert len(ingress) == 1 and len(egress) == 1
    for rule, peer in ((ingress[0], "SourceSecurityGroupId"), (egress[0], "DestinationSecurityGroupId")):
        p = rule["Properties"]
        assert p["IpProtocol"] == "-1"
        assert p["GroupId"] == {"Fn::GetAtt": [sg, "GroupId"]}
        assert p[peer] == {"Fn::GetAtt": [sg, "GroupId"]}
        assert "CidrIp" not in p and "CidrIpv6" not in p


def test_no_security_group_is_open_to_the_world(template):
    for r in resources(template, "AWS::EC2::SecurityGroup").values():
        assert "SecurityGroupIngress" not in r["Properties"]
    for r in resources(template, "AWS::EC2::SecurityGroupIngress").values():
        assert "CidrIp" not in r["Properties"]


def test_default_security_group_is_kept_for_batch_task_enis(template):
    # Batch MNP task ENIs get the VPC default group (see training_network.py); CDK's restrict
    # custom resource would remove its self-ingress and egress rules, so it must not be there.
    assert not [r for r in template["Resources"].values() if r["Type"].startswith("Custom::")]
    assert not resources(template, "AWS::Lambda::Function")


def test_stack_exposes_objects_for_other_stacks():
    stack = synth("default").app.node.find_child(STACK)
    net = stack.network
    assert net.training_subnet.subnet_id and net.efa_security_group.security_group_id and net.vpc.vpc_id
    assert net.training_subnet.node.path == net.vpc.private_subnets[0].node.path
    assert stack.resolve(net.training_subnet.availability_zone) == {"Fn::Select": [0, {"Fn::GetAZs": ""}]}


def test_a_skipped_zone_table_is_warned_about_at_synth_in_one_line():
    """skipZoneTable (issue 46): synth says which region's AZ names went unchecked."""
    from aws_cdk import aws_logs as logs
    from aws_cdk.assertions import Annotations

    from config.context import read_settings
    from config.zones import read_on
    from stacks.network_stack import NetworkStack

    def warnings(context):
        settings = read_settings(context).network
        stack = NetworkStack(cdk.App(), "Net", settings=settings, log_retention=logs.RetentionDays.ONE_MONTH)
        return [str(w.entry.data) for w in Annotations.from_stack(stack).find_warning("*", Match.any_value())]

    (warning,) = warnings({"availabilityZone": "cn-north-1c", "skipZoneTable": "cn-north-1"})
    assert warning.startswith(
        f"skipZoneTable=cn-north-1: AZ names of cn-north-1 are not checked against the zone table of {read_on()}"
    )
    assert "\n" not in warning and len(warning) <= 200
    assert warnings({"availabilityZone": "cn-north-1d"}) == []
