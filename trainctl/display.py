"""How trainctl writes things for people: job states in colour, sizes and durations in human units,
text elided in its middle to fit a column, and `--since` as a date or a span back from now (7d, 12h, 30m, 2w)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from trainctl.errors import TrainctlError

# Rich styles per Batch job state (API JobDetail, status).
STATE_STYLES = {
    "SUBMITTED": "dim",
    "PENDING": "dim",
    "RUNNABLE": "yellow",
    "STARTING": "cyan",
    "RUNNING": "bold cyan",
    "SUCCEEDED": "green",
    "FAILED": "bold red",
}
_SPAN = re.compile(r"^(\d+)\s*([mhdw])$")
_SPAN_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def styled_state(state: str) -> str:
    """Rich markup for a state; rich drops the colour where the output is not a terminal."""
    style = STATE_STYLES.get(state)
    return f"[{style}]{state}[/]" if style else state


def human_size(size: float) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def human_duration(milliseconds: int) -> str:
    """3d 4h, 2h 05m, 7m 12s, 40s."""
    seconds = max(0, milliseconds // 1000)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def age(milliseconds: int) -> str:
    """How long ago, in its largest unit: 40s, 12m, 5h, 3d."""
    seconds = max(0, milliseconds // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def elide_middle(text: str, width: int) -> str:
    """`text` whole when it fits `width` characters, else its start and its end joined by "…" in exactly
    `width` characters, the start one longer when they cannot be equal: names of one experiment share their
    start and differ at their end (`pretrain-lla…-seed17-v2`)."""
    if len(text) <= width:
        return text
    if width < 2:
        return text[:width]
    kept = width - 1
    head = (kept + 1) // 2
    return text[:head] + "…" + text[len(text) - (kept - head) :]


def when(milliseconds: int | None) -> str:
    if not milliseconds:
        return "-"
    return datetime.fromtimestamp(milliseconds / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def parse_since(text: str | None, *, default: timedelta, now: datetime | None = None) -> datetime:
    """`--since`: a span back from now (30m, 12h, 7d, 2w) or a date / date-time (UTC unless it says)."""
    now = now or datetime.now(UTC)
    if text is None:
        return now - default
    span = _SPAN.match(text.strip().lower())
    if span and int(span.group(1)) == 0:
        # A span of nothing lists nothing: an empty table would only hide the slip.
        raise TrainctlError(
            f"--since {text}: a span of zero covers no time; give one of at least 1m (30m, 12h, 7d, 2w) or a date"
        )
    try:
        if span:
            return now - timedelta(**{_SPAN_UNITS[span.group(2)]: int(span.group(1))})
        moment = datetime.fromisoformat(text)
    except (ValueError, OverflowError):  # a span reaching before year 1 overflows datetime
        raise TrainctlError(
            f"--since {text!r}: give a span back from now (30m, 12h, 7d, 2w) or a date YYYY-MM-DD"
        ) from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    if moment > now:
        # Nothing was created after a moment still to come: an empty table would only hide the typo.
        raise TrainctlError(
            f"--since {text}: that is after now ({now:%Y-%m-%d %H:%M} UTC); give a past date or a span (7d)"
        )
    return moment
