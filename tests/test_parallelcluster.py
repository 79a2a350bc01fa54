"""The optional ParallelCluster stack: absent by default; with the flag, a cluster configuration that
aws-parallelcluster 3.16.1's own schema and validators accept, behind the official provider."""

import json
import re
import subprocess

import aws_cdk as cdk
import pytest

from config.context import read_settings
from tests.harness import ROOT, VARIANTS, pulls_only_this_deployments_images, resources, synth, synth_with
from training_constructs.cluster.cluster_config import NO_SSH, ClusterInputs, cluster_configuration

STACK = "TrainingParallelCluster"
LITERAL_INPUTS = ClusterInputs(
    partition="aws",
    subnet_id="subnet-0123456789abcdef0",
    dataset_bucket="trainingdata-datasets-example",
    checkpoint_bucket="trainingdata-checkpoints-example",
    pyxis_script_url="s3://cdk-hnb659fds-assets-123456789012-us-east-1/enable_pyxis.sh",
    script_bucket="cdk-hnb659fds-assets-123456789012-us-east-1",
    ecr_pull_policy="arn:aws:iam::123456789012:policy/parallelcluster/TrainingParallelCluster-SlurmEcrPull-1A2B3C",
    checkpoint_write_policy="arn:aws:iam::123456789012:policy/parallelcluster/TrainingParallelCluster-Write-4D5E6F",
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
        (LITERAL_INPUTS.checkpoint_bucket, False),
        (LITERAL_INPUTS.script_bucket, False),
    }
    assert {"Policy": LITERAL_INPUTS.checkpoint_write_policy} in queue["Iam"]["AdditionalIamPolicies"]
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
        f"/parallelcluster/{pinned_release()}/templates/custom_resource/cluster.yaml"
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
        ({"pclusterInstanceType": "g6.4xlarge"}, ["pclusterInstanceType", "='g6.4xlarge': has no EFA"]),
        ({"pclusterInstanceType": "p5e.48xlarge,m5.large"}, ["pclusterInstanceType", "='m5.large': not in the"]),
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


