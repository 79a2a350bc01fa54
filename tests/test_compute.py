"""The compute path for every catalog type: every EFA attached, placement, scale to zero, images."""

import pytest
from aws_cdk.assertions import Annotations, Match

from config.catalog import CATALOG
from tests.harness import TYPE_VARIANTS, resources, synth

STACK = "TrainingCompute"
CASES = [
    (variant, profile, instance)
    for variant, pair in TYPE_VARIANTS.items()
    for profile, instance in zip(("Gpu", "Trainium"), pair, strict=True)
]
IDS = [f"{profile}-{instance}" for _, profile, instance in CASES]


def by_prefix(template, resource_type, prefix):
    (item,) = [r for k, r in resources(template, resource_type).items() if k.startswith(prefix)]
    return item["Properties"]


def fleet(variant, profile):
    template = synth(variant).templates[STACK]
    return (
        template,
        by_prefix(template, "AWS::EC2::LaunchTemplate", f"{profile}LaunchTemplate")["LaunchTemplateData"],
        by_prefix(template, "AWS::Batch::ComputeEnvironment", profile),
    )


@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_every_efa_interface_is_attached(variant, profile, instance):
    _, lt, _ = fleet(variant, profile)
    spec = CATALOG[instance]
    interfaces = lt["NetworkInterfaces"]
    efa = [i for i in interfaces if i["InterfaceType"] == "efa-only"]
    assert len(efa) == spec.max_efa_interfaces == spec.network_cards
    # One EFA per network card, every card used once.
    assert sorted(i["NetworkCardIndex"] for i in efa) == list(range(spec.network_cards))
    primary = [i for i in interfaces if i["DeviceIndex"] == 0 and i["NetworkCardIndex"] == 0]
    assert len(primary) == 1 and primary[0]["InterfaceType"] == "interface"
    assert len(interfaces) == spec.network_cards + 1
    # No two interfaces on the same (card, device) slot.
    assert len({(i["NetworkCardIndex"], i["DeviceIndex"]) for i in interfaces}) == len(interfaces)


@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_efa_interfaces_carry_the_efa_group_and_primary_the_node_group(variant, profile, instance):
    _, lt, _ = fleet(variant, profile)
    groups = {str(i["Groups"]) for i in lt["NetworkInterfaces"] if i["InterfaceType"] == "efa-only"}
    (efa_group,) = groups
    assert "EfaSecurityGroup" in efa_group
    (primary,) = [i for i in lt["NetworkInterfaces"] if i["InterfaceType"] == "interface"]
    assert "NodeSecurityGroup" in str(primary["Groups"]) and "EfaSecurityGroup" not in str(primary["Groups"])
    assert "SecurityGroupIds" not in lt and "SecurityGroups" not in lt


@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_compute_environment_is_on_demand_scale_to_zero_exact_type(variant, profile, instance):
    _template, _, ce = fleet(variant, profile)
    resources_ = ce["ComputeResources"]
    assert ce["Type"] == "MANAGED"
    assert resources_["Type"] == "EC2"  # on-demand; not SPOT, FARGATE or FARGATE_SPOT
    assert "BidPercentage" not in resources_ and "SpotIamFleetRole" not in resources_
    assert resources_["MinvCpus"] == 0 and resources_["DesiredvCpus"] == 0
    assert resources_["MaxvCpus"] == 4 * CATALOG[instance].vcpus  # default max nodes: 4
    assert resources_["InstanceTypes"] == [instance]
    assert "SecurityGroupIds" not in resources_  # exclusive with launch-template interfaces
    (subnet,) = resources_["Subnets"]
    assert "TrainingSubnet1" in subnet["Fn::ImportValue"]


@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_cluster_placement_group_is_associated(variant, profile, instance):
    template, _, ce = fleet(variant, profile)
    (pg_id,) = [k for k in resources(template, "AWS::EC2::PlacementGroup") if k.startswith(f"{profile}PlacementGroup")]
    assert template["Resources"][pg_id]["Properties"]["Strategy"] == "cluster"
    assert ce["ComputeResources"]["PlacementGroup"] == {"Fn::GetAtt": [pg_id, "GroupName"]}


@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_image_matches_the_accelerator(variant, profile, instance):
    template, _, ce = fleet(variant, profile)
    (config,) = ce["ComputeResources"]["Ec2Configuration"]
    if profile == "Gpu":
        assert config == {"ImageType": "ECS_AL2023_NVIDIA"}
    else:
        assert config["ImageType"] == "ECS_AL2023"
        parameter = template["Parameters"][config["ImageIdOverride"]["Ref"]]
        assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
        assert parameter["Default"] == "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id"


@pytest.mark.parametrize(("variant", "profile", "instance"), CASES, ids=IDS)
def test_imdsv2_and_encrypted_gp3_root(variant, profile, instance):
    _, lt, _ = fleet(variant, profile)
    assert lt["MetadataOptions"]["HttpTokens"] == "required"
    (root,) = lt["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda"
    assert root["Ebs"] == {"VolumeSize": 300, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}
    assert "UserData" not in lt  # nothing downloaded or installed at boot


def test_launch_template_version_follows_the_template():
    _template, _, ce = fleet("default", "Gpu")
    version = ce["ComputeResources"]["LaunchTemplate"]["Version"]
    assert version["Fn::GetAtt"][1] == "LatestVersionNumber"


def test_instance_role_is_only_the_ecs_instance_policy():
    template = synth("default").templates[STACK]
    roles = resources(template, "AWS::IAM::Role").values()
    assert len(roles) == 2
    for role in roles:
        (policy,) = role["Properties"]["ManagedPolicyArns"]
        assert "AmazonEC2ContainerServiceforEC2Role" in str(policy)
        assert "Policies" not in role["Properties"]
        (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert not resources(template, "AWS::IAM::Policy")


def test_odcr_is_targeted_without_placement_group():
    result = synth("reservations")
    template = result.templates[STACK]
    lt = by_prefix(template, "AWS::EC2::LaunchTemplate", "GpuLaunchTemplate")["LaunchTemplateData"]
    target = lt["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert "InstanceMarketOptions" not in lt
    assert not resources(template, "AWS::EC2::PlacementGroup")
    for ce in resources(template, "AWS::Batch::ComputeEnvironment").values():
        assert "PlacementGroup" not in ce["Properties"]["ComputeResources"]


def test_capacity_block_uses_its_market_type():
    template = synth("reservations").templates[STACK]
    lt = by_prefix(template, "AWS::EC2::LaunchTemplate", "TrainiumLaunchTemplate")["LaunchTemplateData"]
    assert lt["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert lt["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == (
        "cr-0fedcba9876543210"
    )


def test_placement_group_omission_is_warned():
    stack = synth("reservations").app.node.find_child(STACK)
    warnings = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("no cluster placement group"))
    texts = " ".join(str(w.entry.data) for w in warnings)
    assert len(warnings) == 2 and "cr-0123456789abcdef0" in texts and "cr-0fedcba9876543210" in texts


def test_no_warning_without_reservation():
    stack = synth("default").app.node.find_child(STACK)
    assert Annotations.from_stack(stack).find_warning("*", Match.any_value()) == []


def test_max_nodes_and_root_volume_follow_context():
    template = synth("reservations").templates[STACK]
    ce = by_prefix(template, "AWS::Batch::ComputeEnvironment", "Gpu")
    assert ce["ComputeResources"]["MaxvCpus"] == 10 * CATALOG["g6.12xlarge"].vcpus
    lt = by_prefix(template, "AWS::EC2::LaunchTemplate", "GpuLaunchTemplate")["LaunchTemplateData"]
    assert lt["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500
