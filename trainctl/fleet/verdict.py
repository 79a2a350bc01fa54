"""The all-reduce benchmark's result: rank 0 prints JSON lines with "verdict", "busbw_gbps",
"failing_nodes" and "degraded_nodes" (container/benchmark/allreduce_bench.py) into the log stream of the
node that holds rank 0; the last is short, since the full report can exceed the 16 KB at which Docker splits
a log line. Other keys may be added, and other lines may be JSON too, so the result is the last JSON object that has a
"verdict", with the details (fabric, node_checks) of the full line before it. "fabric" is the verdict across
nodes against published runs (config/fabric_references.py, the same judge `trainctl fabric verdict` uses).
"slow_nodes" names the node(s) the pairs phase bisected to, and "bisect" holds its rounds and reason
(container/benchmark/node_bisect.py) when the phase ran."""

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
            # The short last line repeats the full report's figures; keep that report's details too.
            same = found is not None and all(found.get(k) == value.get(k) for k in ("verdict", "busbw_gbps"))
            found = {**found, **value} if found is not None and same else value
    return found


def verdict_summary(result: dict[str, Any]) -> str:
    """`degraded (bus bandwidth 161.5 Gbps; fabric degraded: 20.19 GB/s at 1 GiB against the published
    76.14 GB/s (< 90%); likely fewer EFAs in use; failing: node 1 (ip-..); slow node: node 3 (ip-..)
    by pairs in 2 rounds)`."""
    details = [f"bus bandwidth {result.get('busbw_gbps')} Gbps"]
    fabric = result.get("fabric")
    if isinstance(fabric, dict) and fabric.get("verdict"):
        details.append(f"fabric {fabric['verdict']}: {fabric.get('reason')}")
    for field, word in (("failing_nodes", "failing"), ("degraded_nodes", "degraded")):
        nodes = result.get(field) or []
        if nodes:
            details.append(f"{word}: {', '.join(str(n) for n in nodes)}")
    details.extend(_bisected(result))
    return f"{result.get('verdict')} ({'; '.join(details)})"


def _bisected(result: dict[str, Any]) -> list[str]:
    """What the pairs phase found: the slow node(s), or why none was named."""
    bisect = result.get("bisect")
    rounds = len(bisect.get("rounds") or []) if isinstance(bisect, dict) else 0
    slow = result.get("slow_nodes") or []
    if slow:
        found = f"slow node{'s' if len(slow) > 1 else ''}: {', '.join(str(n) for n in slow)}"
        return [f"{found} by pairs in {rounds} round{'s' if rounds != 1 else ''}" if rounds else found]
    if isinstance(bisect, dict) and bisect.get("reason"):
        return [f"pairs: slow node {bisect['reason']}"]
    return []
