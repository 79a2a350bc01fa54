"""A fleet's `fallback` placements as config.context reads them: what they inherit, the same-shape
rule, Capacity Block rules, and the AZ and subnet limits they count against. No synth."""

from __future__ import annotations

import json
from typing import Any

import pytest

from config import limits
from config.context import ConfigError, read_settings
from config.placements import (
    CAPACITY_BLOCK_TYPES,
    LAMBDA_ENVIRONMENT_BYTES,
    MAX_FALLBACK,
    QUEUE_ARN_CHARS,
    routes_bytes,
    same_shape,
)
from tests.conftest import MAX_REFUSAL

BLOCK = {"capacityReservationId": "cr-0a1b2c3d4e5f60718", "capacityReservationType": "capacity-block"}
WINDOW = {"start": "2026-12-01T11:30Z", "end": "2026-12-08T11:30Z"}


def settings(fallback: list[dict[str, Any]], **fleet: Any) -> Any:
    llm = {"instanceType": "p5e.48xlarge", "availabilityZone": "us-west-2b", "fallback": fallback} | fleet
    return read_settings({"fleets": json.dumps({"llm": llm})}, region="us-west-2")


def refusal(fallback: list[dict[str, Any]], **fleet: Any) -> str:
    """The one-line refusal, of at most MAX_REFUSAL characters like every other (tests/conftest.py)."""
    with pytest.raises(ConfigError) as refused:
        settings(fallback, **fleet)
    message = str(refused.value)
    assert "\n" not in message and len(message) <= MAX_REFUSAL, message
    return message


def test_what_a_placement_leaves_out_is_the_fleets_own():
    fleet = settings([{"availabilityZone": "us-west-2c"}, {"instanceType": "p5.48xlarge"}]).fleets[0]
    own, other_az, other_type = fleet.placements
    assert (own.availability_zone, own.instance.name) == ("us-west-2b", "p5e.48xlarge")
    assert (other_az.availability_zone, other_az.instance.name) == ("us-west-2c", "p5e.48xlarge")
    assert (other_type.availability_zone, other_type.instance.name) == ("us-west-2b", "p5.48xlarge")
    assert other_az.capacity_reservation is None and other_az.window is None


def test_same_shape_means_accelerators_vcpus_memory_and_efa():
    # H100 and H200 nodes of the same size are interchangeable for the job definitions; p5en has 16 EFA.
    assert same_shape(settings([]).fleets[0].instance) == ("p5.48xlarge", "p5e.48xlarge")
    message = refusal([{"instanceType": "p5en.48xlarge"}])
    assert "fleets.llm.fallback[0].instanceType='p5en.48xlarge': not the shape of p5e.48xlarge" in message
    assert message.endswith("allowed: p5.48xlarge, p5e.48xlarge")


def test_the_same_place_twice_is_refused():
    assert "the same place as the fleet's own" in refusal([{"availabilityZone": "us-west-2b"}])
    assert "the same place as fallback 1" in refusal(
        [{"availabilityZone": "us-west-2c"}, {"availabilityZone": "us-west-2c"}]
    )


def test_at_most_three_placements_in_the_stacks_region():
    many = [{"availabilityZone": f"us-west-2{z}"} for z in "acd"] + [{"instanceType": "p5.48xlarge"}]
    assert len(many) > MAX_FALLBACK and "at most 3" in refusal(many)
    assert "not in the stack's region" in refusal([{"availabilityZone": "eu-west-1a"}])


def test_fallback_azs_count_against_the_named_az_limit():
    fallback = [{"availabilityZone": f"us-west-2{z}"} for z in "acd"]
    message = refusal(fallback)
    assert f"at most {limits.MAX_NAMED_AZ_BLOCKS} named AZs" in message
    assert settings(fallback[:2]).network.fleet_availability_zones == ("us-west-2b", "us-west-2a", "us-west-2c")


def test_a_placement_in_a_shared_subnet_counts_at_its_largest():
    # 400 p5e nodes x 33 addresses = 13,200 each: two placements in us-west-2b do not fit one /18.
    message = refusal([{"instanceType": "p5.48xlarge"}], maxNodes=400)
    assert "fleet llm fallback 1" in message


def test_a_capacity_block_needs_its_window_type_and_az():
    fleet = settings([{"availabilityZone": "us-west-2a"} | BLOCK | WINDOW]).fleets[0]
    block = fleet.fallback[0]
    assert block.capacity_reservation.kind == "capacity-block"
    assert (block.window.start, block.window.end) == ("2026-12-01T11:30:00Z", "2026-12-08T11:30:00Z")
    assert "needs its window" in refusal([BLOCK | {"start": WINDOW["start"]}])
    assert "not after start" in refusal([BLOCK | {"start": WINDOW["end"], "end": WINDOW["start"]}])
    assert "only a capacity block has a window" in refusal([{"availabilityZone": "us-west-2a"} | WINDOW])
    # g6e.48xlarge is sold in no Capacity Block (EC2 user guide, "Capacity Blocks for ML").
    assert "g6e.48xlarge" not in CAPACITY_BLOCK_TYPES
    message = refusal([BLOCK | WINDOW], instanceType="g6e.48xlarge")
    assert "instanceType='g6e.48xlarge': EC2 sells no capacity blocks of this type" in message


