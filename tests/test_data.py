"""The data stack keeps what it holds: encrypted, TLS-only, private, access-logged, versioned, retained."""

import pytest

from tests.harness import resources, synth

STACK = "TrainingData"


def buckets():
    template = synth("default").templates[STACK]
    return template, resources(template, "AWS::S3::Bucket")


def bucket(prefix):
    template, found = buckets()
    ((logical_id, resource),) = [(k, r) for k, r in found.items() if k.startswith(f"Data{prefix}")]
    return template, logical_id, resource


@pytest.mark.parametrize("name", ["Datasets", "Checkpoints", "AccessLogs"])
def test_bucket_is_encrypted_private_and_retained(name):
    _, _, resource = bucket(name)
    props = resource["Properties"]
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert resource["DeletionPolicy"] == "Retain" and resource["UpdateReplacePolicy"] == "Retain"
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}


@pytest.mark.parametrize("name", ["Datasets", "Checkpoints", "AccessLogs"])
def test_bucket_refuses_plain_http(name):
    template, logical_id, _ = bucket(name)
    (policy,) = [
        p["Properties"]
        for p in resources(template, "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": logical_id}
    ]
    denies = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and s["Action"] == "s3:*" for s in denies)


@pytest.mark.parametrize("name", ["Datasets", "Checkpoints"])
def test_data_buckets_log_access_to_the_log_bucket(name):
    _, log_id, _ = bucket("AccessLogs")
    _, _, resource = bucket(name)
    logging = resource["Properties"]["LoggingConfiguration"]
    assert logging["DestinationBucketName"] == {"Ref": log_id}
    assert logging["LogFilePrefix"] == f"{name.lower()}/"


@pytest.mark.parametrize("name", ["Datasets", "Checkpoints"])
def test_old_versions_expire_but_are_kept_for_a_while(name):
    _, _, resource = bucket(name)
    rules = resource["Properties"]["LifecycleConfiguration"]["Rules"]
    noncurrent = [r for r in rules if "NoncurrentVersionExpiration" in r]
    (rule,) = noncurrent
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] >= 30
    assert rule["NoncurrentVersionExpiration"]["NewerNoncurrentVersions"] >= 1
    # Nothing current ever expires.
    assert not any("ExpirationInDays" in r or "ExpirationDate" in r for r in rules)


def test_data_stack_has_termination_protection():
    (artifact,) = [s for s in synth("default").assembly.stacks if s.stack_name == STACK]
    assert artifact.termination_protection is True


def test_bucket_arns_are_exported_under_stable_names():
    outputs = synth("default").templates[STACK]["Outputs"]
    names = {o["Export"]["Name"] for o in outputs.values() if "Export" in o}
    assert {"TrainingData-DatasetBucketArn", "TrainingData-CheckpointBucketArn"} <= names
    assert {"DatasetBucket", "CheckpointBucket"} <= set(outputs)
