"""EventBridge's rules for the fields of a cron(...) schedule expression, checked at synth so that a
schedule EventBridge refuses (or one that never fires) stops `cdk synth`, not `cdk deploy`.

Source: EventBridge user guide, "Using cron and rate expressions to schedule rules"
(docs.aws.amazon.com/eventbridge/latest/userguide/eb-scheduled-rule-pattern.html): six fields,
Minutes 0-59, Hours 0-23, Day-of-month 1-31, Month 1-12 or JAN-DEC, Day-of-week 1-7 or SUN-SAT,
Year 1970-2199; wildcards `, - * /` in every field, `?` in the two day fields, `L W` in
Day-of-month, `L #` in Day-of-week.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CronField:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # JAN.. or SUN..: names[i] is low + i
    extra: str = ""  # wildcards beyond , - * / that this field takes

    def value(self, text: str) -> int | None:
        if text.isdigit():
            return int(text)
        upper = text.upper()
        return self.low + self.names.index(upper) if upper in self.names else None


MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
FIELDS = (
    CronField("minute", 0, 59),
    CronField("hour", 0, 23),
    CronField("day-of-month", 1, 31, extra="?LW"),
    CronField("month", 1, 12, MONTHS),
    CronField("day-of-week", 1, 7, DAYS, extra="?L#"),
    CronField("year", 1970, 2199),
)
# The L, W and # forms: last day, nearest weekday, nth weekday of the month.
_SPECIAL = {"day-of-month": r"L|LW|\d{1,2}W", "day-of-week": r"L|\dL|\d#[1-5]"}


def _item_problem(spec: CronField, item: str) -> str | None:
    """The problem with one comma-separated item of a field, or None."""
    if item in ("*", "?"):
        return None if item == "*" or "?" in spec.extra else f"? only in the day fields, not the {spec.name}"
    special = _SPECIAL.get(spec.name)
    if special and re.fullmatch(special, item, re.IGNORECASE):
        # L, LW, 15W (day of month); L, 6L, 3#2 (day of week): the leading number still needs its range.
        digits = re.match(r"\d+", item)
        if digits and not spec.low <= int(digits[0]) <= spec.high:
            return f"{spec.name} {digits[0]} outside {spec.low}-{spec.high}"
        return None
    base, _, step = item.partition("/")
    if step and not (step.isdigit() and 1 <= int(step) <= spec.high):
        return f"{spec.name} increment {step!r} is not 1-{spec.high}"
    ends = ["*"] if base == "*" else base.split("-")
    if base == "*" and not step:
        return None
    if len(ends) > 2 or not all(ends):
        return f"malformed {spec.name} {item!r}"
    for end in ends:
        if end == "*":
            continue
        number = spec.value(end)
        if number is None:
            names = f" or {spec.names[0]}-{spec.names[-1]}" if spec.names else ""
            return f"{spec.name} {end!r} is not {spec.low}-{spec.high}{names}"
        if not spec.low <= number <= spec.high:
            return f"{spec.name} {end} outside {spec.low}-{spec.high}"
    return None


def field_problem(spec: CronField, text: str) -> str | None:
    for item in text.split(","):
        problem = _item_problem(spec, item)
        if problem:
            return problem
    return None


def cron_problem(fields: list[str]) -> str | None:
    """The first field that breaks EventBridge's rules, in a few words; None when all six are valid."""
    if len(fields) != len(FIELDS):
        return f"{len(fields)} fields, not six"
    for spec, text in zip(FIELDS, fields, strict=True):
        problem = field_problem(spec, text)
        if problem:
            return problem
    return None


def values(spec: CronField, text: str) -> set[int]:
    """The numbers a field that cron_problem accepted matches, for a numeric field (minutes, hours):
    `*`, `a`, `a-b`, and each with `/step` (EventBridge: `a/s` starts at a, every s to the field's end)."""
    found: set[int] = set()
    for item in text.split(","):
        base, _, step = item.partition("/")
        if base == "*":
            low, high = spec.low, spec.high
        else:
            start, _, end = base.partition("-")
            low = int(start)
            high = int(end) if end else (spec.high if step else low)
        found.update(range(low, high + 1, int(step) if step else 1))
    return found


def longest_gap_hours(hours: set[int]) -> int:
    """The longest wait, in hours, between consecutive runs of a schedule that fires in `hours` of each day."""
    ordered = sorted(hours)
    return max((b - a) % 24 or 24 for a, b in zip(ordered, ordered[1:] + ordered[:1], strict=True))
