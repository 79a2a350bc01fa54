import json
import re
from pathlib import Path

import pytest

from config import limits
from config.context import KEYS, ConfigError, read_settings
from config.settings import FLEET_ID_SUFFIXES, RESERVED_CONSTRUCT_IDS

ROOT = Path(__file__).resolve().parent.parent


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
        ({"gpuInstanceType": "trn1.32xlarge"}, ["gpuInstanceType", "trn1.32xlarge", "not NVIDIA GPU", "catalog"]),
        # The closest names of the catalog, not all of them (issue 32: refusals stay short).
        (
            {"gpuInstanceType": "p5.48xlarg"},
            ["gpuInstanceType", "did you mean p5.48xlarge, ", "docs/reference/catalog.md"],
        ),
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
        ({"gpuImage": "Ubuntu:22.04"}, ["gpuImage", "malformed", "ubuntu:22.04"]),  # upper-case repository
        ({"gpuImage": "ubuntu@sha256:abc"}, ["gpuImage", "malformed"]),
        ({"gpuImage": "ubuntu:"}, ["gpuImage", "malformed"]),
        ({"gpuImage": "u" * 256}, ["gpuImage", "longer than 255 characters"]),
        ({"availabilityZone": "use1-az1"}, ["availabilityZone", "use1-az1", "malformed"]),
        ({"interfaceEndpoints": "ecr.api,s3"}, ["interfaceEndpoints", "'s3'", "ecr.dkr"]),
        ({"logRetentionDays": "10"}, ["logRetentionDays", "10", "such as 7 or 14"]),
        ({"natGateways": "3"}, ["natGateways", "1..2"]),
        ({"natGateways": "0"}, ["natGateways", "1..2"]),  # the training subnets' only way to most AWS APIs
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


def test_unknown_plain_key_points_to_the_key_table():
    # A name unlike every key ("flavour" now sits near the slurm key).
    message = error(favouriteColor="vanilla")
    assert message == "unknown context key 'favouriteColor': see docs/reference/context-keys.md"
    # Closest keys where some are close, without the whole list.
    message = error(healthSchedule="rate(1 day)")
    assert message.startswith("unknown context key 'healthSchedule': did you mean healthCheckSchedule")
    assert "gpuNodes" not in message


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
    from config.limits import LOG_RETENTION_DAYS
    from training_constructs.common.retention import retention_days

    for days in LOG_RETENTION_DAYS:
        assert retention_days(days).name  # a KeyError here means the two lists drifted apart


def fleets(**entries) -> dict:
    return {"fleets": json.dumps(entries)}


def test_fleets_from_the_cli_and_from_cdk_json():
    cli = read_settings(
        fleets(rl={"instanceType": "g6e.48xlarge", "maxNodes": "8"}, llm={"instanceType": "p5e.48xlarge", "nodes": 4})
    )
    # In cdk.json the value is already an object, with JSON numbers.
    json_types = read_settings({"fleets": {"rl": {"instanceType": "g6e.48xlarge", "maxNodes": 8}}})
    assert [(f.name, f.instance.name, f.nodes, f.max_nodes) for f in cli.fleets] == [
        ("rl", "g6e.48xlarge", 2, 8),
        ("llm", "p5e.48xlarge", 4, 4),
    ]
    assert json_types.fleet("rl").max_nodes == 8 and [f.name for f in json_types.fleets] == ["rl"]
    assert cli.fleet("llm").construct_id == "Llm"


def test_fleet_fields_reach_the_settings():
    s = read_settings(
        fleets(
            trn={
                "instanceType": "trn2.48xlarge",
                "availabilityZone": "us-west-2c",
                "capacityReservationId": "cr-0123456789abcdef0",
                "capacityReservationType": "capacity-block",
                "image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/neuron:v1",
                "amiId": "ami-0123456789abcdef0",
            }
        )
        | {"availabilityZone": "us-west-2a"},
        region="us-west-2",
    )
    trn = s.fleet("trn")
    assert trn.availability_zone == "us-west-2c" and trn.ami_id == "ami-0123456789abcdef0"
    assert (trn.capacity_reservation.reservation_id, trn.capacity_reservation.kind) == (
        "cr-0123456789abcdef0",
        "capacity-block",
    )
    assert trn.image_uri.endswith("/neuron:v1")
    assert s.network.availability_zone == "us-west-2a" and s.network.fleet_availability_zones == ("us-west-2c",)


