"""The compute path for every catalog type: every EFA attached with room for the task ENI, placement,
scale to zero, in-place updates, images and the AMI policy."""

import base64
import email

import pytest
from aws_cdk.assertions import Annotations, Match

from config import limits
from config.catalog import CATALOG, AcceleratorKind
from config.metrics import NAMESPACE
from config.settings import fleet_construct_id as construct_id
from tests.harness import EFA_TYPES, bundle_command, fleet_name, resources, synth, synth_with

STACK = "TrainingCompute"


def by_prefix(template, resource_type, prefix):
    """The one resource of this type whose logical id starts with `prefix`, not counting a fleet's
    fallback placements (`<Fleet>Fallback<n>...`) unless the prefix names one."""
    (item,) = [
        r
        for k, r in resources(template, resource_type).items()
        if k.startswith(prefix) and not k[len(prefix) :].startswith("Fallback")
    ]
    return item


def fleet(variant, fleet_id):
    template = synth(variant).templates[STACK]
    lt = by_prefix(template, "AWS::EC2::LaunchTemplate", f"{fleet_id}LaunchTemplate")["Properties"]
    return template, lt["LaunchTemplateData"], by_prefix(template, "AWS::Batch::ComputeEnvironment", f"{fleet_id}")


def of_type(instance):
    """(template, launch template data, compute environment resource) of the all-types fleet."""
    return fleet("all-types", construct_id(fleet_name(instance)))


def interfaces_on(lt, card):
    return [i for i in lt["NetworkInterfaces"] if i["NetworkCardIndex"] == card]


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_one_efa_device_on_every_efa_card_and_the_primary_on_card_0(instance):
    _, lt, _ = of_type(instance)
    spec = CATALOG[instance]
    interfaces = lt["NetworkInterfaces"]
    # AWS's Batch layout: EFA with ENA ("efa"), device index 0, once per EFA card; no efa-only.
    efa = [i for i in interfaces if i.get("InterfaceType") == "efa"]
    assert all(i["DeviceIndex"] == 0 for i in interfaces)
    assert sorted(i["NetworkCardIndex"] for i in efa) == list(spec.efa_cards)
    assert len(efa) == spec.max_efa_interfaces
    assert len(interfaces) == spec.node_interfaces
    assert len(interfaces_on(lt, 0)) == 1  # the primary interface: card 0, device index 0


# One representative of every layout family: network cards -> (type, interfaces expected on each
# card as (card, type) with None for ENA only). Written out, not derived from the catalog.
LAYOUT_FAMILIES = {
    1: ("g6.12xlarge", [(0, "efa")]),
    4: ("g6e.48xlarge", [(c, "efa") for c in range(4)]),
    8: ("p6-b200.48xlarge", [(c, "efa") for c in range(8)]),
    16: ("p5en.48xlarge", [(c, "efa") for c in range(16)]),
    17: ("p6-b300.48xlarge", [(0, None)] + [(c, "efa") for c in range(1, 17)]),
    32: ("p5.48xlarge", [(c, "efa") for c in range(32)]),
}


@pytest.mark.parametrize("cards", sorted(LAYOUT_FAMILIES))
def test_layout_family(cards):
    instance, expected = LAYOUT_FAMILIES[cards]
    assert CATALOG[instance].network_cards == cards
    _, lt, _ = of_type(instance)
    got = sorted((i["NetworkCardIndex"], i.get("InterfaceType")) for i in lt["NetworkInterfaces"])
    assert got == expected
    assert {i["DeviceIndex"] for i in lt["NetworkInterfaces"]} == {0}


def test_p6_b300_primary_is_ena_only_on_card_0_with_room_for_the_task_eni():
    _, lt, _ = of_type("p6-b300.48xlarge")
    (primary,) = interfaces_on(lt, 0)
    assert "InterfaceType" not in primary  # EC2's default: ENA, no EFA device
    groups = [g["Fn::ImportValue"] for g in primary["Groups"]]
    assert any("NodeSecurityGroup" in g for g in groups)
    assert CATALOG["p6-b300.48xlarge"].card_interfaces[0] >= 2  # primary + task ENI


