"""The all-reduce benchmark's result: rank 0 prints one JSON line with "verdict" and "busbw_gbps"
(container/allreduce_bench.py) into the main node's log stream. Other keys may be added to that line,
and other lines may be JSON too, so the result is the last JSON object that has a "verdict"."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

HEALTHY = "healthy"


def last_verdict(messages: Iterable[str]) -> dict[str, Any] | None:
    found: dict[str, Any] | None = None
    for message in messages:
        start = message.find("{")
        if start < 0:
            continue
        try:
            value = json.loads(message[start:])
        except ValueError:
            continue
        if isinstance(value, dict) and "verdict" in value:
            found = value
    return found
