"""The budget ledger: what the ledger function, the enforcement function and trainctl agree on.

Pure arithmetic (a job's attempts -> dollars in a month), the deployment's budgets document and the
DynamoDB item format, stdlib only: the two Lambda functions run it beside their handlers
(training_constructs/budgets/budget_functions.py; team_budgets.py deploys them), and trainctl imports it to
read the same ledger and the same document (the jobs stack's `Budgets` output).

A job costs nodes x the instance-hour price of its fleet's placement, for every attempt, from the
attempt's start (RUNNING) to its stop; an attempt still running accrues until now. Batch's DescribeJobs
lists past attempts in `attempts` (AttemptDetail startedAt/stoppedAt); the running attempt's start is the
job's own `startedAt` (API JobDetail). Child nodes start a little after the main node: counting every
node from the main node's start overstates a job by that delay, never understates it.

Table: partition key `month` ("2026-11", or RUNNING for jobs running now and, closed until their time to
live ends, those that ended lately), sort key `job`
("<team>#<job id>"). A job is written into every month its attempts touch, each item holding all its
spans (the arithmetic clips them to the month), so a job across midnight at a month's end counts in both
months by the hour. A Capacity Block's up-front fee is an entry of the same shape (fee_entry: the block's
instances over its window at the fee's instance-hour price, keyed by the reservation id), so the spend
sums count it in the months the block spans. Alert and stop markers share the month partition under sort
keys starting with "!".
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MS_PER_HOUR = 3_600_000
RUNNING = "RUNNING"
# The time-to-live attribute (epoch seconds) of ended jobs' entries in RUNNING.
EXPIRES = "expires"
# The tag that names a job's team on FIFO queues (trainctl sets it from --team).
TEAM_TAG = "trainctl:team"
# Every line the budget refuses or stops a job with starts with this (`trainctl why` recognises it).
REASON_PREFIX = "budget:"
# What Batch is given: the line after "trainctl ", the prefix every deliberate stop shares
# (config/job_events.py QUIET_REASON_PREFIX), so that the job-alert rule leaves budget stops out.
BATCH_REASON_PREFIX = f"trainctl {REASON_PREFIX}"
ALERT_FRACTIONS = (0.8, 1.0)
# Batch's states before a job's nodes run, and while they run (API JobDetail, status).
QUEUED = ("SUBMITTED", "PENDING", "RUNNABLE")
ACTIVE = ("STARTING", "RUNNING")
DONE = ("SUCCEEDED", "FAILED")

Span = tuple[int, int | None]


def month_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m")


def month_bounds(month: str) -> tuple[int, int]:
    """[start, end) of a UTC month in epoch milliseconds."""
    year, number = (int(part) for part in month.split("-"))
    start = datetime(year, number, 1, tzinfo=UTC)
    end = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)
    return int(start.timestamp() * 1000), int(end.timestamp() * 1000)


def month_name(month: str) -> str:
    """2026-11 -> November 2026."""
    year, number = month.split("-")
    return f"{calendar.month_name[int(number)]} {year}"


def spans_of(detail: Mapping[str, Any]) -> list[Span]:
    """(start, stop) of every attempt in ms, stop None for the attempt running now."""
    spans: list[Span] = [
        (int(a["startedAt"]), int(a["stoppedAt"]) if a.get("stoppedAt") else None)
        for a in detail.get("attempts") or []
        if a.get("startedAt")
    ]
    started = detail.get("startedAt")
    status = detail.get("status")
    if started and all(start != int(started) for start, _ in spans):
        stopped = detail.get("stoppedAt")
        if status == RUNNING:
            spans.append((int(started), None))
        elif status in DONE and stopped:
            spans.append((int(started), int(stopped)))
    return spans


def dollars(spans: Iterable[Span], *, nodes: int, usd_per_hour: float, window: tuple[int, int], now: int) -> float:
    """What the spans cost inside [window): nodes x price x the hours each span overlaps it (open spans
    end now)."""
    start, end = window
    run_ms = sum(max(0, min(stop if stop is not None else now, end) - max(first, start)) for first, stop in spans)
    return nodes * usd_per_hour * run_ms / MS_PER_HOUR


def months_touched(spans: Iterable[Span], now: int) -> list[str]:
    months: set[str] = set()
    for first, stop in spans:
        month, last = month_of(first), month_of(stop if stop is not None else now)
        while True:
            months.add(month)
            if month >= last:
                break
            month = month_of(month_bounds(month)[1])
    return sorted(months)


def team_of(
    detail: Mapping[str, Any], *, teams: Iterable[str], default_team: str | None, fair_share: bool
) -> str | None:
    """The budget a job counts against: its share identifier on fair-share queues (an identifier listed
    as `prefix*` covers every identifier with that prefix), else its trainctl:team tag or the default
    team. None: no budget."""
    names = list(teams)
    if fair_share:
        share = str(detail.get("shareIdentifier") or "")
        if share in names:
            return share
        return next((t for t in names if t.endswith("*") and share.startswith(t[:-1])), None)
    tagged = (detail.get("tags") or {}).get(TEAM_TAG)
    if tagged:
        return str(tagged) if tagged in names else None
    return default_team


def money(usd: float) -> str:
    return f"${usd:,.0f}" if usd >= 100 else f"${usd:,.2f}"


def hours_text(hours: float) -> str:
    return f"{hours:g} h" if hours >= 1 else f"{hours * 60:g} min"


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """The most a job may cost before it runs: nodes x price x its attempt timeout x its attempts (Batch
    bills every attempt, each bounded by the timeout: API SubmitJob, timeout and retryStrategy)."""

    nodes: int
    instance_type: str
    usd_per_hour: float
    hours: float
    jobs: int = 1
    attempts: int = 1

    @property
    def hourly(self) -> float:
        return self.jobs * self.nodes * self.usd_per_hour

    @property
    def most(self) -> float:
        return self.hourly * self.hours * self.attempts

    def shape(self) -> str:
        """16 x p5.48xlarge x 4 h x 2 attempts (with "20 jobs x " in front for a sweep)."""
        jobs = f"{self.jobs} jobs x " if self.jobs > 1 else ""
        attempts = f" x {self.attempts} attempts" if self.attempts > 1 else ""
        return f"{jobs}{self.nodes} x {self.instance_type} x {hours_text(round(self.hours, 2))}{attempts}"


@dataclass(frozen=True, kw_only=True)
class TeamSpend:
    team: str
    budget: float
    month: str
    # Attempts that ended this month; attempts running now, from their start (or the month's) to now.
    spent: float
    accruing: float
    # USD per hour of the team's attempts running now.
    rate: float
    hours_left: float

    @property
    def used(self) -> float:
        return self.spent + self.accruing

    @property
    def remaining(self) -> float:
        return self.budget - self.used

    @property
    def forecast(self) -> float:
        """Spend at the month's end if what runs now runs on."""
        return self.used + self.rate * self.hours_left


