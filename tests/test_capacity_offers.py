"""`trainctl capacity offers` and `list` against botocore's Stubber (requests checked against the installed
EC2 model) with a frozen clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from typer.testing import CliRunner

from trainctl.aws import Aws
from trainctl.capacity.blocks import list_blocks
from trainctl.capacity.offers import find_offerings
from trainctl.capacity.rules import GRID_DAYS, OfferSearch, check_search
from trainctl.cli import app
from trainctl.commands import base, capacity
from trainctl.deployment import Deployment, Fleet, PlacementRef
from trainctl.errors import TrainctlError

NOW = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


def ec2() -> Any:
    return boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")  # noqa: S106


def offering(oid: str, itype: str, az: str, count: int, start: datetime, hours: int, fee: str) -> dict[str, Any]:
    return {
        "CapacityBlockOfferingId": oid,
        "InstanceType": itype,
        "AvailabilityZone": az,
        "InstanceCount": count,
        "StartDate": start,
        "EndDate": start + timedelta(hours=hours),
        "CapacityBlockDurationHours": hours,
        "CapacityBlockDurationMinutes": 0,
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
    }


def search(*types: str, **extra: Any) -> OfferSearch:
    values: dict[str, Any] = {"nodes": 2, "days": 2, "hours": None, "start_after": None, "start_before": None}
    values.update(extra)
    return check_search(instance_types=list(types), all_zones=False, now=NOW, **values)


START = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)


def test_offers_across_two_types_are_sorted_per_accelerator_hour() -> None:
    client = ec2()
    # p5: 2 x 8 GPUs x 48 h = 768 GPU-hours; trn2: 2 x 16 Trainium x 48 h = 1536 accelerator-hours.
    p5_dear = offering("cb-p5dear", "p5.48xlarge", "us-east-1a", 2, START, 48, "23040.00")  # 30.00 / GPU-h
    p5_cheap = offering("cb-p5cheap", "p5.48xlarge", "us-east-1b", 2, START, 48, "7680.00")  # 10.00 / GPU-h
    trn2 = offering("cb-trn2", "trn2.48xlarge", "us-east-1c", 2, START, 48, "23040.00")  # 15.00 / accel-h
    with Stubber(client) as stub:
        request = {"InstanceCount": 2, "CapacityDurationHours": 48, "MaxResults": 1000}
        stub.add_response(
            "describe_capacity_block_offerings",
            {"CapacityBlockOfferings": [p5_dear, p5_cheap]},
            {**request, "InstanceType": "p5.48xlarge"},
        )
        stub.add_response(
            "describe_capacity_block_offerings",
            {"CapacityBlockOfferings": [trn2]},
            {**request, "InstanceType": "trn2.48xlarge"},
        )
        found = find_offerings(client, search("p5.48xlarge", "trn2.48xlarge"))
        stub.assert_no_pending_responses()
    assert [o.offering_id for o in found] == ["cb-p5cheap", "cb-trn2", "cb-p5dear"]
    assert [o.per_accelerator_hour for o in found] == [Decimal(10), Decimal(15), Decimal(30)]
    assert found[1].accelerator_word == "accelerator" and found[0].accelerator_word == "GPU"


def test_offers_read_every_page_and_keep_starts_inside_the_range() -> None:
    client = ec2()
    before = START + timedelta(days=3)
    first = offering("cb-1", "p5.48xlarge", "us-east-1a", 2, START, 48, "9000")
    late = offering("cb-late", "p5.48xlarge", "us-east-1a", 2, before + timedelta(days=1), 48, "100")
    second = offering("cb-2", "p5.48xlarge", "us-east-1b", 2, START + timedelta(days=1), 48, "8000")
    request = {
        "InstanceType": "p5.48xlarge",
        "InstanceCount": 2,
        "CapacityDurationHours": 48,
        "MaxResults": 1000,
        "StartDateRange": START,
        # The API bounds the end: the latest start plus the duration and a day for the 11:30 alignment.
        "EndDateRange": before + timedelta(hours=48 + 24),
    }
    with Stubber(client) as stub:
        stub.add_response(
            "describe_capacity_block_offerings", {"CapacityBlockOfferings": [first], "NextToken": "t1"}, request
        )
        stub.add_response(
            "describe_capacity_block_offerings",
            {"CapacityBlockOfferings": [late, second]},
            {**request, "NextToken": "t1"},
        )
        found = find_offerings(client, search("p5.48xlarge", start_after=START, start_before=before))
        stub.assert_no_pending_responses()
    assert [o.offering_id for o in found] == ["cb-2", "cb-1"]


def test_all_zones_asks_ec2_for_every_zone_and_zones_narrow_otherwise() -> None:
    client = ec2()
    items = [
        offering("cb-a", "p5.48xlarge", "us-east-1a", 2, START, 48, "9000"),
        offering("cb-b", "p5.48xlarge", "us-east-1b", 2, START, 48, "8000"),
    ]
    base_request = {"InstanceType": "p5.48xlarge", "InstanceCount": 2, "CapacityDurationHours": 48, "MaxResults": 1000}
    with Stubber(client) as stub:
        stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": items}, base_request)
        narrowed = find_offerings(client, search("p5.48xlarge"), frozenset({"us-east-1a"}))
        stub.add_response(
            "describe_capacity_block_offerings",
            {"CapacityBlockOfferings": items},
            {**base_request, "AllAvailabilityZones": True},
        )
        wide = find_offerings(client, OfferSearch(instance_types=("p5.48xlarge",), nodes=2, hours=48, all_zones=True))
        stub.assert_no_pending_responses()
    assert [o.offering_id for o in narrowed] == ["cb-a"]
    assert [o.offering_id for o in wide] == ["cb-b", "cb-a"]


def test_the_duration_grid() -> None:
    assert GRID_DAYS[:14] == tuple(range(1, 15))
    assert GRID_DAYS[14:16] == (21, 28) and GRID_DAYS[-1] == 182
    assert search("p5.48xlarge", days=None, hours=336).hours == 336
    assert search("p5.48xlarge", days=26 * 7).hours == 4368


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"days": 15}, "--days 15 is not a Capacity Block duration"),
        ({"days": 0}, "--days 0"),
        ({"days": 189}, "--days 189"),
        ({"days": None, "hours": 36}, "--hours 36"),
        ({"days": None, "hours": 360}, "--hours 360"),
        ({"days": 2, "hours": 48}, "exactly one of --days or --hours"),
        ({"days": None}, "exactly one of --days or --hours"),
        ({"nodes": 65}, "--nodes 65: a Capacity Block holds 1 to 64"),
        ({"nodes": 0}, "--nodes 0"),
        ({"start_before": NOW + timedelta(weeks=8, minutes=1)}, "beyond 8 weeks from now"),
        ({"start_after": NOW + timedelta(weeks=9)}, "--start-after 2027-01-30 09:00Z is beyond 8 weeks"),
        ({"start_after": START + timedelta(days=2), "start_before": START}, "is later than --start-before"),
    ],
)
def test_values_ec2_would_refuse_are_refused_in_one_line(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(TrainctlError) as caught:
        search("p5.48xlarge", **extra)
    assert words in caught.value.message and "\n" not in caught.value.message


def test_the_horizon_edge_is_allowed_with_the_frozen_clock() -> None:
    assert search("p5.48xlarge", start_before=NOW + timedelta(weeks=8)).start_before == NOW + timedelta(weeks=8)


@pytest.mark.parametrize("name", ["m5.large", "g6e.48xlarge", "p5.4xlarge"])
def test_a_type_ec2_sells_no_blocks_of_is_refused(name: str) -> None:
    with pytest.raises(
        TrainctlError, match=rf"--instance-type {name}: EC2 sells no Capacity Blocks of it; it does of p4d"
    ):
        search("p5.48xlarge", name)


# ------------------------------------------------------------------------------------------- the commands
@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs trainctl with the clock frozen, no deployment, and `client` as EC2 (None: any call fails)."""
    holder: dict[str, Any] = {"ec2": None, "deployment": None}

    def client(self: Aws, service: str) -> Any:
        assert service == "ec2" and holder["ec2"] is not None, f"unexpected call to {service}"
        return holder["ec2"]

    def deployment(self: base.State) -> Deployment:
        if holder["deployment"] is None:
            raise TrainctlError("no stacks")
        return holder["deployment"]  # type: ignore[no-any-return]

    monkeypatch.setattr(Aws, "client", client)
    monkeypatch.setattr(base.State, "deployment", deployment)
    monkeypatch.setattr(capacity, "now", lambda: NOW)

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, ["--region", "us-east-1", *args])

    run.holder = holder  # type: ignore[attr-defined]
    return run


