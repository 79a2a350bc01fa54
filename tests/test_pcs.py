"""The managed Slurm option (`-c slurm=pcs`): the PCS stack's cluster, node groups, queues, role and
file system, each hidden PCS rule pinned on the template (tests/harness.py, variant "pcs"), the size
chosen from the node count, and the refusals."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from config.catalog import CATALOG
from config.context import ConfigError, read_settings
from config.context_keys import KEYS
from config.pcs import cluster_size
from config.settings import RESERVED_CONSTRUCT_IDS
from tests.harness import VARIANTS, pulls_only_this_deployments_images, resources, synth
from training_constructs.cluster.cluster_config import queue_name

STACK = "TrainingPcs"
VARIANT = VARIANTS["pcs"]
TYPES = VARIANT["pcsInstanceType"].split(",")
MAX_NODES = int(VARIANT["pcsMaxNodes"])


@pytest.fixture(scope="module")
def template():
    return synth("pcs").templates[STACK]


def one(template, resource_type):
    ((logical_id, resource),) = resources(template, resource_type).items()
    return logical_id, resource


def cluster_group(template):
    """The logical id of the security group on the cluster's own interface."""
    _, cluster = one(template, "AWS::PCS::Cluster")
    (group,) = cluster["Properties"]["Networking"]["SecurityGroupIds"]
    return group["Fn::GetAtt"][0]


def compute_groups(template):
    groups = resources(template, "AWS::PCS::ComputeNodeGroup")
    return {g["Properties"]["Name"]: g for g in groups.values() if g["Properties"]["Name"] != "login"}


def launch_template_of(template, group):
    return template["Resources"][group["Properties"]["CustomLaunchTemplate"]["TemplateId"]["Ref"]]


@pytest.mark.parametrize(
    ("nodes", "size"), [(1, "SMALL"), (32, "SMALL"), (33, "MEDIUM"), (512, "MEDIUM"), (600, "LARGE"), (2048, "LARGE")]
)
def test_size_is_the_smallest_that_holds_the_nodes(nodes, size):
    assert cluster_size(nodes) == size


def test_no_size_holds_more_than_large():
    with pytest.raises(ValueError, match="2049 nodes"):
        cluster_size(2049)


def test_cluster_runs_slurm_25_11_with_accounting_and_a_purge_time(template):
    _, cluster = one(template, "AWS::PCS::Cluster")
    props = cluster["Properties"]
    assert props["Scheduler"] == {"Type": "SLURM", "Version": "25.11"}
    # Two groups of 16 and the login node: 33 nodes, one more than SMALL holds.
    assert len(TYPES) * MAX_NODES + 1 == 33 and props["Size"] == "MEDIUM"
    accounting = props["SlurmConfiguration"]["Accounting"]
    assert accounting == {"Mode": "STANDARD", "DefaultPurgeTimeInDays": KEYS["pcsAccountingPurgeDays"].default}
    assert cluster["DeletionPolicy"] == "Retain" and cluster["UpdateReplacePolicy"] == "Retain"


def test_subnet_and_security_group_rules_exist_before_the_cluster(template):
    _, cluster = one(template, "AWS::PCS::Cluster")
    (subnet,) = cluster["Properties"]["Networking"]["SubnetIds"]
    assert template["Resources"][subnet["Ref"]]["Type"] == "AWS::EC2::Subnet"  # a Ref: created first
    group = cluster_group(template)
    rules = {
        logical_id
        for kind in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
        for logical_id, rule in resources(template, kind).items()
        if rule["Properties"]["GroupId"] == {"Fn::GetAtt": [group, "GroupId"]}
    }
    assert rules and rules <= set(cluster["DependsOn"])


def test_cluster_group_allows_all_traffic_to_and_from_itself_only(template):
    group = cluster_group(template)
    itself = {"Fn::GetAtt": [group, "GroupId"]}
    ingress = [r["Properties"] for r in resources(template, "AWS::EC2::SecurityGroupIngress").values()]
    egress = [r["Properties"] for r in resources(template, "AWS::EC2::SecurityGroupEgress").values()]
    assert {"IpProtocol": "-1", "GroupId": itself, "SourceSecurityGroupId": itself} in [
        {k: p[k] for k in ("IpProtocol", "GroupId", "SourceSecurityGroupId") if k in p} for p in ingress
    ]
    assert any(p["IpProtocol"] == "-1" and p["DestinationSecurityGroupId"] == itself for p in egress)
    # Nothing from or to anywhere else through this group.
    assert all(p.get("SourceSecurityGroupId") == itself for p in ingress if p["GroupId"] == itself)
    own = template["Resources"][group]["Properties"]
    assert "SecurityGroupIngress" not in own and "SecurityGroupEgress" not in own