def test_a_capacity_block_without_an_az_is_refused():
    llm = {"instanceType": "p5e.48xlarge", "fallback": [{"instanceType": "p5.48xlarge"} | BLOCK | WINDOW]}
    with pytest.raises(ConfigError, match="a capacity block lives in one AZ"):
        read_settings({"fleets": json.dumps({"llm": llm})}, region="us-west-2")


def test_unknown_fields_and_bad_values_name_the_field():
    assert "fleets.llm.fallback.0.zone" in refusal([{"zone": "us-west-2c"}])
    assert "capacityReservationId" in refusal([{"capacityReservationId": "cr-1"}])
    assert "needs capacityReservationId" in refusal([{"capacityReservationType": "odcr"}])


def test_a_fleet_without_fallback_has_only_its_own_placement():
    fleet = read_settings({}).fleets[0]
    assert fleet.fallback == () and len(fleet.placements) == 1


def test_routes_over_lambdas_environment_limit_are_refused_at_synth():
    # Lambda refuses more than 4 KB of environment variables at deploy (Lambda quotas); the estimate is
    # routes_document's own shape with queue ARNs of QUEUE_ARN_CHARS, so it is tied to what deploys.
    from types import SimpleNamespace

    from training_constructs.jobs.capacity_fallback.routes import FallbackRoute, routes_document

    def fleets(count: int) -> str:
        two_more = [{"availabilityZone": "us-west-2b"}, {"availabilityZone": "us-west-2c"}]
        spec = {"instanceType": "p5.48xlarge", "availabilityZone": "us-west-2a", "fallback": two_more}
        return json.dumps({f"f{i}": spec for i in range(count)})

    built = read_settings({"fleets": fleets(3)}).fleets
    routes = [
        FallbackRoute(
            fleet=f.name,
            placements=f.placements,
            queues=[SimpleNamespace(job_queue_arn=f"{f.name}-{n}".ljust(QUEUE_ARN_CHARS, "x")) for n in range(3)],
            job_definition_arns=(),
        )
        for f in built
    ]
    document = json.dumps(routes_document(routes), separators=(",", ":"))
    assert routes_bytes(built) == len(document) + len("ROUTES") < LAMBDA_ENVIRONMENT_BYTES
    with pytest.raises(ConfigError) as error:
        read_settings({"fleets": fleets(4)})
    assert str(error.value).startswith("context key fleets='8 fallback placements': the capacity fallback's routes")
    assert "Lambda's 4 KB environment" in str(error.value)


def own(**fleet: Any) -> Any:
    llm = {"instanceType": "p5e.48xlarge", "availabilityZone": "us-west-2b"} | fleet
    return read_settings({"fleets": json.dumps({"llm": llm})}, region="us-west-2").fleets[0]


def own_refusal(**fleet: Any) -> str:
    with pytest.raises(ConfigError) as refused:
        own(**fleet)
    message = str(refused.value)
    assert "\n" not in message and len(message) <= MAX_REFUSAL, message
    return message


def test_a_fleets_own_placement_may_be_a_block_with_its_window():
    fleet = own(**BLOCK, **WINDOW)
    placement = fleet.placements[0]
    assert placement.capacity_reservation.kind == "capacity-block"
    assert (placement.window.start, placement.window.end) == ("2026-12-01T11:30:00Z", "2026-12-08T11:30:00Z")
    assert (
        placement.label
        == "us-west-2b p5e.48xlarge cr-0a1b2c3d4e5f60718 (capacity-block 2026-12-01T11:30Z..2026-12-08T11:30Z)"
    )
    # Without a window, as before: the fleet's own block still deploys (and still gets its expiry stop).
    assert own(**BLOCK).placements[0].window is None


def test_a_fleets_own_window_is_checked_as_a_fallback_blocks():
    assert "fleets.llm.end=None: a capacity block needs its window" in own_refusal(**BLOCK, start=WINDOW["start"])
    assert "fleets.llm.end='2026-12-01T11:30Z': not after start" in own_refusal(
        **BLOCK, start=WINDOW["end"], end=WINDOW["start"]
    )
    message = own_refusal(capacityReservationId="cr-0a1b2c3d4e5f60718", **WINDOW)
    assert "fleets.llm.start='2026-12-01T11:30Z': only a capacity block has a window" in message
    assert "only a capacity block has a window" in own_refusal(**WINDOW)
    assert "EC2 sells no capacity blocks of this type" in own_refusal(instanceType="g6e.48xlarge", **BLOCK, **WINDOW)
    assert "fleets.llm.availabilityZone=None: a capacity block lives in one AZ" in own_refusal(
        availabilityZone=None, **BLOCK, **WINDOW
    )
    assert "fleets.llm.start" in own_refusal(**BLOCK, start="2026-12-01 11:30", end=WINDOW["end"])


def test_a_fleets_own_block_whose_window_ended_is_refused_at_synth():
    from datetime import UTC, datetime

    llm = {"instanceType": "p5e.48xlarge", "availabilityZone": "us-west-2b"} | BLOCK | WINDOW
    context = {"fleets": json.dumps({"llm": llm})}
    with pytest.raises(ConfigError, match=r"fleets\.llm\.end='2026-12-08T11:30:00Z': the Capacity Block's window"):
        read_settings(context, region="us-west-2", now=datetime(2026, 12, 8, 11, 30, tzinfo=UTC))
    assert read_settings(context, region="us-west-2", now=datetime(2026, 12, 8, 11, 29, tzinfo=UTC)).fleets
