"""`trainctl capacity buy` and `extend` against botocore's Stubber, which checks every request against the
installed EC2 service model: DryRun first, then the same purchase; a second buy of an offering buys nothing;
a fee the budget cannot hold is refused with the figures before any purchase; payment-failed is named; --write
edits cdk.json; the fee counts in the team's spend (budget_ledger fee_entry)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import typer
from botocore.stub import Stubber
from typer.testing import CliRunner

from budget_ledger import ledger
from config.placements import PlacementModel
from trainctl.aws import Aws
from trainctl.capacity import buying
from trainctl.capacity.block_placement import write_placement
from trainctl.commands import capacity_buy
from trainctl.commands.base import State
from trainctl.errors import TrainctlError

OFFERING = "cb-0123456789abcdef0"
RESERVATION = "cr-0a1b2c3d4e5f60718"
START = datetime(2026, 12, 30, 11, 30, tzinfo=UTC)
END = datetime(2027, 1, 2, 11, 30, tzinfo=UTC)  # 72 h: 36.5 in December, 35.5 in January
FEE = 7200.0
TYPE = "p5.48xlarge"
BUDGETS = ledger.Budgets(
    table="ledger", teams={"llama": 10000.0, "vision": 100.0}, default_team=None, fair_share=False,
    queues=(), timeout_seconds=3600,
)  # fmt: skip


class Table:
    """The ledger table: query by month partition and put_item, as boto3's Table answers them."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}

    def query(self, **request: Any) -> dict[str, Any]:
        month = request["ExpressionAttributeValues"][":m"]
        return {"Items": [i for (m, _), i in self.items.items() if m == month]}

    def put_item(self, Item: Mapping[str, Any]) -> None:
        self.items[(str(Item["month"]), str(Item["job"]))] = dict(Item)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def offering_item() -> dict[str, Any]:
    return {
        "CapacityBlockOfferingId": OFFERING, "InstanceType": TYPE, "AvailabilityZone": "us-east-1a",
        "InstanceCount": 2, "StartDate": START, "EndDate": END, "CapacityBlockDurationHours": 72,
        "UpfrontFee": f"{FEE:.2f}", "CurrencyCode": "USD",
    }  # fmt: skip


def reservation(state: str, *, tags: bool = True) -> dict[str, Any]:
    found: dict[str, Any] = {
        "CapacityReservationId": RESERVATION, "InstanceType": TYPE, "AvailabilityZone": "us-east-1a",
        "State": state, "StartDate": START, "EndDate": END, "TotalInstanceCount": 2,
    }  # fmt: skip
    if tags:
        found["Tags"] = [{"Key": buying.OFFERING_TAG, "Value": OFFERING}]
    return found


PURCHASE = {
    "CapacityBlockOfferingId": OFFERING,
    "InstancePlatform": "Linux/UNIX",
    "TagSpecifications": [
        {
            "ResourceType": "capacity-reservation",
            "Tags": [
                {"Key": "trainctl:offering", "Value": OFFERING},
                {"Key": "trainctl:team", "Value": "llama"},
                {"Key": "trainctl:fleet", "Value": "llm"},
            ],
        }
    ],
}
DESCRIBE_OFFERINGS = {
    "InstanceType": TYPE,
    "InstanceCount": 2,
    "CapacityDurationHours": 72,
    "AllAvailabilityZones": True,
}
BY_TYPE = {"Filters": [{"Name": "instance-type", "Values": [TYPE]}]}


@pytest.fixture(scope="module")
def client() -> Any:
    # One client for the module (its model loads once); each test stubs it afresh.
    return boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")  # noqa: S106 (a Stubber sends nothing)