# A refusal is one line of at most this many characters, whatever the team's name (up to 64).
LINE_LIMIT = 200
REMEDY = "fewer nodes, a shorter --timeout/--hours, or a bigger budget"


def refusal(spend: TeamSpend, estimate: Estimate) -> str | None:
    """The one line that refuses a job that does not fit the team's remainder; None when it fits. At most
    LINE_LIMIT characters: the month and the figures' shape go first when a long team name leaves no room."""
    if estimate.most <= spend.remaining:
        return None
    left = max(spend.remaining, 0.0)
    # Spelled out (REASON_PREFIX first, as tests pin) so that docs/troubleshooting.md can quote it.
    line = (
        f"budget: team {spend.team} has {money(left)} of {money(spend.budget)} left in "
        f"{month_name(spend.month)}; this job may cost up to {money(estimate.most)} ({estimate.shape()}): {REMEDY}"
    )
    if len(line) > LINE_LIMIT:
        line = (
            f"budget: team {spend.team}: {money(left)} of {money(spend.budget)} left, "
            f"job up to {money(estimate.most)}; {REMEDY}"
        )
    return line


def unknown_team(detail: Mapping[str, Any], budgets: Budgets, *, fleet_check: bool = False) -> str | None:
    """With budgets every job counts against a team: the one line refusing a job whose share identifier
    (fair-share queues) or trainctl:team tag (FIFO queues) names no budgeted team, or that names none and there
    is no default team; else None. A share without a budget would otherwise run free, and any submitter can
    start a new share. `fleet_check`: the caller found the job to be a fleet check run as its definition says
    (budget_functions.is_fleet_check), which names no team."""
    if budgets.team_of(detail) is not None:
        return None
    if fleet_check:
        return None
    if budgets.fair_share:
        share = str(detail.get("shareIdentifier") or "")
        named = f"share {share[:64]} has no budget" if share else "no share identifier"
    else:
        tagged = str((detail.get("tags") or {}).get(TEAM_TAG) or "")
        named = f"team {tagged[:64]} has no budget" if tagged else f"no {TEAM_TAG} tag"
    line = f"{REASON_PREFIX} {named}; the teams are {', '.join(budgets.teams)}"
    return line if len(line) <= LINE_LIMIT else f"{REASON_PREFIX} {named}; `trainctl budget` lists the teams"


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One job's line in the ledger."""

    team: str
    job_id: str
    job_name: str
    fleet: str
    instance_type: str
    nodes: int
    usd_per_hour: float
    spans: tuple[Span, ...]
    # How much of the job's life the entry knows (each start and stop, and the end): a late event never
    # overwrites a newer one.
    progress: int = 0

    @property
    def running(self) -> bool:
        return any(stop is None for _, stop in self.spans)

    def item(self, month: str) -> dict[str, Any]:
        return {
            "month": month,
            "job": f"{self.team}#{self.job_id}",
            "team": self.team,
            "jobId": self.job_id,
            "jobName": self.job_name,
            "fleet": self.fleet,
            "instanceType": self.instance_type,
            "nodes": self.nodes,
            # DynamoDB numbers through boto3's resource layer are Decimals; a string keeps the figure exact.
            "usdPerHour": repr(self.usd_per_hour),
            "spans": [[first, stop if stop is not None else 0] for first, stop in self.spans],
            "progress": self.progress,
        }

    @staticmethod
    def from_item(item: Mapping[str, Any]) -> Entry:
        return Entry(
            team=str(item["team"]),
            job_id=str(item["jobId"]),
            job_name=str(item.get("jobName", "")),
            fleet=str(item["fleet"]),
            instance_type=str(item["instanceType"]),
            nodes=int(item["nodes"]),
            usd_per_hour=float(item["usdPerHour"]),
            spans=tuple((int(a), int(b) or None) for a, b in item["spans"]),
            progress=int(item.get("progress", 0)),
        )


