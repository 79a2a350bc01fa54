"""`trainctl jobs`: the deployment's jobs across its queues, newest first, with what a person asks
first (state, nodes, how long, attempts, share, sweep, cost), and the table they are shown in.

The table is plain aligned text. The default columns fit 80 terminal columns (or a wider terminal) whatever
the names: the name column takes what the others leave and a longer name loses its middle to "…". Nothing
else is cut, and nothing at all with --wide or chosen columns (ids, names and sweep ids are copied into
later commands); --json has every name whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.markup import escape

from trainctl.deployment import Deployment
from trainctl.display import age, elide_middle, human_duration, styled_state, when
from trainctl.errors import TrainctlError, clip
from trainctl.fleet.compute import fleet_compute
from trainctl.fleet.cost import price_per_hour, usage_of
from trainctl.inspecting.handles import RECENT, short_ids
from trainctl.jobs import DONE, STATES, describe_jobs, list_job_ids, num_nodes
from trainctl.submitting.requests import SWEEP_TAG


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    since: datetime
    fleet: str | None = None
    states: frozenset[str] = frozenset()
    sweep: str | None = None
    name_prefix: str | None = None
    limit: int = 0  # 0: every job


def parse_states(values: list[str]) -> frozenset[str]:
    states = frozenset(s.strip().upper() for value in values for s in value.split(",") if s.strip())
    unknown = sorted(states - set(STATES))
    if unknown:
        raise TrainctlError(f"--state {', '.join(unknown)}: a job state is one of {', '.join(STATES)}")
    return states


def list_jobs(batch: Any, deployment: Deployment, wanted: JobFilter, *, now_ms: int) -> list[dict[str, Any]]:
    """One row per job, newest first. ListJobs pages through each queue (with a filter it returns jobs
    in every status: API ListJobs, jobStatus); DescribeJobs, 100 ids a call, adds attempts, share and tags."""
    fleets = [deployment.fleet(wanted.fleet)] if wanted.fleet else list(deployment.fleets.values())
    since_ms = int(wanted.since.timestamp() * 1000)
    picked: list[tuple[dict[str, Any], str, str]] = []
    # Every placement's queue: a job the capacity fallback sent on waits or runs there.
    for fleet in (view for f in fleets for view in f.placement_views()):
        instance_type = fleet_compute(batch, fleet).instance_type or "unknown"
        for summary in list_job_ids(
            batch, fleet.job_queue, filters=[{"name": "AFTER_CREATED_AT", "values": [str(since_ms)]}]
        ):
            if int(summary.get("createdAt", 0)) < since_ms:
                continue
            if wanted.states and summary.get("status") not in wanted.states:
                continue
            if wanted.name_prefix and not str(summary.get("jobName", "")).startswith(wanted.name_prefix):
                continue
            picked.append((summary, fleet.name, instance_type))
    picked.sort(key=lambda p: int(p[0].get("createdAt", 0)), reverse=True)
    if wanted.limit and not wanted.sweep:
        picked = picked[: wanted.limit]
    details = {str(j["jobId"]): j for j in describe_jobs(batch, [str(s["jobId"]) for s, _, _ in picked])}
    rows = []
    for summary, fleet_name, instance_type in picked:
        job = details.get(str(summary["jobId"]), summary)
        tags = job.get("tags") or {}
        if wanted.sweep and tags.get(SWEEP_TAG) != wanted.sweep:
            continue
        rows.append(job_row(job, fleet=fleet_name, instance_type=instance_type, now_ms=now_ms))
        if wanted.limit and len(rows) == wanted.limit:
            break
    return rows


def job_row(job: dict[str, Any], *, fleet: str, instance_type: str, now_ms: int) -> dict[str, Any]:
    status = str(job.get("status", "?"))
    started = job.get("startedAt")
    stopped = job.get("stoppedAt") if status in DONE else None
    duration = None
    if started:
        duration = int(stopped or now_ms) - int(started)
    cost = None
    if status in DONE:
        usage = usage_of(job, fleet=fleet, instance_type=instance_type)
        price = price_per_hour(usage.instance_type, {}) if usage else None
        cost = round(usage.node_hours * price, 2) if usage and price is not None else None
    return {
        "jobId": job.get("jobId"),
        "name": job.get("jobName"),
        "fleet": fleet,
        "state": status,
        "nodes": num_nodes(job),
        "createdAt": job.get("createdAt"),
        "startedAt": started,
        "durationMs": duration,
        "attempts": len(job.get("attempts") or []),
        "share": job.get("shareIdentifier"),
        "sweep": (job.get("tags") or {}).get(SWEEP_TAG),
        "usdEstimate": cost,
    }


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], str]
    right: bool = False


def _or_dash(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: "-" if row[key] is None else str(row[key])


def columns(*, now_ms: int) -> dict[str, Column]:
    """Every column `jobs -o` takes, by name; `id` is filled in per table (the shortest unique prefixes)."""
    return {
        "id": Column("ID", lambda row: str(row["shortId"])),
        "job-id": Column("JOB ID", _or_dash("jobId")),
        "name": Column("NAME", _or_dash("name")),
        "fleet": Column("FLEET", _or_dash("fleet")),
        "state": Column("STATE", _or_dash("state")),
        "nodes": Column("NODES", _or_dash("nodes"), right=True),
        "age": Column("AGE", lambda row: age(now_ms - int(row["createdAt"])) if row["createdAt"] else "-", right=True),
        "created": Column("CREATED", lambda row: when(row["createdAt"])),
        "started": Column("STARTED", lambda row: when(row["startedAt"])),
        "duration": Column(
            "DURATION", lambda row: "-" if row["durationMs"] is None else human_duration(row["durationMs"]), right=True
        ),
        "tries": Column("TRIES", _or_dash("attempts"), right=True),
        "share": Column("SHARE", _or_dash("share")),
        "sweep": Column("SWEEP", _or_dash("sweep")),
        "usd": Column(
            "USD", lambda row: "-" if row["usdEstimate"] is None else f"{row['usdEstimate']:,.2f}", right=True
        ),
    }


COLUMN_NAMES = tuple(columns(now_ms=0))
# What a terminal shows by default (fits 80 columns with usual names), and with --wide.
DEFAULT_COLUMNS = ("id", "name", "fleet", "state", "nodes", "age")
WIDE_COLUMNS = ("job-id", "name", "fleet", "state", "nodes", "age", "started", "duration", "tries", "share", "sweep",
                "usd")  # fmt: skip
GAP = "  "
# The default table fits this many columns, or the terminal's width when wider.
FIT_COLUMNS = 80
# The name column is never narrower than this to fit: other columns that are wide already (an old job's full
# id, a long fleet name) make a longer line rather than an unreadable name.
MIN_NAME_WIDTH = 16


def parse_columns(value: str | None, *, wide: bool) -> tuple[str, ...]:
    """`-o id,name,...`: each a known column; unknown ones refused with the allowed names."""
    if value is None:
        return WIDE_COLUMNS if wide else DEFAULT_COLUMNS
    if wide:
        raise TrainctlError("--wide and -o both choose the columns: pass one of them")
    chosen = tuple(dict.fromkeys(c.strip().lower() for c in value.split(",") if c.strip()))
    unknown = [c for c in chosen if c not in COLUMN_NAMES]
    if unknown or not chosen:
        raise TrainctlError(f"-o {clip(value)!r}: the columns are {', '.join(COLUMN_NAMES)}")
    return chosen


def table_lines(
    rows: list[dict[str, Any]], chosen: tuple[str, ...], *, now_ms: int, fit: int | None = None
) -> list[str]:
    """The header and one line per row, each column as wide as its widest cell, in rich markup (the state
    in its colour). With `fit`, the name column takes what the other columns leave of `fit` characters (at
    least MIN_NAME_WIDTH) and a longer name keeps its start and end; without, nothing is cut."""
    known = columns(now_ms=now_ms)
    short = short_ids(str(row["jobId"]) for row in rows)
    # A prefix resolves only among jobs created within the handles' window: an older row shows its full id.
    window_start = now_ms - int(RECENT.total_seconds() * 1000)
    short.update({str(r["jobId"]): str(r["jobId"]) for r in rows if int(r.get("createdAt") or 0) < window_start})
    cells = [[known[c].cell({**row, "shortId": short[str(row["jobId"])]}) for c in chosen] for row in rows]
    if fit is not None and "name" in chosen:
        at = chosen.index("name")
        others = sum(
            max([len(known[c].header)] + [len(values[i]) for values in cells]) for i, c in enumerate(chosen) if i != at
        )
        room = max(MIN_NAME_WIDTH, fit - others - len(GAP) * (len(chosen) - 1))
        for values in cells:
            values[at] = elide_middle(values[at], room)
    widths = [max([len(known[c].header)] + [len(line[i]) for line in cells]) for i, c in enumerate(chosen)]

    def line(values: list[str], *, header: bool) -> str:
        parts = []
        for i, (name, value) in enumerate(zip(chosen, values, strict=True)):
            padding = " " * (widths[i] - len(value))
            text = styled_state(value) if name == "state" and not header else escape(value)
            last = i == len(chosen) - 1
            parts.append(padding + text if known[name].right else text + ("" if last else padding))
        return GAP.join(parts)

    return [line([known[c].header for c in chosen], header=True)] + [line(values, header=False) for values in cells]