def test_a_refused_value_makes_no_call_and_exits_2(cli: Any) -> None:
    result = cli("capacity", "offers", "--instance-type", "p5.48xlarge", "--nodes", "2", "--days", "16")
    assert result.exit_code == 2
    assert result.output.strip().startswith("trainctl: --days 16 is not a Capacity Block duration")


def test_offers_json_output(cli: Any) -> None:
    client = ec2()
    cli.holder["ec2"] = client
    item = offering("cb-p5", "p5.48xlarge", "us-east-1a", 1, START, 24, "1920.00")
    with Stubber(client) as stub:
        stub.add_response(
            "describe_capacity_block_offerings",
            {"CapacityBlockOfferings": [item]},
            {"InstanceType": "p5.48xlarge", "InstanceCount": 1, "CapacityDurationHours": 24, "MaxResults": 1000},
        )
        result = cli(
            "capacity", "offers", "--instance-type", "p5.48xlarge", "--nodes", "1", "--days", "1", "-o", "json"
        )
        stub.assert_no_pending_responses()
    assert result.exit_code == 0, result.output
    [shown] = json.loads(result.stdout)
    assert shown["offeringId"] == "cb-p5" and shown["availabilityZone"] == "us-east-1a"
    assert shown["start"] == "2026-12-01T11:30:00+00:00" and shown["end"] == "2026-12-02T11:30:00+00:00"
    # 1920 USD / (1 x 8 GPUs x 24 h)
    assert shown["pricePerAcceleratorHour"] == "10.0000" and shown["upfrontFee"] == "1920.00"