def fee_entry(
    *, team: str, key: str, name: str, fleet: str, instance_type: str, count: int, usd: float, window: tuple[int, int]
) -> Entry:
    """An up-front fee (a Capacity Block's, or an extension's) as a closed entry the spend sums count: `count`
    instances over the window at the fee's price per instance-hour, so each month the window touches bears
    its hours' share of the fee, the same arithmetic as a job's. Write it into every month the window touches
    (months_touched); `key` (the reservation id, with the extension offering's id) names it where a job's
    id would be."""
    start, end = window
    hours = (end - start) / MS_PER_HOUR
    if count < 1 or hours <= 0:
        raise ValueError(f"a fee needs instances and a window: {count} instances, {hours:g} h")
    return Entry(
        team=team,
        job_id=key,
        job_name=name,
        fleet=fleet,
        instance_type=instance_type,
        nodes=count,
        usd_per_hour=usd / (count * hours),
        spans=((start, end),),
        progress=2,
    )


def progress_of(detail: Mapping[str, Any], spans: Sequence[Span]) -> int:
    return sum(1 if stop is None else 2 for _, stop in spans) + (1 if detail.get("status") in DONE else 0)


def team_spends(
    entries: Iterable[Entry], budgets: Mapping[str, float], *, month: str, now: int
) -> dict[str, TeamSpend]:
    """Each budgeted team's spend in `month` at `now`, from the month's entries and the running ones
    (one entry per job: the one that knows most)."""
    latest: dict[str, Entry] = {}
    for entry in entries:
        seen = latest.get(entry.job_id)
        if seen is None or entry.progress > seen.progress:
            latest[entry.job_id] = entry
    window = month_bounds(month)
    hours_left = max(0, window[1] - now) / MS_PER_HOUR
    totals = {team: [0.0, 0.0, 0.0] for team in budgets}
    for entry in latest.values():
        if entry.team not in totals:
            continue
        closed = [s for s in entry.spans if s[1] is not None]
        opened = [s for s in entry.spans if s[1] is None]
        totals[entry.team][0] += dollars(
            closed, nodes=entry.nodes, usd_per_hour=entry.usd_per_hour, window=window, now=now
        )
        totals[entry.team][1] += dollars(
            opened, nodes=entry.nodes, usd_per_hour=entry.usd_per_hour, window=window, now=now
        )
        if opened and window[0] <= now < window[1]:
            totals[entry.team][2] += entry.nodes * entry.usd_per_hour
    return {
        team: TeamSpend(
            team=team,
            budget=budgets[team],
            month=month,
            spent=spent,
            accruing=accruing,
            rate=rate,
            hours_left=hours_left,
        )
        for team, (spent, accruing, rate) in totals.items()
    }


