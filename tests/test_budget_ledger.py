"""The budget ledger's arithmetic (budget_ledger/ledger.py) on hand-computed cases, and the budgets keys'
refusals (config/budgets.py). Every expected figure below is worked out in its comment."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from budget_ledger.ledger import (
    REASON_PREFIX,
    Entry,
    Estimate,
    dollars,
    month_bounds,
    months_touched,
    refusal,
    spans_of,
    team_of,
    team_spends,
)
from config.context import ConfigError, read_settings


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


NOVEMBER = month_bounds("2026-11")
DECEMBER = month_bounds("2026-12")


def entry(team: str, job: str, spans: list[tuple[str, str | None]], *, nodes: int, usd: float, **kw: Any) -> Entry:
    return Entry(
        team=team,
        job_id=job,
        job_name=job,
        fleet=kw.get("fleet", "gpu"),
        instance_type=kw.get("instance_type", "p5.48xlarge"),
        nodes=nodes,
        usd_per_hour=usd,
        spans=tuple((ms(a), ms(b) if b else None) for a, b in spans),
        progress=kw.get("progress", 2),
    )


def test_month_bounds_are_utc_and_december_rolls_into_the_next_year() -> None:
    assert (ms("2026-11-01T00:00:00"), ms("2026-12-01T00:00:00")) == NOVEMBER
    assert (ms("2026-12-01T00:00:00"), ms("2027-01-01T00:00:00")) == DECEMBER
    # 30 days of 24 hours.
    assert (NOVEMBER[1] - NOVEMBER[0]) / 3_600_000 == 720


def test_a_multi_attempt_job_counts_every_attempt() -> None:
    # DescribeJobs of a job retried once, now SUCCEEDED: attempt 1 10:00-10:30 (0.5 h), attempt 2
    # 11:00-12:15 (1.25 h): 1.75 h x 4 nodes x $55.04 = $385.28.
    detail = {
        "status": "SUCCEEDED",
        "attempts": [
            {"startedAt": ms("2026-11-10T10:00:00"), "stoppedAt": ms("2026-11-10T10:30:00")},
            {"startedAt": ms("2026-11-10T11:00:00"), "stoppedAt": ms("2026-11-10T12:15:00")},
        ],
        "startedAt": ms("2026-11-10T11:00:00"),
        "stoppedAt": ms("2026-11-10T12:15:00"),
    }
    spans = spans_of(detail)
    assert len(spans) == 2
    assert dollars(spans, nodes=4, usd_per_hour=55.04, window=NOVEMBER, now=ms("2026-11-20T00:00:00")) == (
        pytest.approx(385.28)
    )


def test_a_running_attempt_accrues_until_now_after_a_failed_one() -> None:
    # Attempt 1 failed after 1 h; attempt 2 RUNNING since 14:00, now 14:30: 1.5 h x 2 x $10 = $30.
    detail = {
        "status": "RUNNING",
        "attempts": [{"startedAt": ms("2026-11-10T12:00:00"), "stoppedAt": ms("2026-11-10T13:00:00")}],
        "startedAt": ms("2026-11-10T14:00:00"),
    }
    spans = spans_of(detail)
    assert spans[-1] == (ms("2026-11-10T14:00:00"), None)
    now = ms("2026-11-10T14:30:00")
    assert dollars(spans, nodes=2, usd_per_hour=10, window=NOVEMBER, now=now) == pytest.approx(30)


def test_a_job_across_midnight_at_the_months_end_counts_in_both_months() -> None:
    # 2 nodes at $10 from Nov 30 22:00 to Dec 1 03:00: November 2 h -> $40, December 3 h -> $60.
    spans = [(ms("2026-11-30T22:00:00"), ms("2026-12-01T03:00:00"))]
    now = ms("2026-12-02T00:00:00")
    assert months_touched(spans, now) == ["2026-11", "2026-12"]
    assert dollars(spans, nodes=2, usd_per_hour=10, window=NOVEMBER, now=now) == pytest.approx(40)
    assert dollars(spans, nodes=2, usd_per_hour=10, window=DECEMBER, now=now) == pytest.approx(60)
    # Still running at 01:00 on Dec 1: December has accrued 1 h -> $20.
    running = [(ms("2026-11-30T22:00:00"), None)]
    assert dollars(running, nodes=2, usd_per_hour=10, window=DECEMBER, now=ms("2026-12-01T01:00:00")) == 20


def test_several_fleets_with_their_own_prices_and_a_running_job_forecast() -> None:
    now = ms("2026-11-20T00:00:00")
    entries = [
        # g6.12xlarge on demand: 2 nodes x 3 h x $4.6016 = $27.6096.
        entry("llama", "a", [("2026-11-02T00:00:00", "2026-11-02T03:00:00")], nodes=2, usd=4.6016),
        # A reservation's price for fleet llm: 16 nodes x 0.5 h x $31.50 = $252.
        entry("llama", "b", [("2026-11-03T00:00:00", "2026-11-03T00:30:00")], nodes=16, usd=31.5, fleet="llm"),
        # Running since 22:00 the day before: 2 h x 4 nodes x $10 = $80 accruing, $40 an hour.
        entry("llama", "c", [("2026-11-19T22:00:00", None)], nodes=4, usd=10, progress=1),
        # October's job and another team's: not llama's November.
        entry("llama", "d", [("2026-10-02T00:00:00", "2026-10-02T03:00:00")], nodes=2, usd=10),
        entry("vision", "e", [("2026-11-02T00:00:00", "2026-11-02T01:00:00")], nodes=1, usd=100),
    ]
    spends = team_spends(entries, {"llama": 1000.0, "vision": 50.0}, month="2026-11", now=now)
    llama = spends["llama"]
    assert llama.spent == pytest.approx(279.6096)
    assert llama.accruing == pytest.approx(80)
    assert llama.rate == pytest.approx(40)
    assert llama.remaining == pytest.approx(1000 - 359.6096)
    # Eleven days left in November (Nov 20 00:00 to Dec 1 00:00, 264 h) at $40 an hour: 359.6096 + 10,560.
    assert llama.forecast == pytest.approx(10919.6096)
    assert spends["vision"].spent == 100 and spends["vision"].remaining == -50


def test_the_entry_that_knows_most_wins_over_a_stale_running_one() -> None:
    # The RUNNING partition still holds the job's open attempt (progress 1) while its month holds the
    # ended attempt (progress 3): counted once, as ended, 1 h x 1 x $10.
    now = ms("2026-11-10T05:00:00")
    stale = entry("llama", "a", [("2026-11-10T01:00:00", None)], nodes=1, usd=10, progress=1)
    ended = entry("llama", "a", [("2026-11-10T01:00:00", "2026-11-10T02:00:00")], nodes=1, usd=10, progress=3)
    spend = team_spends([stale, ended], {"llama": 100.0}, month="2026-11", now=now)["llama"]
    assert (spend.spent, spend.accruing, spend.rate) == (10, 0, 0)


def test_the_refusal_line_carries_the_figures() -> None:
    now = ms("2026-11-20T00:00:00")
    used = entry("llama", "a", [("2026-11-02T00:00:00", "2026-11-02T10:00:00")], nodes=1, usd=1876)
    spend = team_spends([used], {"llama": 20000.0}, month="2026-11", now=now)["llama"]
    # 16 x $55.04 x 4 h = $3,522.56 > $20,000 - $18,760 = $1,240.
    line = refusal(spend, Estimate(nodes=16, instance_type="p5.48xlarge", usd_per_hour=55.04, hours=4))
    assert line == (
        "budget: team llama has $1,240 of $20,000 left in November 2026; this job may cost up to $3,523 "
        "(16 x p5.48xlarge x 4 h): fewer nodes, a shorter --timeout/--hours, or a bigger budget"
    )
    assert line.startswith(REASON_PREFIX)  # how `trainctl why` knows a budget reason
    assert refusal(spend, Estimate(nodes=2, instance_type="p5.48xlarge", usd_per_hour=55.04, hours=4)) is None


def test_every_attempt_counts_in_the_estimate() -> None:
    # 16 x $55.04 x 4 h x 2 attempts = $7,045.12: Batch bills each attempt up to its timeout.
    twice = Estimate(nodes=16, instance_type="p5.48xlarge", usd_per_hour=55.04, hours=4, attempts=2)
    assert twice.most == pytest.approx(7045.12)
    assert twice.shape() == "16 x p5.48xlarge x 4 h x 2 attempts"


def test_the_refusal_stays_one_short_line_with_a_long_team_name_and_a_sweep() -> None:
    team = "t" * 64
    now = ms("2026-09-20T00:00:00")
    used = entry(team, "a", [("2026-09-02T00:00:00", "2026-09-02T10:00:00")], nodes=1, usd=999_000)
    spend = team_spends([used], {team: 9_999_999.0}, month="2026-09", now=now)[team]
    sweep = Estimate(nodes=512, instance_type="p5en.48xlarge", usd_per_hour=84.8, hours=720, jobs=99, attempts=10)
    line = refusal(spend, sweep)
    assert line is not None and len(line) <= 200 and "\n" not in line
    # The figures and the remedy stay; the month and the shape give way.
    assert line.startswith(f"budget: team {team}: $9,999 of $9,999,999 left, job up to $30,948,065,280; ")
    assert line.endswith("fewer nodes, a shorter --timeout/--hours, or a bigger budget")


def test_a_job_belongs_to_its_share_its_tag_or_the_default_team() -> None:
    teams = ["llama", "sweep*"]
    assert team_of({"shareIdentifier": "llama"}, teams=teams, default_team=None, fair_share=True) == "llama"
    assert team_of({"shareIdentifier": "sweep42"}, teams=teams, default_team=None, fair_share=True) == "sweep*"
    assert team_of({"shareIdentifier": "vision"}, teams=teams, default_team=None, fair_share=True) is None
    fifo = {"teams": ["llama", "vision"], "default_team": "llama", "fair_share": False}
    assert team_of({"tags": {"trainctl:team": "vision"}}, **fifo) == "vision"
    assert team_of({}, **fifo) == "llama"
    assert team_of({"tags": {"trainctl:team": "nobody"}}, **fifo) is None


def test_on_fair_share_queues_a_share_without_a_budget_is_refused_like_a_fifo_job_of_no_team() -> None:
    from budget_ledger.ledger import Budgets, unknown_team

    shared = Budgets(
        table="t", teams={"llama": 100.0, "sweep*": 50.0}, default_team=None, fair_share=True, queues=(),
        timeout_seconds=3600, check_definitions=("arn:aws:batch:us-east-1:1:job-definition/gpu-benchmark:3",),
    )  # fmt: skip
    assert unknown_team({"shareIdentifier": "robotics"}, shared) == (
        "budget: share robotics has no budget; the teams are llama, sweep*"
    )
    assert unknown_team({}, shared) == "budget: no share identifier; the teams are llama, sweep*"
    assert unknown_team({"shareIdentifier": "llama"}, shared) is None
    assert unknown_team({"shareIdentifier": "sweep7"}, shared) is None
    check = {"jobDefinition": "arn:aws:batch:us-east-1:1:job-definition/gpu-benchmark:3"}
    # A fleet check, once the caller found it run as its definition says, counts against no budget; the
    # definition's ARN alone does not make one.
    assert unknown_team(check, shared, fleet_check=True) is None
    assert unknown_team(check, shared) == "budget: no share identifier; the teams are llama, sweep*"


# ------------------------------------------------------------------------------------------- the keys
def refused(**context: str) -> str:
    with pytest.raises(ConfigError) as caught:
        read_settings(context)
    line = str(caught.value)
    assert "\n" not in line and len(line) <= 200
    return line


def test_budgets_are_read_with_each_fleets_price() -> None:
    settings = read_settings(
        {
            "shares": "llama:2,vision:1",
            "budgets": json.dumps({"llama": 20000, "vision": 5000.5}),
            "gpuInstanceType": "p5e.48xlarge",
            "budgetPrices": json.dumps({"gpu": 31.5}),
        }
    )
    budgets = settings.jobs.budgets
    assert budgets is not None and budgets.fair_share
    assert [(t.team, t.monthly_usd) for t in budgets.teams] == [("llama", 20000), ("vision", 5000.5)]
    assert budgets.price("gpu", "p5e.48xlarge") == 31.5
    assert budgets.price("trainium", "trn1.32xlarge") == 21.5  # config/prices.py's on-demand figure
    assert read_settings({}).jobs.budgets is None


def test_outside_us_east_1_every_fleet_needs_its_price_given() -> None:
    budgets = '{"llama": 20000}'
    for region in ("eu-west-1", "cn-north-1"):
        with pytest.raises(ConfigError) as refusal:
            read_settings({"budgets": budgets, "budgetPrices": '{"gpu": 12}'}, region=region)
        line = str(refusal.value)
        assert "\n" not in line and f"the stack's region is {region}" in line
        assert line.endswith('allowed: budgetPrices {"trainium": N}, N per instance-hour')  # gpu's was given
    given = read_settings({"budgets": budgets, "budgetPrices": '{"gpu": 12, "trainium": 30}'}, region="eu-west-1")
    assert given.jobs.budgets is not None and given.jobs.budgets.price("trainium", "trn1.32xlarge") == 30
    # us-east-1, or a synth that knows no region: config/prices.py's figures stand.
    for region in ("us-east-1", None):
        assert read_settings({"budgets": budgets}, region=region).jobs.budgets is not None


def test_budgets_that_would_not_fit_lambdas_environment_are_refused() -> None:
    # Lambda takes 4 KB of environment per function; each placement's queue ARN and each fleet's
    # benchmark definition ARN (the fleet checks, exempt from naming a team) are in the document.
    fleets = json.dumps({f"f{i}": {"instanceType": "g6.12xlarge"} for i in range(12)})
    assert "of Lambda's 4 KB environment (12 queues)" in refused(fleets=fleets, budgets='{"llama": 1}')
    eleven = json.dumps({f"f{i}": {"instanceType": "g6.12xlarge"} for i in range(11)})
    assert read_settings({"fleets": eleven, "budgets": '{"llama": 1}'}).jobs.budgets is not None


@pytest.mark.parametrize(
    ("context", "says"),
    [
        ({"shares": "llama:2", "budgets": '{"lama": 100}'}, "budgets.lama=100: unknown share"),
        ({"budgets": '{"llama": -5}'}, "budgets.llama=-5: out of range"),
        ({"budgets": '{"llama": "$20,000"}'}, "budgets.llama='$20,000': not a number"),
        ({"budgets": '{"llama": true}'}, "not a number"),
        ({"budgets": '{"a team": 1}'}, "malformed team name"),
        ({"budgets": "[1]"}, "not a JSON object"),
        ({"budgetPrices": '{"gpu": 1}'}, "budgetPrices={'gpu': 1}: only with budgets"),
        ({"budgets": '{"x": 1}', "budgetPrices": '{"gpux": 1}'}, "budgetPrices.gpux=1: no such fleet"),
        ({"budgets": '{"x": 1}', "gpuInstanceType": "p5e.48xlarge"}, "fleet gpu runs p5e.48xlarge, which has no"),
        ({"budgets": '{"x": 1}', "budgetDefaultTeam": "y"}, "budgetDefaultTeam='y': not a team of budgets"),
        ({"shares": "x:1", "budgets": '{"x": 1}', "budgetDefaultTeam": "x"}, "fair-share jobs name their team"),
    ],
)
def test_malformed_budgets_are_refused_in_one_line(context: dict[str, str], says: str) -> None:
    assert says in refused(**context)
