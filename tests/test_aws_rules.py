"""Issue 32: what `cdk synth` accepts, AWS accepts. Values that used to synthesize and then fail at
deploy (or never work) are refused at synth in one line naming the key; AZ names against a dated
table, instance types against botocore's EC2 model, image names as Batch takes them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from config import instance_types, zones
from config.catalog import CATALOG
from config.context import ConfigError, read_settings
from config.context_keys import KEYS
from config.refusals import MAX_LINE
from tests import conftest
from tests.harness import ROOT

ZONE_TABLE = json.loads((ROOT / "config" / "availability_zones.json").read_text())


def refusal(context: dict[str, Any], region: str | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        read_settings(context, region=region)
    return str(caught.value)


def fleet(**fields: Any) -> dict[str, str]:
    return {"fleets": json.dumps({"rl": {"instanceType": "p5.48xlarge", **fields}})}


# Bad values tried as a new user would (the trial and more): context, region at synth, and
# a fragment of the one line that must refuse it. The closing note's table is this list.
BAD_VALUES: list[tuple[dict[str, Any], str | None, str]] = [
    # The six that used to synthesize.
    ({"healthCheckSchedule": "cron(0 25 * * ? *)"}, None, "hour 25 outside 0-23"),
    ({"healthCheckSchedule": "cron(61 3 * * ? *)"}, None, "minute 61 outside 0-59"),
    ({"healthCheckSchedule": "cron(0 3 * * ? 1999)"}, None, "the year field must be *"),
    ({"availabilityZone": "us-east-1z"}, None, "us-east-1 has no zone z"),
    (fleet(availabilityZone="us-east-1z"), None, "us-east-1 has no zone z"),
    ({"pclusterHeadNodeInstanceType": "m7i.huge"}, None, "not an EC2 instance type"),
    # More of the same kinds.
    ({"availabilityZone": "us-east-1z"}, "us-east-1", "us-east-1 has no zone z"),
    ({"availabilityZone": "us-west-2e"}, "us-west-2", "us-west-2 has no zone e"),
    ({"availabilityZone": "eu-west-1d"}, None, "eu-west-1 has no zone d"),
    ({"availabilityZone": "us-east-7a"}, None, "no region us-east-7"),
    ({"availabilityZone": "mars-north-1a"}, None, "no region mars-north-1"),
    ({"availabilityZone": "eu-west-1a"}, "us-east-1", "is not in the stack's region us-east-1"),
    (fleet(availabilityZone="ap-southeast-2d"), None, "ap-southeast-2 has no zone d"),
    ({"availabilityZone": "us-east-1"}, None, "malformed"),
    ({"availabilityZone": "US-EAST-1A"}, None, "malformed"),
    ({"pclusterHeadNodeInstanceType": "m7i.xxlarge"}, None, "not an EC2 instance type"),
    ({"pclusterHeadNodeInstanceType": "c9z.large"}, None, "not an EC2 instance type"),
    ({"pclusterHeadNodeInstanceType": "t3.nano.x"}, None, "malformed"),
    ({"pclusterHeadNodeInstanceType": "M7i.xlarge"}, None, "malformed"),
    ({"healthCheckSchedule": "cron(0 3 * * ? 2027)"}, None, "the year field must be *"),
    ({"healthCheckSchedule": "cron(0 3 * * ? 2026-2030)"}, None, "the year field must be *"),
    ({"healthCheckSchedule": "cron(0 3 * * ? 1969)"}, None, "year 1969 outside 1970-2199"),
    ({"healthCheckSchedule": "cron(0 3 * * ? 2200)"}, None, "year 2200 outside 1970-2199"),
    ({"healthCheckSchedule": "cron(0 24 * * ? *)"}, None, "hour 24 outside 0-23"),
    ({"healthCheckSchedule": "cron(60 3 * * ? *)"}, None, "minute 60 outside 0-59"),
    ({"healthCheckSchedule": "cron(-1 3 * * ? *)"}, None, "malformed minute '-1'"),
    ({"healthCheckSchedule": "cron(0 3 32 * ? *)"}, None, "day-of-month 32 outside 1-31"),
    ({"healthCheckSchedule": "cron(0 3 * 0 ? *)"}, None, "month 0 outside 1-12"),
    ({"healthCheckSchedule": "cron(0 3 * JANUARY ? *)"}, None, "month 'JANUARY' is not 1-12 or JAN-DEC"),
    ({"healthCheckSchedule": "cron(0 3 ? * 0 *)"}, None, "day-of-week 0 outside 1-7"),
    ({"healthCheckSchedule": "cron(0 3 ? * 9#1 *)"}, None, "day-of-week 9 outside 1-7"),
    ({"healthCheckSchedule": "cron(0 3 * * L *)"}, None, "a cron schedule must run every day"),
    ({"healthCheckSchedule": "cron(0 */25 * * ? *)"}, None, "hour increment '25' is not 1-23"),
    ({"healthCheckSchedule": "cron(0 3 ? * * )"}, None, "not a rate(...) or six-field cron(...)"),
    ({"healthCheckSchedule": "rate(0 hours)"}, None, "not a rate(...) or six-field cron(...)"),
    ({"healthCheckSchedule": "rate(1.5 hours)"}, None, "not a rate(...) or six-field cron(...)"),
    ({"healthCheckSchedule": "rate(2 weeks)"}, None, "not a rate(...) or six-field cron(...)"),
    ({"healthCheckSchedule": "cron(" + ",".join(["5"] * 130) + " 3 * * ? *)"}, None, "longer than 256"),
    ({"gpuImage": "Ubuntu:22.04"}, None, "malformed"),
    ({"gpuImage": "ubuntu:"}, None, "malformed"),
    ({"gpuImage": "ubuntu@sha256:1234"}, None, "malformed"),
    ({"gpuImage": "ubuntu:22.04:extra"}, None, "malformed"),
    ({"gpuImage": "https://registry/x:1"}, None, "malformed"),
    ({"gpuImage": "x" * 300}, None, "longer than 255 characters"),
    (fleet(image="team//repo:1"), None, "malformed"),
    # Long lists are no longer spelt out.
    ({"gpuInstanceType": "p5.48xlarg"}, None, "did you mean p5.48xlarge"),
    ({"gpuInstanceType": "m7i.large"}, None, "not in the instance catalog"),
    (fleet(instanceType="p5e.48xl"), None, "did you mean p5e.48xlarge"),
    ({"pclusterInstanceType": "p5en.48xlarge,g6.4xlarge"}, None, "has no EFA"),
    ({"trainiumInstanceType": "trn3.48xlarge"}, None, "trn1.32xlarge, trn1n.32xlarge"),
    ({"logRetentionDays": "45"}, None, "such as 30 or 60"),
    ({"interfaceEndpoints": "ecr,s3"}, None, "unknown service 'ecr'"),
    ({"alertEmails": "a@example.com"}, None, "did you mean alertEmail"),
    ({"gpuCount": "8"}, None, "did you mean gpuNodes? (docs/reference/context-keys.md)"),
    ({"favouriteColor": "vanilla"}, None, "see docs/reference/context-keys.md"),  # unlike every key
    ({"shares": ",".join(f"t{i}:1" for i in range(600))}, None, "600 identifiers"),
    (fleet(nodes="1"), None, "below 2"),
    ({"fleets": '{"rl": {"instanceType": "p5.48xlarge"'}, None, "malformed JSON"),
    ({"fleets": json.dumps({f"f{i}": {"instanceType": "p5.48xlarge"} for i in range(45)})}, None, "at most 40"),
    ({"pclusterKeyName": "k" * 300}, None, "malformed"),
    ({"ngcSecret": "ngc key"}, None, "malformed"),
    ({"pclusterSshSource": "0.0.0.0/33"}, None, "malformed"),
    ({"gpuCapacityReservationId": "cr-0123456789abcdef"}, None, "malformed"),
    ({"trainiumImage": "public.ecr.aws/neuron/x:tag with space"}, None, "malformed"),
]


@pytest.mark.parametrize(("context", "region", "fragment"), BAD_VALUES)
def test_each_bad_value_is_refused_in_one_short_line_naming_the_key(context, region, fragment):
    message = refusal(context, region)
    assert fragment in message, message
    assert "\n" not in message and len(message) <= conftest.MAX_REFUSAL, (len(message), message)
    key = next(iter(context))
    assert key in message, message


def test_every_refusal_the_suite_makes_is_recorded_and_measured():
    """tests/conftest.py measures every ConfigError any test builds (the fixture `refusals_stay_short`);
    this proves the recording sees refusals made inside read_settings."""
    before = len(conftest.REFUSALS)
    refusal({"natGateways": "3"})
    assert len(conftest.REFUSALS) == before + 1 and "natGateways" in conftest.REFUSALS[-1]
    assert conftest.MAX_REFUSAL == 200


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu:22.04",
        "ubuntu",
        "library/ubuntu",
        "user/repo:tag",
        "ubuntu@sha256:" + "0" * 64,
        "ubuntu:22.04@sha256:" + "f" * 64,
        "nvcr.io/nvidia/isaac-lab:2.1.0",
        "public.ecr.aws/neuron/pytorch-training-neuronx:2.5.1-neuronx-py310-sdk2.21.0-ubuntu22.04",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/isaaclab:gpu-abc",
        "localhost:5000/team/img:1",
        "quay.io/org/my_image__x-y.z:v1.2",
    ],
)
def test_image_names_batch_takes_are_accepted(image):
    assert read_settings({"gpuImage": image}).fleet("gpu").image_uri == image


def test_zone_table_is_dated_and_names_its_sources():
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", ZONE_TABLE["read_on"]) and ZONE_TABLE["read_on"] >= "2026-11-24"
    assert set(ZONE_TABLE["sources"]) == {"cfn-lint", "moto"}
    assert "az-ids" in ZONE_TABLE["note"]
    for region, letters in ZONE_TABLE["zones"].items():
        assert re.fullmatch(r"[a-z]{2,4}(-[a-z]+)+-\d", region) and re.fullmatch(r"[a-z]+", letters), region
        assert letters == "".join(sorted(set(letters)))


def test_zone_table_holds_every_zone_cfn_lint_knows():
    """The table is cut from cfn-lint's region data (and moto's): a newer cfn-lint with more zones
    fails here, so the table is refreshed rather than refusing a real zone."""
    from cfnlint.helpers import AVAILABILITY_ZONES

    corrected = ZONE_TABLE["corrections"]
    for region, names in AVAILABILITY_ZONES.items():
        for name in names:
            if region in corrected and name[-1] not in corrected[region]["letters"]:
                continue  # a letter AWS no longer lists, corrected from another source
            assert name[-1] in zones.zones().get(region, ""), f"{name} missing from config/availability_zones.json"


def test_cn_north_1_has_zones_a_b_and_d():
    """Issue 46: EC2 lists cn-north-1a, 1b and 1d (cnn1-az2, -az3, -az4); cfn-lint's a, b, c refused
    a real zone and accepted a missing one."""
    assert zones.zones()["cn-north-1"] == "abd"
    correction = ZONE_TABLE["corrections"]["cn-north-1"]
    assert (correction["letters"], correction["instead_of"]) == ("abd", "abc") and "cnn1-az4" in correction["source"]
    for region in (None, "cn-north-1"):
        assert (
            read_settings({"availabilityZone": "cn-north-1d"}, region=region).network.availability_zone == "cn-north-1d"
        )
        message = refusal({"availabilityZone": "cn-north-1c"}, region)
        assert "cn-north-1 has no zone c; allowed: cn-north-1 + one of a, b, d" in message
        assert "-c skipZoneTable=cn-north-1" in message
    assert "cn-north-1" in ZONE_TABLE["second_source"]


def test_skip_zone_table_takes_any_letter_of_the_named_region_only():
    taken = read_settings({"availabilityZone": "cn-north-1c", "skipZoneTable": "cn-north-1, ap-south-2"})
    assert taken.network.availability_zone == "cn-north-1c"
    assert taken.network.zone_table_skipped == ("ap-south-2", "cn-north-1")
    assert read_settings({}).network.zone_table_skipped == ()
    # Other regions are still checked, and so are the stack's region and the name's form.
    assert "us-east-1 has no zone z" in refusal({"availabilityZone": "us-east-1z", "skipZoneTable": "cn-north-1"})
    fleet_ok = read_settings({**fleet(availabilityZone="cn-north-1e"), "skipZoneTable": "cn-north-1"})
    assert fleet_ok.fleet("rl").availability_zone == "cn-north-1e"
    mismatch = refusal({"availabilityZone": "cn-north-1c", "skipZoneTable": "cn-north-1"}, "us-east-1")
    assert "is not in the stack's region us-east-1" in mismatch and "skipZoneTable" not in mismatch
    assert "'cn north' is not a region name" in refusal({"skipZoneTable": "cn north"})


def test_known_zones_are_accepted_with_and_without_a_region():
    # us-east-1 has six zone names; us-west-1's letters differ per account (a, b or c).
    for az in ("us-east-1a", "us-east-1f", "us-west-1b", "us-west-1c", "eu-west-1c", "ap-northeast-1d"):
        assert read_settings({"availabilityZone": az}).network.availability_zone == az
        assert read_settings({"availabilityZone": az}, region=az[:-1]).network.availability_zone == az


def test_a_region_newer_than_the_table_is_not_refused_when_named_at_synth():
    assert "xx-newregion-1" not in zones.zones()
    read_settings({"availabilityZone": "xx-newregion-1a"}, region="xx-newregion-1")
    # Without a region at synth nothing says the region exists: refused, and the line says why.
    message = refusal({"availabilityZone": "xx-newregion-1a"})
    assert f"table of {ZONE_TABLE['read_on']}; if AWS has it: -c skipZoneTable=xx-newregion-1" in message


def test_every_catalog_type_and_the_head_node_default_are_ec2_types():
    known = instance_types.ec2_instance_types()
    assert len(known) > 1000 and "m7i.xlarge" in known and "m7i.huge" not in known
    assert set(CATALOG) <= known, sorted(set(CATALOG) - known)


def test_head_node_type_refusal_suggests_the_closest_types():
    message = refusal({"pclusterHeadNodeInstanceType": "m7i.huge"})
    assert message.startswith("context key pclusterHeadNodeInstanceType='m7i.huge': not an EC2 instance type")
    assert "did you mean m7i." in message and "aws ec2 describe-instance-types" in message
    assert read_settings({"pclusterHeadNodeInstanceType": "c7i.2xlarge"}).parallel_cluster.head_node_instance_type


def test_instance_types_come_from_a_cache_file_after_the_first_read(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    instance_types.ec2_instance_types.cache_clear()
    try:
        first = instance_types.ec2_instance_types()
        (cache,) = tmp_path.glob("aws-training-cdk/ec2-instance-types-*.json")
        assert set(json.loads(cache.read_text())) == first == set(instance_types._from_model())
        # The next process reads the file, not the 4 MB model.
        cache.write_text(json.dumps(["m7i.xlarge", "zz9.test"]))
        instance_types.ec2_instance_types.cache_clear()
        assert instance_types.ec2_instance_types() == {"m7i.xlarge", "zz9.test"}
        # A broken cache costs a reload, nothing else.
        cache.write_text("{not json")
        instance_types.ec2_instance_types.cache_clear()
        assert instance_types.ec2_instance_types() == first
    finally:
        instance_types.ec2_instance_types.cache_clear()


def test_a_warm_cache_keeps_botocore_out_of_the_synth(tmp_path):
    """Importing botocore costs about half a second; with the cache file in place, reading the
    context (the head node check included) must not import it (issue 32: under ~50 ms)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    probe = (
        "import sys, time; from config.context import read_settings; t = time.perf_counter(); "
        "read_settings({'pclusterHeadNodeInstanceType': 'c7i.2xlarge'}); "
        "print('botocore' in sys.modules, round((time.perf_counter() - t) * 1000))"
    )
    runs = [
        subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout.split()[0] == "True"  # the first run loads the model and writes the cache
    assert runs[1].stdout.split()[0] == "False", runs[1].stdout


@pytest.mark.parametrize("key", sorted(KEYS))
def test_a_300_character_value_of_any_key_is_refused_in_one_short_line(key):
    # The value is cut (refusals.shown) and, where the allowed list leaves no room, the line points at
    # the key table instead of printing it. A key that takes free text may accept the value.
    try:
        read_settings({key: "x" * 300})
    except ConfigError as error:
        assert "\n" not in str(error) and len(str(error)) <= MAX_LINE, str(error)
