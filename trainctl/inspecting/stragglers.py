"""The slow nodes a job's straggler watch named (container/launcher/straggler_watch.py), for `trainctl why` and
`show`: the watch runs on the main node and says, in that node's log stream of each attempt,

    straggler_watch.py: straggler: node N (instance i-..., AZ ...), rank R: ... ms ..., X.XXx ...; <action>
    straggler_watch.py: node N is back in line: X.XXx the other nodes' median

so the main node's streams (one per attempt, and the running one) are searched for those lines
(CloudWatch Logs FilterLogEvents with a quoted term: events that contain it; CloudWatch Logs user guide,
"Filter pattern syntax for metric filters, subscription filters, filter log events, and Live Tail")."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

WATCH = "straggler_watch.py: "
NAMED = re.compile(r"straggler_watch\.py: straggler: node (\d+) (.*)$")
BACK = re.compile(r"straggler_watch\.py: node (\d+) is back in line")
# FilterLogEvents may answer a page with no events and a token for the next one (it scans the stream a piece at a
# time): pages are read until the stream's end, within this many seconds per stream.
SECONDS_PER_STREAM = 15.0

# (log group, log stream) -> the stream's lines that hold WATCH, oldest first.
Find = Callable[[str, str], Sequence[str]]


def notes(streams: Sequence[tuple[int, str]], group: str, find: Find) -> list[str]:
    """One sentence per node the watch named in each attempt ((attempt number, the main node's stream)), with
    whether it was back in line by the stream's end."""
    said: list[str] = []
    for attempt, stream in streams:
        named: dict[str, str] = {}
        back: set[str] = set()
        for line in find(group, stream):
            if match := NAMED.search(line):
                named[match.group(1)] = match.group(2)
                back.discard(match.group(1))
            elif match := BACK.search(line):
                back.add(match.group(1))
        for node, text in named.items():
            later = "; it was back in line later" if node in back else ""
            said.append(f"attempt {attempt}: node {node} was named a straggler (a slow node): {text[:300]}{later}")
    return said


def main_streams(job: dict[str, Any], main_node_job: dict[str, Any] | None) -> list[tuple[int, str]]:
    """The main node's log stream of every attempt (the job's `attempts` hold the main node's container), and
    the running attempt's from the main node's own job `<id>#<main>`."""
    streams: list[tuple[int, str]] = []
    for number, attempt in enumerate(job.get("attempts") or [], start=1):
        stream = (attempt.get("container") or {}).get("logStreamName")
        if stream:
            streams.append((number, str(stream)))
    current = ((main_node_job or {}).get("container") or {}).get("logStreamName")
    if current and all(current != stream for _, stream in streams):
        streams.append((len(streams) + 1, str(current)))
    return streams


def log_finder(logs: Any) -> Find:
    """A Find on CloudWatch Logs: FilterLogEvents on one stream for the watch's lines; nothing when it fails
    (a stream not created yet, no permission): `why` stands without it."""

    def find(group: str, stream: str) -> list[str]:
        lines: list[str] = []
        options: dict[str, Any] = {"logGroupName": group, "logStreamNames": [stream], "filterPattern": f'"{WATCH}"'}
        deadline = time.monotonic() + SECONDS_PER_STREAM
        try:
            while time.monotonic() < deadline:
                page = logs.filter_log_events(**options)
                lines += [str(event.get("message", "")) for event in page.get("events", [])]
                if not page.get("nextToken"):
                    break
                options["nextToken"] = page["nextToken"]
        except Exception:
            return lines
        return lines

    return find
