"""The optional ParallelCluster stack: absent by default; with the flag, a cluster configuration that
aws-parallelcluster 3.16.1's own schema and validators accept, behind the official provider."""

import json
import subprocess

import pytest

from config.context import read_settings
from tests.harness import ROOT, VARIANTS, resources, synth, synth_with
from training_constructs.cluster_config import NO_SSH, ClusterInputs, cluster_configuration

STACK = "TrainingParallelCluster"
LITERAL_INPUTS = ClusterInputs(
    partition="aws",
    subnet_id="subnet-0123456789abcdef0",
    dataset_bucket="trainingdata-datasets-example",
    checkpoint_bucket="trainingdata-checkpoints-example",
    pyxis_script_url="s3://cdk-hnb659fds-assets-123456789012-us-east-1/enable_pyxis.sh",
    script_bucket="cdk-hnb659fds-assets-123456789012-us-east-1",
)


def configuration(**context: str) -> dict:
    settings = read_settings({"parallelCluster": "true", **context})
    return cluster_configuration(settings.parallel_cluster, LITERAL_INPUTS, log_retention_days=30, root_volume_gib=300)


def test_seed_plan_asks_for_what_the_seed_needs():
    c = configuration(pclusterMaxNodes="80")
    assert c["Image"]["Os"] == "alinux2023"
    (queue,) = c["Scheduling"]["SlurmQueues"]
    (resource,) = queue["ComputeResources"]
    assert resource["Instances"] == [{"InstanceType": "p5e.48xlarge"}]
    assert (resource["MinCount"], resource["MaxCount"]) == (0, 80)  # idle costs nothing
    assert resource["Efa"] == {"Enabled": True} and resource["HealthChecks"] == {"Gpu": {"Enabled": True}}
    assert queue["Networking"]["PlacementGroup"] == {"Enabled": True}
    assert queue["Networking"]["SubnetIds"] == [LITERAL_INPUTS.subnet_id]
    assert queue["CapacityType"] == "ONDEMAND"
    assert {(a["BucketName"], a["EnableWriteAccess"]) for a in queue["Iam"]["S3Access"]} == {
        (LITERAL_INPUTS.dataset_bucket, False),
        (LITERAL_INPUTS.checkpoint_bucket, True),
        (LITERAL_INPUTS.script_bucket, False),
    }
    assert queue["CustomActions"]["OnNodeStart"] == {"Script": LITERAL_INPUTS.pyxis_script_url, "Args": ["compute"]}
    head = c["HeadNode"]
    assert head["Networking"]["SubnetId"] == LITERAL_INPUTS.subnet_id
    assert head["CustomActions"]["OnNodeConfigured"]["Args"] == ["head"]
    assert any("AmazonSSMManagedInstanceCore" in p["Policy"] for p in head["Iam"]["AdditionalIamPolicies"])
    assert c["Monitoring"]["DetailedMonitoring"] is True
    assert c["Monitoring"]["Logs"]["CloudWatch"]["RetentionInDays"] == 30


def test_fsx_links_both_buckets_and_is_retained():
    fsx = configuration()["SharedStorage"][0]["FsxLustreSettings"]
    assert fsx["DeploymentType"] == "PERSISTENT_2" and fsx["DeletionPolicy"] == "Retain"
    assert (fsx["StorageCapacity"], fsx["PerUnitStorageThroughput"]) == (1200, 250)
    associations = {a["Name"]: a for a in fsx["DataRepositoryAssociations"]}
    assert associations["datasets"]["DataRepositoryPath"] == f"s3://{LITERAL_INPUTS.dataset_bucket}"
    assert "AutoExportPolicy" not in associations["datasets"]  # datasets are read, never written back
    assert associations["checkpoints"]["DataRepositoryPath"] == f"s3://{LITERAL_INPUTS.checkpoint_bucket}"
    assert "DELETED" not in associations["checkpoints"]["AutoExportPolicy"]  # deleting on /fsx keeps S3


def test_ssh_is_closed_unless_a_source_is_given():
    assert configuration()["HeadNode"]["Ssh"] == {"AllowedIps": NO_SSH}
    opened = configuration(pclusterSshSource="203.0.113.0/24", pclusterKeyName="ops")["HeadNode"]["Ssh"]
    assert opened == {"AllowedIps": "203.0.113.0/24", "KeyName": "ops"}


def test_reservation_targets_the_first_type_and_drops_the_placement_group():
    c = configuration(
        pclusterInstanceType="p5.48xlarge,trn1.32xlarge",
        pclusterCapacityReservationId="cr-0123456789abcdef0",
        pclusterCapacityReservationType="capacity-block",
        pclusterMaxNodes="4",
    )
    reserved, other = c["Scheduling"]["SlurmQueues"]
    resource = reserved["ComputeResources"][0]
    assert resource["CapacityReservationTarget"] == {"CapacityReservationId": "cr-0123456789abcdef0"}
    assert reserved["CapacityType"] == "CAPACITY_BLOCK" and resource["MinCount"] == resource["MaxCount"] == 4
    assert reserved["Networking"]["PlacementGroup"] == {"Enabled": False}
    assert other["Networking"]["PlacementGroup"] == {"Enabled": True}
    assert "CapacityReservationTarget" not in other["ComputeResources"][0]
    assert "HealthChecks" not in other["ComputeResources"][0]  # GPU health checks only on GPUs