def test_offers_none_found_says_so(cli: Any) -> None:
    client = ec2()
    cli.holder["ec2"] = client
    with Stubber(client) as stub:
        stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []})
        result = cli("capacity", "offers", "--instance-type", "p5.48xlarge", "--nodes", "1", "--days", "1")
    assert result.exit_code == 0
    assert "no Capacity Block offerings for 1 x p5.48xlarge for 24 h" in result.output


def block(bid: str, reservation: str, start: datetime, state: str = "scheduled") -> dict[str, Any]:
    return {
        "CapacityBlockId": bid,
        "AvailabilityZone": "us-east-1a",
        "CapacityReservationIds": [reservation],
        "StartDate": start,
        "EndDate": start + timedelta(days=2),
        "State": state,
    }


def deployment_using(reservation: str) -> Deployment:
    label = f"us-east-1a p5.48xlarge {reservation} (capacity-block 2026-12-01T11:30Z..2026-12-03T11:30Z)"
    placements = (
        PlacementRef(label="us-east-1b p5.48xlarge", queue="arn:aws:batch:us-east-1:1:job-queue/q0"),
        PlacementRef(label=label, queue="arn:aws:batch:us-east-1:1:job-queue/q1"),
    )
    fleet = Fleet(
        name="llm",
        job_queue="q0",
        training_definition="t",
        benchmark_definition="b",
        log_group="g",
        placements=placements,
    )
    return Deployment(region="us-east-1", fleets={"llm": fleet}, checkpoint_bucket=None)


def reservation(rid: str, count: int, available: int, rtype: str = "capacity-block", **extra: Any) -> dict[str, Any]:
    return {
        "CapacityReservationId": rid,
        "InstanceType": "p5.48xlarge",
        "TotalInstanceCount": count,
        "AvailableInstanceCount": available,
        "ReservationType": rtype,
        **extra,
    }