def test_the_fleet_limit_fits_cloudformations_stack_limits():
    # Every stack of the all-types synth, scaled from its fleet count to MAX_FLEETS (fixed
    # resources counted as if per fleet, so the estimate errs high): CloudFormation's 500
    # resources and 200 outputs per stack.
    result = synth("all-types")
    for name, template in result.templates.items():
        for section, limit in (("Resources", 500), ("Outputs", 200)):
            count = len(template.get(section, {}))
            assert count * limits.MAX_FLEETS / len(EFA_TYPES) <= limit, (name, section, count)
    assert len(EFA_TYPES) <= limits.MAX_FLEETS


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_card_0_keeps_a_free_slot_for_the_batch_task_eni(instance):
    _, lt, _ = of_type(instance)
    used = len(interfaces_on(lt, 0))
    assert used + 1 <= CATALOG[instance].card_interfaces[0]


def test_card_0_is_tight_where_the_catalog_says_so():
    # Pinned from DescribeInstanceTypes (aws/amazon-vpc-cni-k8s): only two interfaces on card 0.
    for instance in ("p5.48xlarge", "p5e.48xlarge", "trn2.48xlarge"):
        assert CATALOG[instance].card_interfaces[0] == 2
        _, lt, _ = of_type(instance)
        assert len(interfaces_on(lt, 0)) == 1


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_efa_interfaces_carry_the_efa_group_and_primary_also_the_node_group(instance):
    _, lt, _ = of_type(instance)
    for interface in lt["NetworkInterfaces"]:
        groups = [g["Fn::ImportValue"] for g in interface["Groups"]]
        assert any("EfaSecurityGroup" in g for g in groups)
        primary = interface["NetworkCardIndex"] == 0
        assert any("NodeSecurityGroup" in g for g in groups) is primary
    assert "SecurityGroupIds" not in lt and "SecurityGroups" not in lt


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_compute_environment_is_on_demand_scale_to_zero_exact_type(instance):
    _, _, ce = of_type(instance)
    resources_ = ce["Properties"]["ComputeResources"]
    assert ce["Properties"]["Type"] == "MANAGED"
    assert resources_["Type"] == "EC2"  # on-demand; not SPOT, FARGATE or FARGATE_SPOT
    assert "BidPercentage" not in resources_ and "SpotIamFleetRole" not in resources_
    assert resources_["MinvCpus"] == 0
    assert resources_["MaxvCpus"] == 4 * CATALOG[instance].vcpus  # default max nodes: 4
    assert resources_["InstanceTypes"] == [instance]
    assert "SecurityGroupIds" not in resources_  # exclusive with launch-template interfaces
    (subnet,) = resources_["Subnets"]
    assert "TrainingSubnet1" in subnet["Fn::ImportValue"]


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_compute_environment_updates_in_place(instance):
    _, _, ce = of_type(instance)
    props = ce["Properties"]
    assert props["ReplaceComputeEnvironment"] is False
    assert props["UpdatePolicy"]["TerminateJobsOnUpdate"] is False
    assert 1 <= props["UpdatePolicy"]["JobExecutionTimeoutMinutes"] <= 360
    assert props["ComputeResources"]["AllocationStrategy"] == "BEST_FIT_PROGRESSIVE"
    # Batch cannot lower desired vCPUs on an existing environment; the template must not set it.
    assert "DesiredvCpus" not in props["ComputeResources"]
    # In-place updates need the Batch service-linked role, which an environment without one uses.
    assert "ServiceRole" not in props
    assert "ComputeEnvironmentName" not in props  # a fixed name would block any replacement


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_cluster_placement_group_is_associated(instance):
    template, _, ce = of_type(instance)
    prefix = f"{construct_id(fleet_name(instance))}PlacementGroup"
    (pg_id,) = [k for k in resources(template, "AWS::EC2::PlacementGroup") if k.startswith(prefix)]
    assert template["Resources"][pg_id]["Properties"]["Strategy"] == "cluster"
    assert ce["Properties"]["ComputeResources"]["PlacementGroup"] == {"Fn::GetAtt": [pg_id, "GroupName"]}


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_ami_policy_matches_the_accelerator(instance):
    template, _, ce = of_type(instance)
    resources_ = ce["Properties"]["ComputeResources"]
    (config,) = resources_["Ec2Configuration"]
    if CATALOG[instance].accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        # Batch's GPU image, moved to AWS's newest on every infrastructure update.
        assert config == {"ImageType": "ECS_AL2023_NVIDIA"}
        assert resources_["UpdateToLatestImageVersion"] is True
    else:
        assert config["ImageType"] == "ECS_AL2023"
        parameter = template["Parameters"][config["ImageIdOverride"]["Ref"]]
        assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
        assert parameter["Default"] == "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id"
        assert resources_["UpdateToLatestImageVersion"] is False