@pytest.fixture
def ec2(client: Any) -> Iterator[tuple[Any, Stubber]]:
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def world(ec2: tuple[Any, Stubber], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The stubbed client and a ledger table behind the commands; budgets as a test sets them."""
    table = Table()
    world: dict[str, Any] = {"budgets": BUDGETS, "table": table}
    monkeypatch.setattr(Aws, "client", lambda self, service: ec2[0])
    monkeypatch.setattr(capacity_buy, "load_budgets", lambda aws: world["budgets"])
    monkeypatch.setattr(capacity_buy, "ledger_table", lambda aws, budgets: table)
    monkeypatch.setattr(capacity_buy, "sleep", lambda seconds: None)
    monkeypatch.setattr(capacity_buy, "_on_terminal", lambda: False)
    return world


def invoke(*args: str) -> Any:
    app = typer.Typer()
    capacity_buy.register(app)
    state = State(aws=Aws(region="us-east-1", profile=None), json_output=False)
    return CliRunner().invoke(app, list(args), obj=state)


BUY = ("buy", OFFERING, "--instance-type", TYPE, "--nodes", "2", "--days", "3", "--team", "llama", "--fleet", "llm")


def test_buy_dry_runs_then_buys_the_same_request_waits_and_records_the_fee(
    ec2: tuple[Any, Stubber], world: dict[str, Any], tmp_path: Path
) -> None:
    cdk = tmp_path / "cdk.json"
    cdk.write_text(json.dumps({"context": {"fleets": {"llm": {"instanceType": TYPE}}}}))
    _, stub = ec2
    stub.add_response(
        "describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering_item()]}, DESCRIBE_OFFERINGS
    )
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, BY_TYPE)
    stub.add_client_error(
        "purchase_capacity_block", "DryRunOperation", "would succeed", expected_params={**PURCHASE, "DryRun": True}
    )
    stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation("payment-pending")}, PURCHASE)
    ids = {"CapacityReservationIds": [RESERVATION]}
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [reservation("payment-pending")]}, ids)
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [reservation("scheduled")]}, ids)
    result = invoke(*BUY, "--yes", "--write", "--cdk-json", str(cdk))
    assert result.exit_code == 0, result.output
    assert f"{RESERVATION} is scheduled" in result.output
    placement = json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))
    assert placement == {
        "availabilityZone": "us-east-1a", "instanceType": TYPE, "capacityReservationId": RESERVATION,
        "capacityReservationType": "capacity-block", "start": "2026-12-30T11:30Z", "end": "2027-01-02T11:30Z",
    }  # fmt: skip
    # The entry is one the app's own placement reader takes as written.
    PlacementModel.model_validate(placement)
    assert json.loads(cdk.read_text()) == {
        "context": {"fleets": {"llm": {"instanceType": TYPE, "fallback": [placement]}}}
    }
    # The fee, split by the block's hours: 36.5 of 72 in December, 35.5 in January.
    table = world["table"]
    assert set(table.items) == {("2026-12", f"llama#{RESERVATION}"), ("2027-01", f"llama#{RESERVATION}")}
    now = int(START.timestamp() * 1000)
    december = ledger.team_spends(ledger.read_entries(table, "2026-12"), BUDGETS.teams, month="2026-12", now=now)
    january = ledger.team_spends(ledger.read_entries(table, "2027-01"), BUDGETS.teams, month="2027-01", now=now)
    assert december["llama"].spent == pytest.approx(FEE * 36.5 / 72)
    assert january["llama"].spent == pytest.approx(FEE * 35.5 / 72)
    assert december["vision"].spent == 0


def test_a_second_buy_of_the_offering_buys_nothing_and_counts_the_fee_once(
    ec2: tuple[Any, Stubber], world: dict[str, Any]
) -> None:
    _, stub = ec2
    other = {**reservation("active", tags=False), "CapacityReservationId": "cr-0ffffffffffffffff"}
    for _ in range(2):
        stub.add_response(
            "describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering_item()]}, DESCRIBE_OFFERINGS
        )
        stub.add_response(
            "describe_capacity_reservations", {"CapacityReservations": [other], "NextToken": "t"}, BY_TYPE
        )
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [reservation("active")]},
            {**BY_TYPE, "NextToken": "t"},
        )
        result = invoke(*BUY, "--yes")
        # No purchase is stubbed: a purchase call would fail the Stubber (exit 3).
        assert result.exit_code == 0, result.output
        assert f"bought already: {RESERVATION} is active; nothing bought" in result.output
    # An earlier buy whose wait ran out left the fee unrecorded: it is recorded now, once.
    table = world["table"]
    december = ledger.team_spends(ledger.read_entries(table, "2026-12"), BUDGETS.teams, month="2026-12", now=0)
    assert december["llama"].spent == pytest.approx(FEE * 36.5 / 72)


def test_a_fee_the_budget_cannot_hold_is_refused_with_the_figures(
    ec2: tuple[Any, Stubber], world: dict[str, Any]
) -> None:
    _, stub = ec2
    stub.add_response(
        "describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering_item()]}, DESCRIBE_OFFERINGS
    )
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, BY_TYPE)
    # January already carries $9,000 of llama's $10,000; the block puts $3,550 there.
    spent = ledger.fee_entry(
        team="llama", key="cr-0eeeeeeeeeeeeeeee", name="earlier", fleet="llm", instance_type=TYPE, count=1,
        usd=9000.0, window=(ms(datetime(2027, 1, 10, tzinfo=UTC)), ms(datetime(2027, 1, 11, tzinfo=UTC))),
    )  # fmt: skip
    world["table"].put_item(Item=spent.item("2027-01"))
    result = invoke(*BUY, "--yes")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "trainctl: budget: team llama has $1,000 of $10,000 left in January 2027; the fee puts $3,550 of its "
        "$7,200 there: a smaller or shorter block, or a bigger budget"
    )
    assert len(world["table"].items) == 1


def test_payment_failed_is_named_and_nothing_recorded(ec2: tuple[Any, Stubber], world: dict[str, Any]) -> None:
    _, stub = ec2
    stub.add_response(
        "describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering_item()]}, DESCRIBE_OFFERINGS
    )
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, BY_TYPE)
    stub.add_client_error(
        "purchase_capacity_block", "DryRunOperation", "ok", expected_params={**PURCHASE, "DryRun": True}
    )
    stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation("payment-pending")}, PURCHASE)
    stub.add_response(
        "describe_capacity_reservations",
        {"CapacityReservations": [reservation("payment-failed")]},
        {"CapacityReservationIds": [RESERVATION]},
    )
    result = invoke(*BUY, "--yes")
    assert result.exit_code == 3
    assert f"{RESERVATION}: payment-failed" in result.output
    assert world["table"].items == {}


def test_without_yes_off_a_terminal_nothing_is_bought(ec2: tuple[Any, Stubber], world: dict[str, Any]) -> None:
    _, stub = ec2
    stub.add_response(
        "describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering_item()]}, DESCRIBE_OFFERINGS
    )
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, BY_TYPE)
    result = invoke(*BUY)
    assert result.exit_code == 2
    assert "cannot be cancelled: pass --yes" in result.output


def test_a_no_at_the_terminal_buys_nothing(
    ec2: tuple[Any, Stubber], world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, stub = ec2
    monkeypatch.setattr(capacity_buy, "_on_terminal", lambda: True)
    stub.add_response(
        "describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering_item()]}, DESCRIBE_OFFERINGS
    )
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, BY_TYPE)
    app = typer.Typer()
    capacity_buy.register(app)
    state = State(aws=Aws(region="us-east-1", profile=None), json_output=False)
    result = CliRunner().invoke(app, list(BUY), obj=state, input="n\n")
    assert "for $7,200? It cannot be cancelled" in result.output
    assert result.exit_code == 2
    assert "trainctl: nothing bought" in result.output


def test_the_wait_is_bounded(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    for _ in range(3):
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [reservation("payment-pending")]},
            {"CapacityReservationIds": [RESERVATION]},
        )
    ticks = iter([0.0, 10.0, 20.0, 30.0])
    with pytest.raises(TrainctlError, match=r"still payment-pending after 0\.5 min"):
        buying.wait_settled(client, RESERVATION, sleep=lambda s: None, clock=lambda: next(ticks), limit_s=30)


def test_write_appends_the_block_to_the_fleets_fallback(tmp_path: Path) -> None:
    cdk = tmp_path / "cdk.json"
    own = {"availabilityZone": "us-east-1b"}
    cdk.write_text(json.dumps({"app": "x", "context": {"fleets": {"llm": {"instanceType": TYPE, "fallback": [own]}}}}))
    entry = {
        "availabilityZone": "us-east-1a",
        "capacityReservationId": RESERVATION,
        "capacityReservationType": "capacity-block",
    }
    said = write_placement(cdk, "llm", entry)
    assert json.loads(cdk.read_text()) == {
        "app": "x", "context": {"fleets": {"llm": {"instanceType": TYPE, "fallback": [own, entry]}}}
    }  # fmt: skip
    assert "fleets.llm.fallback[1]" in said and "LlmFallback2" in said
    again = write_placement(cdk, "llm", entry)
    assert "unchanged" in again
    assert len(json.loads(cdk.read_text())["context"]["fleets"]["llm"]["fallback"]) == 2


EXTENSION = "cbe-0123456789abcdef0"
EXT_END = datetime(2027, 1, 4, 11, 30, tzinfo=UTC)


def extension_offers() -> dict[str, Any]:
    def offer(offering: str, fee: str) -> dict[str, Any]:
        return {
            "CapacityBlockExtensionOfferingId": offering, "InstanceType": TYPE, "InstanceCount": 2,
            "AvailabilityZone": "us-east-1a", "CapacityBlockExtensionStartDate": END,
            "CapacityBlockExtensionEndDate": EXT_END, "CapacityBlockExtensionDurationHours": 48,
            "UpfrontFee": fee, "CurrencyCode": "USD",
        }  # fmt: skip

    return {"CapacityBlockExtensionOfferings": [offer("cbe-0ffffffffffffffff", "9000.00"), offer(EXTENSION, "4800.00")]}


EXTEND_QUERY = {"CapacityReservationId": RESERVATION, "CapacityBlockExtensionDurationHours": 48}
EXTEND = {"CapacityBlockExtensionOfferingId": EXTENSION, "CapacityReservationId": RESERVATION}


def test_extend_dry_runs_then_buys_the_cheapest_and_records_it(ec2: tuple[Any, Stubber], world: dict[str, Any]) -> None:
    _, stub = ec2
    stub.add_response("describe_capacity_block_extension_offerings", extension_offers(), EXTEND_QUERY)
    stub.add_client_error(
        "purchase_capacity_block_extension", "DryRunOperation", "ok", expected_params={**EXTEND, "DryRun": True}
    )
    stub.add_response(
        "purchase_capacity_block_extension",
        {
            "CapacityBlockExtensions": [
                {"CapacityReservationId": RESERVATION, "CapacityBlockExtensionStatus": "payment-pending"}
            ]
        },
        EXTEND,
    )
    result = invoke("extend", RESERVATION, "--days", "2", "--team", "llama", "--yes")
    assert result.exit_code == 0, result.output
    assert "extended cr-0a1b2c3d4e5f60718 to 2027-01-04T11:30Z for $4,800" in result.output
    spend = ledger.team_spends(ledger.read_entries(world["table"], "2027-01"), BUDGETS.teams, month="2027-01", now=0)
    assert spend["llama"].spent == pytest.approx(4800.0)


def test_extend_refused_by_the_budget_buys_nothing(ec2: tuple[Any, Stubber], world: dict[str, Any]) -> None:
    _, stub = ec2
    stub.add_response("describe_capacity_block_extension_offerings", extension_offers(), EXTEND_QUERY)
    result = invoke("extend", RESERVATION, "--hours", "48", "--team", "vision", "--yes")
    assert result.exit_code == 2
    assert (
        "budget: team vision has $100 of $100 left in January 2027; the fee puts $4,800 of its $4,800" in result.output
    )
    assert world["table"].items == {}


def test_dry_run_purchase_refused_by_ec2_is_one_line(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_client_error("purchase_capacity_block_extension", "InvalidParameterValue", "offering expired\nmore")
    with pytest.raises(TrainctlError) as raised:
        buying.dry_run(client.purchase_capacity_block_extension, EXTEND, "the extension")
    assert (
        raised.value.message
        == "EC2 would refuse the extension (InvalidParameterValue: offering expired); nothing bought"
    )


def test_a_deployment_without_budgets_is_not_checked(ec2: tuple[Any, Stubber], world: dict[str, Any]) -> None:
    _, stub = ec2
    world["budgets"] = None
    stub.add_response("describe_capacity_block_extension_offerings", extension_offers(), EXTEND_QUERY)
    stub.add_client_error(
        "purchase_capacity_block_extension", "DryRunOperation", "ok", expected_params={**EXTEND, "DryRun": True}
    )
    result = invoke("extend", RESERVATION, "--days", "2", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "no budgets in this deployment" in result.output
    assert "dry run: EC2 would sell" in result.output


def test_a_fee_entry_is_closed_and_needs_a_window() -> None:
    # Closed: the ledger function's reconcile, which closes running entries Batch shows ended, never touches it.
    entry = ledger.fee_entry(
        team="llama", key=RESERVATION, name="block", fleet="llm", instance_type=TYPE, count=2, usd=FEE,
        window=(ms(START), ms(END)),
    )  # fmt: skip
    assert not entry.running
    assert ledger.months_touched(entry.spans, now=0) == ["2026-12", "2027-01"]
    with pytest.raises(ValueError, match="a fee needs instances and a window"):
        ledger.fee_entry(
            team="llama", key=RESERVATION, name="block", fleet="llm", instance_type=TYPE, count=2, usd=FEE,
            window=(ms(START), ms(START)),
        )  # fmt: skip
