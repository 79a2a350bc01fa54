import pytest

from config.context import KEYS, ConfigError, read_settings


def error(**context) -> str:
    with pytest.raises(ConfigError) as caught:
        read_settings(context)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_defaults_match_the_design():
    s = read_settings({})
    assert [f.name for f in s.fleets] == ["gpu", "trainium"]
    gpu, trainium = s.fleet("gpu"), s.fleet("trainium")
    assert gpu.instance.name == "g6.12xlarge" and gpu.construct_id == "Gpu"
    assert (gpu.nodes, gpu.max_nodes, gpu.availability_zone) == (2, 4, None)
    assert trainium.instance.name == "trn1.32xlarge" and trainium.construct_id == "Trainium"
    assert (trainium.nodes, trainium.max_nodes) == (2, 4)
    assert gpu.image_uri is None and gpu.capacity_reservation is None and gpu.ami_id is None
    assert s.network.availability_zone is None and s.network.nat_gateways == 1
    assert s.network.interface_endpoints == ()
    assert s.parallel_cluster.enabled is False
    assert [i.name for i in s.parallel_cluster.instances] == ["p5e.48xlarge"] and s.parallel_cluster.max_nodes == 2
    assert s.log_retention_days == 30


def test_cli_strings_are_parsed():
    s = read_settings(
        {
            "gpuNodes": "8",
            "gpuMaxNodes": "16",
            "parallelCluster": "TRUE",
            "pclusterMaxNodes": "80",
            "interfaceEndpoints": "ecr.api, ecr.dkr,ecr.api",
            "gpuImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/isaaclab-batch:latest",
            "trainiumCapacityReservationId": "cr-0123456789abcdef0",
            "availabilityZone": "us-east-1c",
        },
        region="us-east-1",
    )
    assert (s.fleet("gpu").nodes, s.fleet("gpu").max_nodes) == (8, 16)
    assert s.parallel_cluster.enabled is True and s.parallel_cluster.max_nodes == 80
    assert s.network.interface_endpoints == ("ecr.api", "ecr.dkr")
    assert s.fleet("gpu").image_uri.endswith("isaaclab-batch:latest")
    assert s.fleet("trainium").capacity_reservation.reservation_id == "cr-0123456789abcdef0"
    assert s.network.availability_zone == "us-east-1c"


def test_json_types_from_cdk_json_are_accepted():
    s = read_settings({"gpuNodes": 3, "gpuMaxNodes": 3, "parallelCluster": False})
    assert (s.fleet("gpu").nodes, s.fleet("gpu").max_nodes) == (3, 3)


def test_max_nodes_defaults_to_at_least_nodes():
    assert read_settings({"gpuNodes": "8"}).fleet("gpu").max_nodes == 8
    assert read_settings({"gpuNodes": "3"}).fleet("gpu").max_nodes == 4


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"gpuInstanceType": "trn1.32xlarge"}, ["gpuInstanceType", "trn1.32xlarge", "g6.12xlarge", "p5.48xlarge"]),
        ({"trainiumInstanceType": "p5.48xlarge"}, ["trainiumInstanceType", "p5.48xlarge", "trn1n.32xlarge"]),
        ({"gpuInstanceType": "g6.4xlarge"}, ["gpuInstanceType", "g6.4xlarge", "no EFA"]),
        ({"gpuInstanceType": "m5.large"}, ["gpuInstanceType", "m5.large", "not in the instance catalog"]),
        ({"gpuNodes": "0"}, ["gpuNodes", "'0'", "2..1000"]),
        ({"gpuNodes": "1001"}, ["gpuNodes", "1001", "2..1000"]),
        ({"trainiumNodes": "-3"}, ["trainiumNodes", "-3"]),
        ({"gpuNodes": "four"}, ["gpuNodes", "four", "not an integer"]),
        ({"gpuNodes": "2.5"}, ["gpuNodes", "not an integer"]),
        ({"gpuNodes": True}, ["gpuNodes", "not an integer"]),
        ({"gpuNodes": "8", "gpuMaxNodes": "4"}, ["gpuMaxNodes", "=4", "out of range 8..1000"]),
        ({"trainiumMaxNodes": "1"}, ["trainiumMaxNodes", "below 2", "trainiumNodes..1000"]),
        ({"parallelCluster": "yes"}, ["parallelCluster", "yes", "true or false"]),
        ({"pclusterMaxNodes": "0"}, ["pclusterMaxNodes", "1..1000"]),
        ({"pclusterInstanceType": "g6.4xlarge"}, ["pclusterInstanceType", "no EFA"]),
        ({"gpuCapacityReservationId": "cr-123"}, ["gpuCapacityReservationId", "cr-123", "17 hex"]),
        ({"gpuImage": "not an image"}, ["gpuImage", "malformed"]),
        ({"availabilityZone": "use1-az1"}, ["availabilityZone", "use1-az1", "malformed"]),
        ({"interfaceEndpoints": "ecr.api,s3"}, ["interfaceEndpoints", "'s3'", "ecr.dkr"]),
        ({"logRetentionDays": "10"}, ["logRetentionDays", "10", "14"]),
        ({"natGateways": "3"}, ["natGateways", "1..2"]),
        ({"availabilityZone": "us-east-1a", "natGateways": "2"}, ["natGateways", "1..1"]),
    ],
)
def test_bad_values_name_key_value_and_allowed(context, expected):
    message = error(**context)
    for fragment in expected:
        assert fragment in message, message