def test_enable_pyxis_refuses_an_unknown_role():
    script = ROOT / "training_constructs" / "cluster" / "pcluster" / "enable_pyxis.sh"
    result = subprocess.run(["bash", str(script), "login"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "usage" in result.stderr


def pinned_release() -> str:
    (version,) = re.findall(r"^aws-parallelcluster==(\S+)$", (ROOT / "requirements-pcluster.txt").read_text(), re.M)
    return version


def test_one_release_everywhere_read_from_one_place():
    from training_constructs.cluster.cluster_config import PCLUSTER_VERSION

    # The newest aws-parallelcluster on PyPI, and the first 3.16.x with Slurm 25.11.8, which fixes the
    # CVEs of aws-parallelcluster issue 7601 (v3.16.1 release notes: "Upgrade Slurm to version 25.11.8").
    assert PCLUSTER_VERSION == pinned_release() == "3.16.1"
    # No other release number is written anywhere in the code: a bump is one line.
    for folder in ("training_constructs", "stacks", "config"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not re.search(r"\b3\.1\d\.\d\b", path.read_text()), path


def managed_policy(template, logical_id):
    return template["Resources"][logical_id]["Properties"]


def test_provider_gets_the_extra_policy_through_its_parameter():
    template = synth("parallelcluster").templates[STACK]
    (provider,) = resources(template, "AWS::CloudFormation::Stack").values()
    parameters = provider["Properties"]["Parameters"]
    assert list(parameters) == ["AdditionalIamPolicies"]
    policy = managed_policy(template, parameters["AdditionalIamPolicies"]["Ref"])
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert set(statements) == {"LinkDataRepositories", "FsxS3ServiceLinkedRole", "ReadNodeScript", "FindNodeScript"}
    assert all(s["Effect"] == "Allow" for s in statements.values())
    link = statements["LinkDataRepositories"]
    assert sorted(link["Action"]) == ["s3:Get*", "s3:List*", "s3:PutObject"]
    text = json.dumps(link["Resource"])
    # The two data buckets and their objects, nothing else.
    assert len(link["Resource"]) == 4 and text.count("/*") == 2
    assert text.count("TrainingData-DatasetBucketArn") == 2 and text.count("TrainingData-CheckpointBucketArn") == 2
    slr = statements["FsxS3ServiceLinkedRole"]
    assert sorted(slr["Action"]) == ["iam:AttachRolePolicy", "iam:CreateServiceLinkedRole", "iam:PutRolePolicy"]
    assert json.dumps(slr["Resource"]).endswith(':role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/*"]]}')
    assert statements["ReadNodeScript"]["Action"] == "s3:GetObject"
    assert ".sh" in json.dumps(statements["ReadNodeScript"]["Resource"])
    # Nothing on every resource, no IAM beyond the FSx service-linked role.
    for statement in statements.values():
        assert statement["Resource"] != "*"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert not any(a in ("*", "s3:*", "iam:*") for a in actions)


# The policies the provider may attach to node roles (aws/aws-parallelcluster,
# cloudformation/policies/parallelcluster-policies.yaml, Sid IamPolicy, condition iam:PolicyARN).
PROVIDER_ATTACHABLE_AWS_POLICIES = {
    "CloudWatchAgentServerPolicy",
    "AmazonSSMManagedInstanceCore",
    "AWSBatchFullAccess",
    "AmazonS3ReadOnlyAccess",
    "service-role/AWSBatchServiceRole",
    "service-role/AmazonEC2ContainerServiceforEC2Role",
    "service-role/AmazonECSTaskExecutionRolePolicy",
    "service-role/AmazonEC2SpotFleetTaggingRole",
    "EC2InstanceProfileForImageBuilder",
    "service-role/AWSLambdaBasicExecutionRole",
}


def node_policies(configuration):
    nodes = [configuration["HeadNode"], *configuration["Scheduling"]["SlurmQueues"]]
    return [p["Policy"] for node in nodes for p in node["Iam"]["AdditionalIamPolicies"]]


def test_every_node_policy_is_one_the_provider_may_attach():
    template = synth("parallelcluster").templates[STACK]
    _, cluster = cluster_resource(template)
    policies = node_policies(cluster["Properties"]["ClusterConfiguration"])
    assert len(policies) >= 3
    for policy in policies:
        if "Ref" in policy:  # a policy of this stack: under /parallelcluster/ (policy/parallelcluster/*)
            props = managed_policy(template, policy["Ref"])
            assert props["Path"] == "/parallelcluster/" or props.get("ManagedPolicyName", "").startswith(
                "parallelcluster"
            )
        else:  # an AWS managed policy: on the provider's list
            name = policy["Fn::Join"][1][-1].split(":iam::aws:policy/")[1]
            assert name in PROVIDER_ATTACHABLE_AWS_POLICIES, name
    assert "AmazonEC2ContainerRegistryReadOnly" not in json.dumps(cluster)


def test_no_node_gets_write_all_access_to_a_bucket():
    # ParallelCluster renders EnableWriteAccess: true as s3:* on the bucket: versions purged, versioning
    # suspended, a lifecycle or a bucket policy set by any Slurm job.
    for context in ({}, {"pclusterInstanceType": "p5.48xlarge,trn1.32xlarge"}):
        c = configuration(**context)
        nodes = [c["HeadNode"], *c["Scheduling"]["SlurmQueues"]]
        accesses = [a for node in nodes for a in node["Iam"]["S3Access"]]
        assert accesses and all(a["EnableWriteAccess"] is False for a in accesses)
        assert all({"Policy": LITERAL_INPUTS.checkpoint_write_policy} in q["Iam"]["AdditionalIamPolicies"]
                   for q in c["Scheduling"]["SlurmQueues"])  # fmt: skip


def _actions(statement):
    action = statement["Action"]
    return {action} if isinstance(action, str) else set(action)


CHECKPOINT_OBJECTS = {"Fn::Join": ["", [{"Fn::ImportValue": "TrainingData-CheckpointBucketArn"}, "/*"]]}


def _statements(template, resource_type):
    return [
        statement for p in resources(template, resource_type).values()
        for statement in p["Properties"]["PolicyDocument"]["Statement"]
    ]  # fmt: skip


def _writes_to_checkpoints(statements):
    """The actions allowed on the checkpoint bucket's objects alone: the writes (reads name both buckets)."""
    return {
        a for s in statements if s["Effect"] == "Allow" and s["Resource"] == CHECKPOINT_OBJECTS for a in _actions(s)
    }


def _denied_on_checkpoints(statements):
    return {
        a for s in statements if s["Effect"] == "Deny"
        and CHECKPOINT_OBJECTS in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
        for a in _actions(s)
    }  # fmt: skip


def test_slurm_compute_nodes_get_the_batch_job_roles_checkpoint_grants_and_denies():
    templates = synth("parallelcluster").templates
    (write,) = [
        p["Properties"] for p in resources(templates[STACK], "AWS::IAM::ManagedPolicy").values()
        if "checkpoint" in p["Properties"].get("Description", "")
    ]  # fmt: skip
    assert write["Path"] == "/parallelcluster/"  # the provider may attach it
    slurm = write["PolicyDocument"]["Statement"]
    batch = _statements(templates["TrainingJobs"], "AWS::IAM::Policy")
    assert "s3:PutObject" in _writes_to_checkpoints(batch)
    assert _writes_to_checkpoints(slurm) == _writes_to_checkpoints(batch)
    assert "s3:DeleteObjectVersion" in _denied_on_checkpoints(batch) & _denied_on_checkpoints(slurm)
    guarded = {a for s in slurm if s["Effect"] == "Deny" for a in _actions(s)}
    assert {"s3:PutBucketVersioning", "s3:PutLifecycleConfiguration", "s3:PutBucketPolicy"} <= guarded
    allowed = {a for s in _statements(templates[STACK], "AWS::IAM::ManagedPolicy") if s["Effect"] == "Allow"
               for a in _actions(s)}  # fmt: skip
    assert not allowed & {"s3:*", "s3:Delete*", "s3:DeleteObject*", "s3:Put*", "*"}


def test_nodes_pull_images_only_from_this_deployments_repositories():
    template = synth("parallelcluster").templates[STACK]
    pull = [
        p
        for p in resources(template, "AWS::IAM::ManagedPolicy").values()
        if p["Properties"]["Path"] == "/parallelcluster/" and "ECR" in p["Properties"].get("Description", "")
    ]
    (policy,) = pull
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert {"Action": "ecr:GetAuthorizationToken", "Effect": "Allow", "Resource": "*"} in statements
    (scoped,) = [s for s in statements if s["Resource"] != "*"]
    assert sorted(scoped["Action"]) == [
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
    ]
    assert pulls_only_this_deployments_images(statements)


def test_environment_bound_synth_passes_cdk_nag_too():
    # Bound to an account and region, ARNs built with format_arn carry literals instead of pseudo
    # parameters, and so do cdk-nag's finding ids; the acknowledgements must follow (as `cdk synth`
    # does on a machine with a default region).
    result = synth_with({"parallelCluster": "true"}, cdk.Environment(account="123456789012", region="eu-west-1"))
    policies = resources(result.templates[STACK], "AWS::IAM::ManagedPolicy")
    assert "repository/*" not in json.dumps(policies)


def _cluster_warnings(ssh_source: str | None) -> list[str]:
    """The TrainingCluster construct alone in a stack: its synth-time warnings (no synth needed)."""
    from aws_cdk import aws_s3 as s3
    from aws_cdk.assertions import Annotations, Match

    from training_constructs.cluster.training_cluster import TrainingCluster

    context = {"parallelCluster": "true", **({"pclusterSshSource": ssh_source} if ssh_source else {})}
    stack = cdk.Stack(cdk.App(), "Cluster")
    buckets = [s3.Bucket.from_bucket_name(stack, name, name.lower()) for name in ("Datasets", "Checkpoints")]
    TrainingCluster(
        stack,
        "Slurm",
        cluster_name="training-slurm",
        settings=read_settings(context).parallel_cluster,
        subnet_id="subnet-0123456789abcdef0",
        dataset_bucket=buckets[0],
        checkpoint_bucket=buckets[1],
        image_repositories=["arn:aws:ecr:us-east-1:123456789012:repository/team"],
        log_retention_days=30,
        root_volume_gib=300,
    )
    return [str(w.entry.data) for w in Annotations.from_stack(stack).find_warning("*", Match.any_value())]


def test_ssh_open_to_the_internet_is_said_at_synth_in_one_line():
    (warning,) = _cluster_warnings("0.0.0.0/0")
    assert warning.startswith("pclusterSshSource=0.0.0.0/0 opens the head node's SSH port to the whole internet")
    assert "Session Manager needs no open port" in warning
    assert "\n" not in warning and len(warning) <= 200
    assert [w for w in _cluster_warnings("203.0.113.0/24") if "SSH" in w] == []
    assert [w for w in _cluster_warnings(None) if "SSH" in w] == []