def test_list_shows_utilisation_and_the_placement_using_a_block() -> None:
    client = ec2()
    used, unused, alone = "cr-0123456789abcdef0", "cr-0fedcba9876543210", "cr-0aaaaaaaaaaaaaaa1"
    later = START + timedelta(days=7)
    with Stubber(client) as stub:
        stub.add_response(
            "describe_capacity_blocks",
            {"CapacityBlocks": [block("cb-later", unused, later), block("cb-used", used, START, "active")]},
            {},
        )
        stub.add_response(
            "describe_capacity_block_status",
            {
                "CapacityBlockStatuses": [
                    {"CapacityBlockId": "cb-used", "TotalCapacity": 4, "TotalAvailableCapacity": 1},
                    {"CapacityBlockId": "cb-later", "TotalCapacity": 2, "TotalAvailableCapacity": 2},
                ]
            },
            {"CapacityBlockIds": ["cb-later", "cb-used"]},
        )
        stub.add_response(
            "describe_capacity_reservations",
            {
                "CapacityReservations": [
                    reservation(unused, 2, 2),
                    reservation(used, 4, 1),
                    # A capacity-block reservation no block names is a block of its own; an ODCR is not.
                    reservation(alone, 8, 2, State="scheduled", AvailabilityZone="us-east-1c", StartDate=later),
                    reservation("cr-0bbbbbbbbbbbbbbb2", 1, 1, "default"),
                ],
                "NextToken": "r1",
            },
            {},
        )
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, {"NextToken": "r1"})
        blocks = list_blocks(client, deployment_using(used))
        stub.assert_no_pending_responses()
    # Earliest start first; the same start in id order.
    assert [b.block_id for b in blocks] == ["cb-used", "cb-later", alone]
    assert blocks[0].used_by == ("llm placement 1",) and blocks[1].used_by == () and blocks[2].used_by == ()
    assert [b.utilisation for b in blocks] == ["3/4 (75%)", "0/2 (0%)", "6/8 (75%)"]
    assert (blocks[0].state, blocks[0].instance_type, blocks[0].instance_count) == ("active", "p5.48xlarge", 4)
    assert (blocks[2].state, blocks[2].availability_zone, blocks[2].instance_count) == ("scheduled", "us-east-1c", 8)


def test_list_with_no_blocks_says_so(cli: Any) -> None:
    client = ec2()
    cli.holder["ec2"] = client
    with Stubber(client) as stub:
        stub.add_response("describe_capacity_blocks", {"CapacityBlocks": []}, {})
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, {})
        result = cli("capacity", "list")
        stub.assert_no_pending_responses()
    assert result.exit_code == 0
    assert "no Capacity Blocks in this region" in result.output
    with Stubber(client) as stub:
        stub.add_response("describe_capacity_blocks", {"CapacityBlocks": []}, {})
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, {})
        result = cli("capacity", "list", "-o", "json")
    assert json.loads(result.stdout) == []


def test_offers_table_shows_price_per_gpu_and_per_accelerator_hour_cheapest_first(cli: Any) -> None:
    client = ec2()
    cli.holder["ec2"] = client
    p5 = offering("cb-p5", "p5.48xlarge", "us-east-1a", 1, START, 24, "4800.00")  # 25 / GPU-h
    trn2 = offering("cb-trn2", "trn2.48xlarge", "us-east-1b", 1, START, 24, "3840.00")  # 10 / accelerator-h
    with Stubber(client) as stub:
        stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [p5]})
        stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [trn2]})
        result = cli(
            "capacity", "offers", "--instance-type", "p5.48xlarge", "--instance-type", "trn2.48xlarge",
            "--nodes", "1", "--hours", "24",
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "cb-" in line]
    assert len(lines) == 2 and "cb-trn2" in lines[0] and "cb-p5" in lines[1]
    assert "10.0000 /accelerator-h" in lines[0] and "25.0000 /GPU-h" in lines[1]
    assert "3,840.00 USD" in lines[0] and "2026-12-01 11:30Z" in lines[0] and "2026-12-02 11:30Z" in lines[0]


def test_deployment_zones_come_from_placements_of_the_searched_types() -> None:
    deployment = deployment_using("cr-0123456789abcdef0")
    assert capacity.deployment_zones(deployment, ("p5.48xlarge",)) == frozenset({"us-east-1a", "us-east-1b"})
    assert capacity.deployment_zones(deployment, ("trn2.48xlarge",)) is None
    assert capacity.deployment_zones(None, ("p5.48xlarge",)) is None