def test_availability_zone_must_be_in_the_region():
    with pytest.raises(ConfigError, match=r"availabilityZone='eu-west-1a': is not in the stack's region us-east-1"):
        read_settings({"availabilityZone": "eu-west-1a"}, region="us-east-1")


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("gpuNode", "gpuNodes"),
        ("GPUNodes", "gpuNodes"),
        ("gpuinstancetype", "gpuInstanceType"),
        ("trainumNodes", "trainiumNodes"),
    ],
)
def test_misspelt_keys_are_refused_with_a_suggestion(typo, meant):
    assert error(**{typo: "4"}) == f"unknown context key {typo!r}: did you mean {meant}?"


def test_unknown_plain_key_lists_known_keys():
    message = error(flavour="vanilla")
    assert "unknown context key 'flavour'" in message and "gpuInstanceType" in message


def test_cdk_own_keys_are_left_alone():
    read_settings({"@aws-cdk/core:explicitStackTags": True, "aws:cdk:enable-path-metadata": True})


def test_every_key_has_allowed_text_and_meaning():
    for key in KEYS.values():
        assert key.allowed and key.meaning


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"gpuPurchaseOption": "spot"}, ["gpuPurchaseOption", "spot", "do not run on Spot"]),
        ({"trainiumPurchaseOption": "spot"}, ["trainiumPurchaseOption", "do not run on Spot"]),
        ({"gpuPurchaseOption": "reserved"}, ["gpuPurchaseOption", "reserved", "not a known option"]),
        (
            {"gpuCapacityReservationType": "capacity-block"},
            ["gpuCapacityReservationType", "needs gpuCapacityReservationId"],
        ),
        ({"trainiumCapacityReservationType": "block"}, ["trainiumCapacityReservationType", "odcr or capacity-block"]),
        ({"rootVolumeGib": "20"}, ["rootVolumeGib", "100..16384"]),
    ],
)
def test_compute_bad_values(context, expected):
    message = error(**context)
    for fragment in expected:
        assert fragment in message, message


def test_job_defaults():
    jobs = read_settings({}).jobs
    assert jobs.timeout_seconds == 3600 and jobs.attempts == 3
    assert jobs.shares == ()  # FIFO queues unless shares are given
    assert jobs.runnable_timeout_minutes == 60 and jobs.alert_email is None


def test_shares_become_inverse_batch_weight_factors():
    shares = read_settings({"shares": "llama:2, vision:1,team*:8,big:1000"}).jobs.shares
    assert [(s.identifier, s.share, s.weight_factor) for s in shares] == [
        ("llama", 2, 0.5),
        ("vision", 1, 1.0),
        ("team*", 8, 0.125),
        ("big", 1000, 0.001),
    ]


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"jobTimeoutSeconds": "59"}, ["jobTimeoutSeconds", "60..1209600"]),
        ({"jobTimeoutSeconds": "1209601"}, ["jobTimeoutSeconds", "60..1209600"]),
        ({"jobAttempts": "0"}, ["jobAttempts", "1..10"]),
        ({"jobAttempts": "11"}, ["jobAttempts", "1..10"]),
        ({"shares": "llama"}, ["shares", "'llama' is not identifier:share"]),
        ({"shares": "llama:0"}, ["shares", "'llama:0'", "share 1..1000"]),
        ({"shares": "llama:1001"}, ["shares", "'llama:1001'"]),
        ({"shares": "team-a:1"}, ["shares", "'team-a:1'", "letters and digits"]),
        ({"shares": "llama:1,llama:2"}, ["shares", "'llama' and 'llama' overlap"]),
        ({"shares": "team*:1,team7:2"}, ["shares", "'team*' and 'team7' overlap"]),
        ({"shares": "team7:2,team*:1"}, ["shares", "'team7' and 'team*' overlap"]),
        ({"shares": "llama:1,"}, ["shares", "entry ''"]),
        ({"runnableTimeoutMinutes": "9"}, ["runnableTimeoutMinutes", "below 10", "10..1440"]),
        ({"runnableTimeoutMinutes": "1441"}, ["runnableTimeoutMinutes", "above 1440"]),
        ({"alertEmail": "oncall"}, ["alertEmail", "'oncall'", "malformed", "an email address"]),
        ({"shares": ",".join(f"t{i}:1" for i in range(501))}, ["shares", "501 identifiers"]),
    ],
)
def test_job_bad_values(context, expected):
    message = error(**context)
    for fragment in expected:
        assert fragment in message, message


def test_every_accepted_retention_maps_to_a_cloudwatch_retention():
    from config.context import LOG_RETENTION_DAYS
    from training_constructs.retention import retention_days

    for days in LOG_RETENTION_DAYS:
        assert retention_days(days).name  # a KeyError here means the two lists drifted apart