def test_stack_is_absent_by_default():
    assert STACK not in synth("default").templates
    assert STACK not in synth("default").manifest["artifacts"]


def cluster_resource(template):
    ((logical_id, resource),) = resources(template, "Custom::PclusterCluster").items()
    return logical_id, resource


def test_flag_adds_the_official_provider_and_a_retained_cluster():
    template = synth("parallelcluster").templates[STACK]
    (provider,) = resources(template, "AWS::CloudFormation::Stack").values()
    url = provider["Properties"]["TemplateURL"]["Fn::Sub"]
    assert url == (
        "https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
        "/parallelcluster/3.16.1/templates/custom_resource/cluster.yaml"
    )
    _, cluster = cluster_resource(template)
    props = cluster["Properties"]
    assert props["ServiceToken"]["Fn::GetAtt"][1] == "Outputs.ServiceToken"
    assert props["ClusterName"] == "training-slurm" and props["ClusterName"] != STACK
    assert props["DeletionPolicy"] == "Retain"
    assert cluster["DeletionPolicy"] == "Retain" and cluster["UpdateReplacePolicy"] == "Retain"
    (queue,) = props["ClusterConfiguration"]["Scheduling"]["SlurmQueues"]
    assert queue["ComputeResources"][0]["MaxCount"] == int(VARIANTS["parallelcluster"]["pclusterMaxNodes"])


def test_cluster_uses_the_training_subnet_the_buckets_and_the_shipped_script():
    template = synth("parallelcluster").templates[STACK]
    _, cluster = cluster_resource(template)
    text = json.dumps(cluster["Properties"]["ClusterConfiguration"])
    assert "TrainingSubnet1" in text
    assert "TrainingData-DatasetBucketArn" in text and "TrainingData-CheckpointBucketArn" in text
    script = cluster["Properties"]["ClusterConfiguration"]["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Script"]
    # An asset of this repository in the CDK assets bucket, not a download from the internet.
    assert script["Fn::Sub"].startswith("s3://cdk-") and script["Fn::Sub"].endswith(".sh")
    assert "http" not in text


def test_deletion_policy_delete_is_explicit_too():
    template = synth_with({"parallelCluster": "true", "pclusterDeletionPolicy": "Delete"}).templates[STACK]
    _, cluster = cluster_resource(template)
    assert cluster["Properties"]["DeletionPolicy"] == "Delete"
    assert cluster["DeletionPolicy"] == "Delete"


def test_parallelcluster_stack_has_termination_protection():
    (artifact,) = [s for s in synth("parallelcluster").assembly.stacks if s.stack_name == STACK]
    assert artifact.termination_protection is True
    assert "TrainingData" in {d.id for d in artifact.dependencies}


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"pclusterMaxNodes": "0"}, ["pclusterMaxNodes", "1..1000"]),
        ({"fsxCapacityGib": "3000"}, ["fsxCapacityGib", "3000", "multiple of 2400"]),
        ({"fsxCapacityGib": "600"}, ["fsxCapacityGib", "below 1200"]),
        ({"fsxThroughput": "200"}, ["fsxThroughput", "125, 250, 500, 1000"]),
        ({"pclusterSshSource": "0.0.0.0/33"}, ["pclusterSshSource", "malformed"]),
        ({"pclusterSshSource": "10.0.0.256/8"}, ["pclusterSshSource", "malformed"]),
        ({"pclusterSshSource": "my-laptop"}, ["pclusterSshSource", "malformed"]),
        ({"pclusterInstanceType": "g6.4xlarge"}, ["pclusterInstanceType", "g6.4xlarge has no EFA"]),
        ({"pclusterInstanceType": "p5e.48xlarge,m5.large"}, ["pclusterInstanceType", "m5.large is not in"]),
        ({"pclusterDeletionPolicy": "Snapshot"}, ["pclusterDeletionPolicy", "Retain or Delete"]),
        ({"pclusterHeadNodeInstanceType": "big"}, ["pclusterHeadNodeInstanceType", "malformed"]),
        ({"pclusterCapacityReservationType": "capacity-block"}, ["needs pclusterCapacityReservationId"]),
    ],
)
def test_bad_input_is_one_line_naming_the_key(context, expected):
    from config.context import ConfigError

    with pytest.raises(ConfigError) as caught:
        read_settings(context)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message, message


@pytest.mark.parametrize(
    "path", [ROOT / "training_constructs" / "pcluster" / "enable_pyxis.sh", ROOT / "examples/slurm/allreduce.sbatch"]
)
def test_cluster_scripts_are_shellcheck_clean(path):
    shellcheck = ROOT / ".venv" / "bin" / "shellcheck"
    result = subprocess.run([str(shellcheck), str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_enable_pyxis_refuses_an_unknown_role():
    script = ROOT / "training_constructs" / "pcluster" / "enable_pyxis.sh"
    result = subprocess.run(["bash", str(script), "login"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "usage" in result.stderr