def test_none_leaves_a_default_fleet_out():
    assert [f.name for f in read_settings({"trainiumInstanceType": "none"}).fleets] == ["gpu"]
    assert [f.name for f in read_settings({"gpuInstanceType": "none"}).fleets] == ["trainium"]


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        (fleets(rl={"instanceType": "g6e.48xlarge", "gpus": 8}), ["fleets.rl.gpus", "unknown field", "maxNodes"]),
        (fleets(rl={"instanceType": "g6e.48xlarge", "nodes": "many"}), ["fleets.rl.nodes", "not an integer"]),
        (fleets(rl={"instanceType": "g6e.48xlarge", "nodes": True}), ["fleets.rl.nodes", "not an integer"]),
        (fleets(rl={"instanceType": 5}), ["fleets.rl.instanceType", "not a string"]),
        (
            fleets(rl={"instanceType": "g6e.48xlarge", "nodes": 8, "maxNodes": 4}),
            ["fleets.rl.maxNodes=4", "out of range 8..1000"],
        ),
        (fleets(rl={"instanceType": "g6e.48xlarge", "nodes": 1}), ["fleets.rl.nodes=1", "below 2"]),
        (fleets(rl={}), ["fleets.rl.instanceType", "required"]),
        (fleets(rl={"instanceType": "g6.4xlarge"}), ["fleets.rl.instanceType", "has no EFA"]),
        (fleets(rl={"instanceType": "p5.48xlarge", "image": "Team/Repo:1"}), ["fleets.rl.image", "malformed"]),
        (fleets(rl={"instanceType": "m7i.large"}), ["fleets.rl.instanceType", "not in the instance catalog"]),
        (fleets(rl={"instanceType": "p5.48xlarge", "amiId": "ami-12345678"}), ["fleets.rl.amiId", "GPU fleets"]),
        (fleets(rl={"instanceType": "p5.48xlarge", "amiId": "latest"}), ["fleets.rl.amiId", "malformed"]),
        (
            fleets(rl={"instanceType": "p5.48xlarge", "capacityReservationType": "capacity-block"}),
            ["fleets.rl.capacityReservationType", "needs fleets.rl.capacityReservationId"],
        ),
        (fleets(rl={"instanceType": "p5.48xlarge", "image": ":latest"}), ["fleets.rl.image", "malformed"]),
        (fleets(rl="p5.48xlarge"), ["fleets.rl", "not a JSON object"]),
        ({"fleets": "{}"}, ["fleets={}", "no fleet"]),
        ({"fleets": "[]"}, ["fleets='[]'", "not a JSON object"]),
        ({"fleets": '{"rl": {'}, ["fleets=", "malformed JSON"]),
        (fleets(**{"1rl": {"instanceType": "p5.48xlarge"}}), ["fleets='1rl'", "a letter, then"]),
        (fleets(**{"rl-a": {"instanceType": "p5.48xlarge"}}), ["fleets='rl-a'", "letters and digits"]),
        (
            fleets(rl={"instanceType": "p5.48xlarge"}, RL={"instanceType": "p5.48xlarge"}),
            ["'rl' and 'RL' differ only in case"],
        ),
        (
            fleets(**{f"f{i}": {"instanceType": "g6.12xlarge"} for i in range(41)}),
            ["fleets='41 fleets'", "at most 40"],
        ),
    ],
)
def test_bad_fleets_name_the_field(context, expected):
    message = error(**context)
    for fragment in expected:
        assert fragment in message, message


def test_fleets_and_flat_fleet_keys_are_never_mixed():
    message = error(**fleets(rl={"instanceType": "g6e.48xlarge"}), gpuNodes="4")
    assert message == "context keys fleets and gpuNodes cannot be mixed: describe every fleet in fleets"
    # availabilityZone is the network's default, not a fleet key: allowed with fleets.
    read_settings(fleets(rl={"instanceType": "g6e.48xlarge"}) | {"availabilityZone": "us-east-1a"})


def test_no_fleet_at_all_is_refused():
    assert "leave no fleet" in error(gpuInstanceType="none", trainiumInstanceType="none")