def test_node_role_sits_under_the_pcs_path_with_the_managed_node_policy(template):
    profile_id, profile = one(template, "AWS::IAM::InstanceProfile")
    (role,) = profile["Properties"]["Roles"]
    role = template["Resources"][role["Ref"]]["Properties"]
    assert role["Path"] == "/aws-pcs/" or role.get("RoleName", "").startswith("AWSPCS")
    policies = [json.dumps(p) for p in role["ManagedPolicyArns"]]
    assert any(p.endswith(':iam::aws:policy/AWSPCSComputeNodePolicy"]]}') for p in policies)
    for group in resources(template, "AWS::PCS::ComputeNodeGroup").values():
        assert group["Properties"]["IamInstanceProfileArn"] == {"Fn::GetAtt": [profile_id, "Arn"]}


def test_nodes_pull_images_only_from_this_deployments_repositories(template):
    (role_id,) = resources(template, "AWS::IAM::Role")
    (policy,) = [p for p in resources(template, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [
        {"Ref": role_id}]]  # fmt: skip
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert pulls_only_this_deployments_images(statements)


def test_one_compute_node_group_per_slurm_fleet_with_every_efa_card(template):
    groups = compute_groups(template)
    assert sorted(groups) == sorted(queue_name(CATALOG[t]) for t in TYPES)
    group = cluster_group(template)
    for instance_type in TYPES:
        props = groups[queue_name(CATALOG[instance_type])]["Properties"]
        assert props["InstanceConfigs"] == [{"InstanceType": instance_type}]
        assert props["ScalingConfiguration"] == {"MinInstanceCount": 0, "MaxInstanceCount": MAX_NODES}
        assert props["AmiId"] == VARIANT["pcsAmiId"] and props["PurchaseOption"] == "ONDEMAND"
        data = launch_template_of(template, groups[props["Name"]])["Properties"]["LaunchTemplateData"]
        interfaces = data["NetworkInterfaces"]
        efa = [i for i in interfaces if i.get("InterfaceType") == "efa"]
        assert len(efa) == CATALOG[instance_type].max_efa_interfaces
        assert sorted(i["NetworkCardIndex"] for i in efa) == list(CATALOG[instance_type].efa_cards)
        # The cluster's group on every interface (Security groups are per interface in a template
        # with interfaces: PCS user guide, EFA launch template); the nodes' outbound group on the primary.
        assert all({"Fn::GetAtt": [group, "GroupId"]} in i["Groups"] for i in interfaces)
        (primary,) = [i for i in interfaces if i["NetworkCardIndex"] == 0 and i["DeviceIndex"] == 0]
        assert len(primary["Groups"]) == 2
        assert "SecurityGroupIds" not in data


def test_every_compute_node_group_has_a_cluster_placement_group_and_one_subnet_in_one_az(template):
    subnet_ids = set()
    for group in compute_groups(template).values():
        data = launch_template_of(template, group)["Properties"]["LaunchTemplateData"]
        placement = template["Resources"][data["Placement"]["GroupName"]["Fn::GetAtt"][0]]
        assert placement["Type"] == "AWS::EC2::PlacementGroup" and placement["Properties"]["Strategy"] == "cluster"
        (subnet,) = group["Properties"]["SubnetIds"]
        subnet_ids.add(subnet["Ref"])
    (subnet_id,) = subnet_ids
    assert template["Resources"][subnet_id]["Properties"]["AvailabilityZone"] == VARIANT["availabilityZone"]
    placements = resources(template, "AWS::EC2::PlacementGroup")
    assert len(placements) == len(TYPES)


def test_a_queue_per_node_group_named_as_parallelclusters(template):
    groups = {
        logical_id: g["Properties"]["Name"]
        for logical_id, g in resources(template, "AWS::PCS::ComputeNodeGroup").items()
    }
    queues = {q["Properties"]["Name"]: q["Properties"] for q in resources(template, "AWS::PCS::Queue").values()}
    assert sorted(queues) == sorted(queue_name(CATALOG[t]) for t in TYPES)
    for name, queue in queues.items():
        (config,) = queue["ComputeNodeGroupConfigurations"]
        assert groups[config["ComputeNodeGroupId"]["Fn::GetAtt"][0]] == name
    assert template["Outputs"]["QueueName"]["Value"] == ",".join(queue_name(CATALOG[t]) for t in TYPES)


def test_login_node_group_is_one_small_node_in_the_cluster_group(template):
    (login,) = [
        g for g in resources(template, "AWS::PCS::ComputeNodeGroup").values() if g["Properties"]["Name"] == "login"
    ]
    props = login["Properties"]
    assert props["ScalingConfiguration"] == {"MinInstanceCount": 1, "MaxInstanceCount": 1}
    assert props["InstanceConfigs"] == [{"InstanceType": KEYS["pcsLoginInstanceType"].default}]
    data = launch_template_of(template, login)["Properties"]["LaunchTemplateData"]
    assert {"Fn::GetAtt": [cluster_group(template), "GroupId"]} in data["SecurityGroupIds"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert all(b["Ebs"]["Encrypted"] for b in data["BlockDeviceMappings"])


def test_shared_lustre_is_retained_linked_to_both_buckets_and_mounted_on_every_node(template):
    fs_id, fs = one(template, "AWS::FSx::FileSystem")
    assert fs["DeletionPolicy"] == "Retain"
    lustre = fs["Properties"]["LustreConfiguration"]
    assert (lustre["DeploymentType"], lustre["DataCompressionType"]) == ("PERSISTENT_2", "LZ4")
    assert fs["Properties"]["SecurityGroupIds"] == [{"Fn::GetAtt": [cluster_group(template), "GroupId"]}]
    links = {
        a["Properties"]["FileSystemPath"]: a
        for a in resources(template, "AWS::FSx::DataRepositoryAssociation").values()
    }
    assert set(links) == {"/datasets", "/checkpoints"}
    assert all(
        a["DeletionPolicy"] == "Retain" and a["Properties"]["FileSystemId"] == {"Ref": fs_id} for a in links.values()
    )
    assert "AutoExportPolicy" not in links["/datasets"]["Properties"]["S3"]  # datasets are never written back
    assert links["/checkpoints"]["Properties"]["S3"]["AutoExportPolicy"] == {"Events": ["NEW", "CHANGED"]}
    assert "DatasetBucket" in json.dumps(links["/datasets"]) and "CheckpointBucket" in json.dumps(links["/checkpoints"])
    for lt in resources(template, "AWS::EC2::LaunchTemplate").values():
        text = json.dumps(lt["Properties"]["LaunchTemplateData"]["UserData"])
        # PCS takes MIME multi-part user data only (PCS user guide, "Working with Amazon EC2 user data").
        assert "multipart/mixed" in text and "text/x-shellscript" in text
        assert f'{{"Ref": "{fs_id}"}}' in text and "lustre" in text and "ecs.config" not in text


def test_node_script_is_clean_shell(template, tmp_path):
    """The shell part of the nodes' user data, references filled with placeholders, through shellcheck."""
    (lt, *_) = resources(template, "AWS::EC2::LaunchTemplate").values()
    _, parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"]
    text = "".join(p if isinstance(p, str) else "placeholder" for p in parts)
    script = text.split('Content-Type: text/x-shellscript; charset="us-ascii"\n\n', 1)[1].split("\n--", 1)[0]
    assert script.startswith("#!/bin/bash\nset -euo pipefail\n") and "mount /fsx" in script
    path = tmp_path / "node.sh"
    path.write_text(script)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    result = subprocess.run(
        [str(shellcheck), "--severity=style", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout


def test_stack_is_absent_by_default_and_protected_when_present():
    assert STACK not in synth("default").templates
    (artifact,) = [s for s in synth("pcs").assembly.stacks if s.stack_name == STACK]
    assert artifact.termination_protection is True
    assert "TrainingData" in {d.id for d in artifact.dependencies}


def test_every_stack_child_is_reserved():
    """config.context refuses fleet names that collide with a stack's own children (tests/test_replay.py
    checks the other stacks); the PCS stack's are listed too."""
    reserved = {name.lower() for name in RESERVED_CONSTRUCT_IDS}
    (stack,) = [s for s in synth("pcs").app.node.children if s.node.id == STACK]
    names = {c.node.id for c in stack.node.children if c.node.id.isalnum()}
    assert names and {n for n in names if n.lower() not in reserved} == set()


PCS = {"slurm": "pcs", "pcsAmiId": "ami-0123456789abcdef0"}


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({**PCS, "parallelCluster": "true"}, ["parallelCluster=true and slurm=pcs", "pick one"]),
        ({"slurm": "pcs"}, ["pcsAmiId", "required with slurm=pcs"]),
        ({**PCS, "pcsAmiId": "al2023-pcs-latest"}, ["pcsAmiId", "malformed", "ami-"]),
        ({**PCS, "pcsMaxNodes": "2048"}, ["pcsMaxNodes=2048", "2049 nodes", "LARGE"]),
        ({**PCS, "pcsInstanceType": "g6.12xlarge,p5.48xlarge", "pcsMaxNodes": "1024"}, ["2049 nodes"]),
        ({**PCS, "pcsInstanceType": "g6.4xlarge"}, ["pcsInstanceType", "'g6.4xlarge': has no EFA"]),
        ({**PCS, "pcsAccountingPurgeDays": "0"}, ["pcsAccountingPurgeDays", "below 1"]),
        ({**PCS, "pcsLoginInstanceType": "m7x.huge"}, ["pcsLoginInstanceType", "not an EC2 instance type"]),
        ({"slurm": "slurm"}, ["slurm='slurm'", "none, parallelcluster or pcs"]),
    ],
)
def test_bad_input_is_one_line_naming_the_key(context, expected):
    with pytest.raises(ConfigError) as caught:
        read_settings(context)
    for fragment in expected:
        assert fragment in str(caught.value), str(caught.value)


def test_parallelcluster_is_reached_by_either_key_and_pcs_by_one():
    assert read_settings({"slurm": "parallelcluster"}).parallel_cluster.enabled
    assert read_settings({"parallelCluster": "true", "slurm": "parallelcluster"}).parallel_cluster.enabled
    settings = read_settings(PCS)
    assert settings.pcs is not None and not settings.parallel_cluster.enabled
    assert read_settings({}).pcs is None