def read_entries(table: Any, month: str) -> list[Entry]:
    """The month's entries and the running ones, from the ledger table (a boto3 Table)."""
    entries = []
    for partition in (month, RUNNING):
        query: dict[str, Any] = {
            "KeyConditionExpression": "#m = :m",
            "ExpressionAttributeNames": {"#m": "month"},
            "ExpressionAttributeValues": {":m": partition},
        }
        while True:
            page = table.query(**query)
            entries += [Entry.from_item(i) for i in page.get("Items", []) if not str(i["job"]).startswith("!")]
            if "LastEvaluatedKey" not in page:
                break
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return entries


@dataclass(frozen=True, kw_only=True)
class QueuePrice:
    """What an instance-hour of a queue's placement costs."""

    queue: str
    fleet: str
    instance_type: str
    usd_per_hour: float


def document(
    *,
    table: str,
    teams: Mapping[str, float],
    default_team: str | None,
    fair_share: bool,
    queues: Iterable[QueuePrice],
    timeout_seconds: int,
    attempts: int,
    check_definitions: Iterable[str] = (),
) -> dict[str, Any]:
    """The budgets document as Budgets.parse reads it (the construct fills it with deploy-time tokens)."""
    return {
        "table": table,
        "teams": dict(teams),
        **({"defaultTeam": default_team} if default_team else {}),
        "fairShare": fair_share,
        "queues": [
            {"queue": q.queue, "fleet": q.fleet, "instanceType": q.instance_type, "usdPerHour": q.usd_per_hour}
            for q in queues
        ],
        "timeoutSeconds": timeout_seconds,
        "attempts": attempts,
        "checkDefinitions": list(check_definitions),
    }


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """The deployment's budgets document: the functions' BUDGETS variable and the `Budgets` output."""

    table: str
    teams: dict[str, float]
    default_team: str | None
    fair_share: bool
    queues: tuple[QueuePrice, ...]
    # The job definitions' attempt timeout: a job's bound when its description names none.
    timeout_seconds: int
    # The job definitions' attempts: a job's retries when its description names none.
    attempts: int = 1
    # The benchmark job definitions' ARNs: the fleet checks, which name no team.
    check_definitions: tuple[str, ...] = ()

    @staticmethod
    def parse(document: Mapping[str, Any]) -> Budgets:
        return Budgets(
            table=str(document["table"]),
            teams={str(team): float(usd) for team, usd in document["teams"].items()},
            default_team=document.get("defaultTeam"),
            fair_share=bool(document["fairShare"]),
            queues=tuple(
                QueuePrice(
                    queue=str(q["queue"]),
                    fleet=str(q["fleet"]),
                    instance_type=str(q["instanceType"]),
                    usd_per_hour=float(q["usdPerHour"]),
                )
                for q in document["queues"]
            ),
            timeout_seconds=int(document["timeoutSeconds"]),
            # A deployment from before the key: one attempt, as before.
            attempts=int(document.get("attempts") or 1),
            check_definitions=tuple(str(arn) for arn in document.get("checkDefinitions") or ()),
        )

    def price_of(self, queue: str) -> QueuePrice | None:
        """The queue's price, by ARN or name (job descriptions name queues by ARN)."""
        return next((q for q in self.queues if queue in (q.queue, q.queue.rsplit("/", 1)[-1])), None)

    def team_of(self, detail: Mapping[str, Any]) -> str | None:
        return team_of(detail, teams=self.teams, default_team=self.default_team, fair_share=self.fair_share)

    def spends(self, table: Any, now: int) -> dict[str, TeamSpend]:
        month = month_of(now)
        return team_spends(read_entries(table, month), self.teams, month=month, now=now)