def test_fleet_az_must_be_in_the_region_and_at_most_three_named_azs():
    with pytest.raises(ConfigError, match=r"fleets\.rl\.availabilityZone='eu-west-1a': is not in the stack's region"):
        read_settings(fleets(rl={"instanceType": "g6e.48xlarge", "availabilityZone": "eu-west-1a"}), region="us-east-1")
    per_az = {f"f{az}": {"instanceType": "g6e.48xlarge", "availabilityZone": f"us-east-1{az}"} for az in "bcd"}
    four = fleets(**per_az, fe={"instanceType": "g6e.48xlarge", "availabilityZone": "us-east-1e"})
    message = error(**four)
    # A VPC holds five blocks; the primary and three named AZs leave one for a move's new AZ.
    assert limits.MAX_NAMED_AZ_BLOCKS == 3 and limits.VPC_CIDR_BLOCKS == 5
    assert message.startswith("context key fleets='4 AZs': fleets and the Slurm cluster name 4 subnets")
    assert "one for a fleet's move" in message
    assert message.endswith("allowed: at most 3 named AZs, Slurm's included")
    read_settings(fleets(**per_az))
    read_settings(fleets(**per_az) | {"availabilityZone": "us-east-1b"})
    # An availabilityZone no fleet lands in takes no block; one that a fleet lands in does.
    read_settings(fleets(**per_az) | {"availabilityZone": "us-east-1f"})
    fourth = fleets(**per_az, g={"instanceType": "g6e.48xlarge"}) | {"availabilityZone": "us-east-1f"}
    assert error(**fourth).startswith("context key availabilityZone='us-east-1f': fleets and the Slurm cluster name 4")
    # The Slurm cluster's own subnet in availabilityZone is a fourth block.
    message = error(**fleets(**per_az) | {"availabilityZone": "us-east-1b", "parallelCluster": "true"})
    assert message.startswith("context key availabilityZone='us-east-1b': fleets and the Slurm cluster name 4")


def test_every_fleet_naming_its_az_needs_nothing_else():
    """Issue 19, point 2: the natural per-fleet form, with no top-level availabilityZone."""
    two = fleets(
        a={"instanceType": "g6.12xlarge", "availabilityZone": "us-east-1a"},
        b={"instanceType": "g6.12xlarge", "availabilityZone": "us-east-1b"},
    )
    s = read_settings(two, region="us-east-1")
    assert [f.availability_zone for f in s.fleets] == ["us-east-1a", "us-east-1b"]
    assert s.network.availability_zone is None


def test_natgateways_two_with_a_named_az():
    # The public subnets stay in the VPC's first two AZs whatever availabilityZone says.
    assert read_settings({"availabilityZone": "us-east-1a", "natGateways": "2"}).network.nat_gateways == 2


@pytest.mark.parametrize(
    "name", ["datasets", "checkpoints", "jobRole", "jobAlerts", "alertTopic", "fairShare", "SUBNETS"]
)
def test_reserved_fleet_names_are_refused_in_one_line(name):
    message = error(**fleets(**{name: {"instanceType": "g6e.48xlarge"}}))
    assert message.startswith(f"context key fleets={name!r}: {name!r} is taken by the stacks' own ")
    assert message.endswith("allowed: a fleet name that is not one of the stacks' own ids (in any case)")


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [
        ("gpu", "gpuJobQueue", "GpuJobQueue"),  # a fleet named like another's output
        ("rl", "rlLogGroup", "RlLogGroup"),
        ("a", "aHealth", "AHealth"),  # the jobs stack's health construct
        ("gpuJobQueue", "gpu", "GpuJobQueue"),  # in either order
        ("x", "XtrainingJobDefinition", "XTrainingJobDefinition"),  # ids compare in any case
    ],
)
def test_fleets_whose_ids_meet_are_refused_naming_both(first, second, shared):
    fleet = {"instanceType": "g6.12xlarge"}
    message = error(**fleets(**{first: fleet, second: fleet}))
    assert message.startswith(f"context key fleets={second!r}: fleets {first!r} and {second!r} both make the ")
    assert shared.lower() in message.lower() and message.endswith("allowed: another name for one of them")
    # A name that only starts like another's id is fine.
    read_settings(fleets(gpu=fleet, gpuJob=fleet, gpuJobQueues=fleet))