def test_neuron_ami_can_be_pinned_per_fleet():
    template, _, ce = fleet("three-fleets", "Trn")
    (config,) = ce["Properties"]["ComputeResources"]["Ec2Configuration"]
    assert config == {"ImageType": "ECS_AL2023", "ImageIdOverride": "ami-0123456789abcdef0"}
    assert "Parameters" not in template or not any("neuron" in str(p) for p in template["Parameters"].values())


def render(value):
    """What CloudFormation would make of a user-data value, with references as <Ref> placeholders."""
    if isinstance(value, str):
        return value
    ((function, argument),) = value.items()
    if function == "Fn::Join":
        return argument[0].join(render(part) for part in argument[1])
    if function == "Fn::Base64":
        return base64.b64encode(render(argument).encode()).decode()
    if function == "Ref":
        return f"<{argument}>"
    raise AssertionError(f"unexpected {function} in user data")


def user_data(lt):
    """The MIME document CloudFormation would hand to EC2."""
    return email.message_from_string(render(lt["UserData"]["Fn::Base64"]))


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_user_data_blocks_instance_metadata_for_job_containers(instance):
    _, lt, _ = of_type(instance)
    message = user_data(lt)
    # MIME multi-part, the format Batch merges with its own user data.
    assert message.is_multipart() and message.get_content_type() == "multipart/mixed"
    scripts = [part.get_payload(decode=True).decode() for part in message.walk() if not part.is_multipart()]
    (script,) = scripts
    assert "ECS_AWSVPC_BLOCK_IMDS=true" in script and "/etc/ecs/ecs.config" in script
    # Nothing is fetched at boot but one package, the CloudWatch agent, from the AMI release's own
    # locked repository (no --releasever=latest). The packed node files are read in tests/test_host_check.py.
    readable = script.replace(bundle_command(script), "")
    assert "H4sI" not in readable
    installs = [line for line in readable.splitlines() if "dnf" in line]
    assert len(installs) == 1 and "dnf install -y amazon-cloudwatch-agent &&" in installs[0]
    assert "releasever" not in readable
    for word in ("curl", "wget", "yum", "pip", "efa_installer"):
        assert word not in readable


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_user_data_gives_stopped_containers_ten_minutes_for_their_last_checkpoint_upload(instance):
    _, lt, _ = of_type(instance)
    lines = [
        line.strip()
        for part in user_data(lt).walk()
        if not part.is_multipart()
        for line in part.get_payload(decode=True).decode().splitlines()
    ]
    # The ECS agent's default is 30s, then SIGKILL (ECS agent configuration): too short to upload.
    assert [line for line in lines if "ECS_CONTAINER_STOP_TIMEOUT" in line] == [
        "echo ECS_CONTAINER_STOP_TIMEOUT=10m >> /etc/ecs/ecs.config"
    ]


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_imdsv2_and_encrypted_gp3_root_with_throughput(instance):
    _, lt, _ = of_type(instance)
    assert lt["MetadataOptions"]["HttpTokens"] == "required"
    # 1 on GPU nodes; AWS's Neuron Batch template's 5 on Neuron nodes.
    neuron = CATALOG[instance].accelerator_kind is AcceleratorKind.NEURON
    assert lt["MetadataOptions"]["HttpPutResponseHopLimit"] == (5 if neuron else 1)
    (root,) = lt["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda"
    assert root["Ebs"] == {
        "VolumeSize": 300,
        "VolumeType": "gp3",
        "Throughput": 500,
        "Iops": 6000,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }


def test_launch_template_version_follows_the_template():
    _, _, ce = fleet("default", "Gpu")
    version = ce["Properties"]["ComputeResources"]["LaunchTemplate"]["Version"]
    assert version["Fn::GetAtt"][1] == "LatestVersionNumber"


def test_changing_the_instance_type_keeps_logical_ids_and_exports():
    before = synth("default").templates[STACK]
    after = synth_with({"gpuInstanceType": "p5.48xlarge", "trainiumInstanceType": "trn2.48xlarge"}).templates[STACK]
    assert sorted(before["Resources"]) == sorted(after["Resources"])
    assert {o["Export"]["Name"] for o in before["Outputs"].values()} == {
        o["Export"]["Name"] for o in after["Outputs"].values()
    }
    ce_id = next(iter(k for k in resources(after, "AWS::Batch::ComputeEnvironment") if k.startswith("Gpu")))
    assert after["Resources"][ce_id]["Properties"]["ComputeResources"]["InstanceTypes"] == ["p5.48xlarge"]


def test_instance_role_is_the_ecs_instance_policy_and_metrics_in_our_namespace_only():
    template = synth("default").templates[STACK]
    roles = resources(template, "AWS::IAM::Role")
    assert len(roles) == 2
    for role in roles.values():
        (policy,) = role["Properties"]["ManagedPolicyArns"]
        assert "AmazonEC2ContainerServiceforEC2Role" in str(policy)
        assert "Policies" not in role["Properties"]
        (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    # Besides it, per role: metrics in this app's namespace only, and the boot-time host check's right
    # to write its result line to its fleet's log group.
    policies = resources(template, "AWS::IAM::Policy").values()
    assert sorted(ref["Ref"] for p in policies for ref in p["Properties"]["Roles"]) == sorted(roles)
    for policy in policies:
        metrics_statement, logs_statement = sorted(
            policy["Properties"]["PolicyDocument"]["Statement"], key=lambda s: "logs:" in str(s["Action"])
        )
        assert metrics_statement["Action"] == "cloudwatch:PutMetricData" and metrics_statement["Effect"] == "Allow"
        assert metrics_statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": NAMESPACE}}
        assert logs_statement["Action"] == ["logs:CreateLogStream", "logs:PutLogEvents"]
        assert "BootCheckLogs" in logs_statement["Resource"]["Fn::GetAtt"][0]


def test_odcr_is_targeted_without_placement_group():
    template = synth("reservations").templates[STACK]
    _, lt, _ = fleet("reservations", "Gpu")
    target = lt["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert "InstanceMarketOptions" not in lt
    assert not resources(template, "AWS::EC2::PlacementGroup")
    for ce in resources(template, "AWS::Batch::ComputeEnvironment").values():
        assert "PlacementGroup" not in ce["Properties"]["ComputeResources"]


def test_capacity_block_uses_its_market_type():
    _, lt, _ = fleet("reservations", "Trainium")
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
    _, lt, ce = fleet("reservations", "Gpu")
    assert ce["Properties"]["ComputeResources"]["MaxvCpus"] == 10 * CATALOG["g6.12xlarge"].vcpus
    ebs = lt["BlockDeviceMappings"][0]["Ebs"]
    assert (ebs["VolumeSize"], ebs["Throughput"], ebs["Iops"]) == (500, 1000, 8000)


def test_three_fleets_three_compute_paths_each_sized_from_its_type():
    template = synth("three-fleets").templates[STACK]
    # Plus llm's three fallback placements, two with a placement group (tests below).
    assert len(resources(template, "AWS::Batch::ComputeEnvironment")) == 3 + 3
    assert len(resources(template, "AWS::EC2::PlacementGroup")) == 3 + 2
    for fleet_id, instance, max_nodes in (
        ("Rl", "g6e.48xlarge", 64),
        ("Llm", "p5e.48xlarge", 4),
        ("Trn", "trn2.48xlarge", 4),
    ):
        _, lt, ce = fleet("three-fleets", fleet_id)
        assert ce["Properties"]["ComputeResources"]["InstanceTypes"] == [instance]
        assert ce["Properties"]["ComputeResources"]["MaxvCpus"] == max_nodes * CATALOG[instance].vcpus
        assert len(lt["NetworkInterfaces"]) == CATALOG[instance].node_interfaces


def test_fleets_in_other_azs_use_the_subnet_of_their_own_az():
    """A named AZ's subnet lives in the compute stack, named and addressed after its AZ (a -> 10.1,
    b -> 10.2, ...), in a VPC CIDR block of its own, on the network's first training route table."""
    template = synth("three-fleets").templates[STACK]
    subnets = resources(template, "AWS::EC2::Subnet")
    assert {k: (r["Properties"]["AvailabilityZone"], r["Properties"]["CidrBlock"]) for k, r in subnets.items()} == {
        next(k for k in subnets if k.startswith(f"Subnets{az_id}")): (az, cidr)
        for az_id, az, cidr in (
            ("UsWest2a", "us-west-2a", "10.1.0.0/18"),
            ("UsWest2b", "us-west-2b", "10.2.0.0/18"),
            ("UsWest2c", "us-west-2c", "10.3.0.0/18"),
        )
    }
    blocks = resources(template, "AWS::EC2::VPCCidrBlock")
    assert sorted(b["Properties"]["CidrBlock"] for b in blocks.values()) == [
        "10.1.0.0/18",
        "10.2.0.0/18",
        "10.3.0.0/18",
    ]
    for subnet in subnets.values():
        (block,) = subnet["DependsOn"]
        assert blocks[block]["Properties"]["CidrBlock"] == subnet["Properties"]["CidrBlock"]
    associations = resources(template, "AWS::EC2::SubnetRouteTableAssociation").values()
    assert sorted(a["Properties"]["SubnetId"]["Ref"] for a in associations) == sorted(subnets)
    assert {str(a["Properties"]["RouteTableId"]) for a in associations} == {
        str({"Fn::ImportValue": "TrainingNetwork:ExportsOutputRefNetworkVpcTrainingSubnet1RouteTable28B83122D064A3BA"})
    }
    # rl has no AZ of its own: availabilityZone (us-west-2a) is its AZ.
    for fleet_id, az in (("Rl", "us-west-2a"), ("Llm", "us-west-2b"), ("Trn", "us-west-2c")):
        _, _, ce = fleet("three-fleets", fleet_id)
        (subnet,) = ce["Properties"]["ComputeResources"]["Subnets"]
        assert subnets[subnet["Ref"]]["Properties"]["AvailabilityZone"] == az


def test_fleets_without_an_az_use_the_networks_first_training_subnet():
    template = synth("default").templates[STACK]
    assert not resources(template, "AWS::EC2::Subnet")
    for _, r in resources(template, "AWS::Batch::ComputeEnvironment").items():
        assert r["Properties"]["ComputeResources"]["Subnets"] == [
            {"Fn::ImportValue": "TrainingNetwork:ExportsOutputRefNetworkVpcTrainingSubnet1Subnet78795A940E87DF81"}
        ]


def test_gpu_only_deployment_has_no_trainium_resource_or_neuron_ami():
    template = synth("gpu-only").templates[STACK]
    assert len(resources(template, "AWS::Batch::ComputeEnvironment")) == 1
    assert not any(k.startswith("Trainium") for k in template["Resources"])
    assert "neuron" not in str(template).lower()


# ----------------------------------------------------------------------------------------------- fallback
def test_each_fallback_placement_has_its_own_compute_path_in_its_az():
    """llm (p5e.48xlarge in us-west-2b) falls back to us-west-2c, to p5.48xlarge in its own AZ, and to a
    Capacity Block in us-west-2a (tests/harness.py, LLM_FALLBACK)."""
    template = synth("three-fleets").templates[STACK]
    subnets = resources(template, "AWS::EC2::Subnet")
    expected = [
        ("Llm", "p5e.48xlarge", "us-west-2b", True),
        ("LlmFallback1", "p5e.48xlarge", "us-west-2c", True),
        ("LlmFallback2", "p5.48xlarge", "us-west-2b", True),
        ("LlmFallback3", "p5e.48xlarge", "us-west-2a", False),
    ]
    groups = set()
    for prefix, instance, az, has_group in expected:
        _, lt, ce = fleet("three-fleets", prefix)
        compute = ce["Properties"]["ComputeResources"]
        assert compute["InstanceTypes"] == [instance]
        assert compute["MaxvCpus"] == 4 * CATALOG[instance].vcpus and compute["MinvCpus"] == 0
        (subnet,) = compute["Subnets"]
        assert subnets[subnet["Ref"]]["Properties"]["AvailabilityZone"] == az
        # Its own EFA layout: one efa interface per EFA card of its type.
        efa = [i for i in lt["NetworkInterfaces"] if i.get("InterfaceType") == "efa"]
        assert len(efa) == CATALOG[instance].efa_interfaces
        template_ref = compute["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
        assert template_ref.startswith(f"{prefix}LaunchTemplate")
        assert ("PlacementGroup" in compute) is has_group
        if has_group:
            groups.add(compute["PlacementGroup"]["Fn::GetAtt"][0])
            assert compute["PlacementGroup"]["Fn::GetAtt"][0].startswith(f"{prefix}PlacementGroup")
    # One cluster placement group per placement: a job's nodes never share one across placements.
    assert len(groups) == 3


def test_a_capacity_block_placement_targets_its_block_with_its_market_type():
    _, lt, _ = fleet("three-fleets", "LlmFallback3")
    target = lt["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationId": "cr-0a1b2c3d4e5f60718"}
    # EC2 user guide, capacity-blocks-launch: market type capacity-block.
    assert lt["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