def test_no_stack_id_is_a_fleet_id_plus_a_suffix():
    """The reserved check covers a fleet's own id only: a stack id such as `FooHealth` would collide
    with fleet `foo`'s health construct, so none may look like one."""
    for reserved in RESERVED_CONSTRUCT_IDS:
        for suffix in filter(None, FLEET_ID_SUFFIXES):
            stem = reserved[: -len(suffix)] if reserved.lower().endswith(suffix.lower()) else ""
            assert not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", stem), f"{reserved} is fleet {stem!r} + {suffix}"


@pytest.mark.parametrize("days", [1096, 2192, 2557, 2922, 3288])
def test_log_retention_parallelcluster_refuses_is_refused_with_it(days):
    assert read_settings({"logRetentionDays": str(days)}).log_retention_days == days  # CloudWatch takes it
    message = error(logRetentionDays=str(days), parallelCluster="true")
    assert message.startswith(f"context key logRetentionDays={days}: ParallelCluster refuses")
    assert "allowed: with parallelCluster=true one of 1, 3, 5," in message and "1827, 3653" in message


def test_fleets_sharing_a_subnet_must_fit_its_addresses():
    # p5.48xlarge: 32 EFA interfaces + 1 task ENI = 33 addresses per node; a /18 has 16379.
    assert read_settings(fleets(big={"instanceType": "p5.48xlarge", "maxNodes": 496})).fleet("big").max_nodes == 496
    message = error(**fleets(big={"instanceType": "p5.48xlarge", "maxNodes": 497}))
    assert "needs 16401 addresses" in message and "(fleet big: 16401)" in message and "/18's 16379" in message
    # Two fleets in the same (default) subnet add up; the flat keys are checked the same way.
    both = fleets(
        a={"instanceType": "p5.48xlarge", "maxNodes": 300}, b={"instanceType": "p5e.48xlarge", "maxNodes": 300}
    )
    assert "fleet a: 9900, fleet b: 9900" in error(**both)
    assert "fleet gpu: 33000" in error(gpuInstanceType="p5.48xlarge", gpuMaxNodes="1000")
    # In different AZs each has its own subnet.
    apart = fleets(
        a={"instanceType": "p5.48xlarge", "maxNodes": 300},
        b={"instanceType": "p5e.48xlarge", "maxNodes": 300, "availabilityZone": "us-east-1b"},
    )
    read_settings(apart | {"availabilityZone": "us-east-1a"})


def test_subnet_room_counts_the_ena_only_primary_of_p6_b300():
    # p6-b300.48xlarge: ENA-only primary + 16 EFA interfaces + 1 task ENI = 18 addresses per node
    # (not 17, its EFA count + 1): 909 nodes take 16362 of 16379, 910 take 16380.
    assert read_settings(fleets(b300={"instanceType": "p6-b300.48xlarge", "maxNodes": 909})).fleet("b300")
    assert "b300: 16380" in error(**fleets(b300={"instanceType": "p6-b300.48xlarge", "maxNodes": 910}))
    # p6-b200: 8 EFA interfaces, EFA on card 0 too: 9 per node, 9000 at 1000 nodes.
    mixed = fleets(
        b200={"instanceType": "p6-b200.48xlarge", "maxNodes": 1000},
        p5={"instanceType": "p5.48xlarge", "maxNodes": 300},
    )
    assert "(fleet p5: 9900, fleet b200: 9000)" in error(**mixed)  # the largest first


def test_slurm_queues_count_in_the_subnet_they_share():
    # 450 p5.48xlarge Batch nodes take 14850 addresses: they fit alone in a /18 (16379).
    gpu = {"gpuInstanceType": "p5.48xlarge", "gpuMaxNodes": "450", "trainiumInstanceType": "none"}
    read_settings(gpu)
    # Two Slurm queues of 1000 nodes (one address each) and a head node share the VPC's first subnet.
    slurm = {"parallelCluster": "true", "pclusterMaxNodes": "1000", "pclusterInstanceType": "p5e.48xlarge,p5.48xlarge"}
    message = error(**gpu | slurm)
    assert message.startswith("context: the VPC's first training subnet needs 16851 addresses at maxNodes")
    # The two largest users and how many more (the head node and the second queue).
    assert "(fleet gpu: 14850, Slurm p5e.48xlarge: 1000, 2 more)" in message
    # With availabilityZone set the cluster has a subnet of its own, and the fleet one in that AZ.
    read_settings(gpu | slurm | {"availabilityZone": "us-east-1a"})
