"""The main node watches its children's node jobs in Batch, for a child that fails without telling it.

    node_watch.py --job ID --nodes N --main M --pid PID --out FILE --since EPOCH [--period SECONDS]

Batch decides a multi-node job by its main node alone, and "if a child node dies, AWS Batch doesn't take any
action on the other nodes" (Batch user guide, "Multi-node parallel jobs"). A child that reports its own fault
reaches the main node's listener (node_fault.py); one that cannot (its container SIGKILLed or killed for
memory, its image never pulled, its host lost) would leave the main node waiting for the rendezvous
(RDZV_JOIN_TIMEOUT) or, once its own trainer crashed, unsure whether a child was lost. So the main node's
launcher starts this beside the listener: every `period` seconds (NODE_WATCH_SECONDS, default 15) it calls
DescribeJobs on the node jobs `<job id>#<n>` (up to 100 ids a call, Batch API DescribeJobs) and reads only
jobId, status, statusReason, startedAt, stoppedAt, container.exitCode, container.reason and
container.networkInterfaces. Each running child's address (its task ENI's privateIpv4Address) is written to
CHILDREN/node-<n>.address, from which alone the listener takes that node's lines (report_listener.py); when
this watch cannot ask Batch it writes CHILDREN/addresses.unknown. Each child of this attempt that Batch shows
ended is written to CHILDREN/node-<n>.batch (its status), which the launcher counts as an answer when it waits
for every child's word. A FAILED child that told the main node nothing (no CHILDREN/node-<n> from the
listener: it was killed, never started, or its host was lost) is written to the launcher's report file FILE as
"<code> node <n>: Batch says FAILED: <what Batch says>; ..." and the launcher gets SIGUSR1: it stops training
and ends the attempt. The code is 75 (retried on fresh nodes); the child's own exit code where that is the
launcher's verdict for the whole job, 2 (bad input) or 78 (a fault the fleet shares); and the child's exit
code (137) when ECS says its container was killed for memory (container.reason "OutOfMemoryError: ...", ECS
developer guide, "Troubleshooting Amazon ECS OutOfMemoryError errors"): that is the application's, as the main
node's own out-of-memory kill is, and no retry mends it. A child that did tell is judged by what it said
(ending.py), not here. Of several such children, the one that did not exit 1 is named (the cause, not its
echo), then the earliest to stop.

A child that SUCCEEDED is noted once and not acted on: Batch counts it a success, and a script whose rank 0
alone saves and uploads at the end lets the others finish first. A child node job whose startedAt (else
stoppedAt) is earlier than the main node's own startedAt is the previous attempt's, not this one's
(children start only after the main node runs), and is ignored; the main node's own node job is asked
for that time (Batch's clock for both), and until Batch gives it, this launcher's start (--since) stands in.
On a retry (AWS_BATCH_JOB_ATTEMPT 2 or more) a FAILED node job with neither startedAt nor stoppedAt
(a node that never ran) may be the earlier attempt's still showing: how Batch shows a node job between
attempts is not documented. It counts only once this watch has seen that node job in another state in
this attempt, or once it has shown so for STALE_FAILED_SECONDS (a node that never starts again).

The watcher never ends the job for its own trouble: throttling and transient errors get botocore's
standard retries, then the next period; AccessDenied, missing credentials or no region print one line and
end the watching (the job goes on). Once the launcher's own trainer failed (it creates the file --hurry), it
asks at once and then every FAST_PERIOD seconds, while the launcher waits for every child's word
(NODE_VERDICT_SECONDS).
Region: AWS_REGION, else AWS_DEFAULT_REGION (botocore reads only the latter), else the TaskARN in the ECS
task metadata (aws_region.py: on EC2 the ECS agent set neither variable until aws/amazon-ecs-agent#4946).
AWS_ENDPOINT_URL is honoured (boto3's own rule): `trainctl rehearse` answers DescribeJobs locally.
Python 3.10, stdlib and boto3.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_region import region  # beside this file in every image
from cold_start import alive
from node_fault import SHARED_EXIT, deliver
from report_listener import ADDRESS_UNKNOWN, address_file

NAME = "node_watch.py"
NODE_FAULT_EXIT = 75
BAD_INPUT_EXIT = 2
# What ECS puts in a container's reason when the kernel killed it for exceeding its memory (ECS developer
# guide, "Troubleshooting Amazon ECS OutOfMemoryError errors": "Container killed due to memory usage").
OUT_OF_MEMORY = "OutOfMemoryError"
# A child's report is sent before its container exits, so it is in before Batch can show FAILED; one
# more look after this long covers a report still being written.
REPORT_RACE_SECONDS = 1.0
TERMINAL = ("SUCCEEDED", "FAILED")
# How long a retry's FAILED node job with no times may be the earlier attempt's still showing before it
# counts as this attempt's (a node whose image never pulls again): children start within minutes.
STALE_FAILED_SECONDS = 600.0
DEFAULT_PERIOD = 15.0
# Once the launcher's trainer failed: how often to ask while the launcher waits out its report grace.
FAST_PERIOD = 1.0
# DescribeJobs takes at most 100 job ids a call (Batch API, DescribeJobs `jobs`).
MAX_IDS = 100
# Start times are compared in Batch's clock; only until Batch gives the main node's startedAt does this
# node's clock (the launcher's start) stand in, and the two (both on Amazon Time Sync) may differ a little.
CLOCK_SLACK_MS = 2000
# Errors that no retry mends: the role lacks batch:DescribeJobs, or its credentials are not accepted.
DENIED = {"AccessDenied", "AccessDeniedException", "UnrecognizedClientException", "InvalidClientTokenId"}
DENIED |= {"ExpiredTokenException", "InvalidSignatureException", "UnauthorizedOperation"}


@dataclass(frozen=True)
class NodeJob:
    """A node job as DescribeJobs shows it; times are epoch milliseconds."""

    index: int
    status: str
    status_reason: str = ""
    exit_code: int | None = None
    reason: str = ""
    started_at: int | None = None
    stopped_at: int | None = None
    address: str = ""  # container.networkInterfaces[0].privateIpv4Address (Batch API, NetworkInterface)

    def describe(self) -> str:
        """What Batch says, e.g. "Essential container in task exited, exit code 137"."""
        said = [s for s in (self.status_reason, self.reason) if s]
        if len(said) == 2 and said[1] in said[0]:
            said.pop()
        text = "; ".join(said) or "no reason given"
        if self.exit_code is not None:
            text += f", exit code {self.exit_code}"
        return text

    @property
    def never_ran(self) -> bool:
        return self.started_at is None and self.stopped_at is None

    def earlier_attempt(self, since_ms: int) -> bool:
        moment = self.started_at if self.started_at is not None else self.stopped_at
        return moment is not None and moment < since_ms - CLOCK_SLACK_MS


def node_job(entry: Mapping[str, Any]) -> NodeJob | None:
    """A DescribeJobs entry of a node job `<id>#<n>`; None for anything else."""
    _, _, index = str(entry.get("jobId", "")).rpartition("#")
    if not index.isdigit():
        return None
    container = entry.get("container") or {}
    code = container.get("exitCode")
    started, stopped = entry.get("startedAt"), entry.get("stoppedAt")
    interfaces = container.get("networkInterfaces") or [{}]
    address = interfaces[0].get("privateIpv4Address") if isinstance(interfaces[0], dict) else None
    return NodeJob(
        index=int(index),
        status=str(entry.get("status", "")),
        status_reason=str(entry.get("statusReason") or ""),
        exit_code=code if isinstance(code, int) else None,
        reason=str(container.get("reason") or ""),
        started_at=started if isinstance(started, int) else None,
        stopped_at=stopped if isinstance(stopped, int) else None,
        address=address if isinstance(address, str) else "",
    )


def node_ids(job: str, nodes: int, main: int) -> list[str]:
    """The main node's own node job first (for its start time), then the children's."""
    return [f"{job}#{main}"] + [f"{job}#{n}" for n in range(nodes) if n != main]


def describe(client: Any, ids: list[str]) -> list[NodeJob]:
    found = []
    for start in range(0, len(ids), MAX_IDS):
        answer = client.describe_jobs(jobs=ids[start : start + MAX_IDS])
        found += [j for j in map(node_job, answer.get("jobs", [])) if j is not None]
    return found


def verdict(jobs: Iterable[NodeJob], since_ms: int, told: Iterable[int] = ()) -> tuple[int, str] | None:
    """The report for the failed child to name, as (code, line); None while no child of this attempt
    failed without telling the main node (`told`: the children whose ending the listener has)."""
    spoke = set(told)
    failed = [j for j in jobs if j.status == "FAILED" and not j.earlier_attempt(since_ms) and j.index not in spoke]
    if not failed:
        return None
    first = min(failed, key=lambda j: (j.exit_code == 1, j.stopped_at or 0, j.index))
    said = f"node {first.index}: Batch says FAILED: {first.describe()}"
    if first.reason.startswith(OUT_OF_MEMORY):
        code = first.exit_code if first.exit_code else 137
        return code, f"{said}; killed for memory: the application's, not retried"
    if first.exit_code in (BAD_INPUT_EXIT, SHARED_EXIT):
        return first.exit_code, said
    return NODE_FAULT_EXIT, f"{said}; it died without telling the main node (killed, never started or its host lost)"


def batch_client(region_name: str) -> Any:
    import boto3
    from botocore.config import Config

    # Standard retries: throttling and transient errors, with backoff (botocore, "Retries"); short
    # timeouts so that one slow call does not hold the watch for long.
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=10)
    return boto3.client("batch", region_name=region_name, config=config)


def say(text: str) -> None:
    print(f"{NAME}: {text}", file=sys.stderr, flush=True)


def denied(error: Exception) -> str | None:
    """The reason no retry mends this error, or None when the next period may do better."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return "no AWS credentials"
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in DENIED or status == 403:
            return code or f"HTTP {status}"
    return None


class Watch:
    """The polling loop."""

    def __init__(
        self, *, client: Any, job: str, nodes: int, main: int, pid: int, out: Path, hurry: Path, since: float,
        period: float, children: Path | None = None, attempt: int = 1,
    ) -> None:  # fmt: skip
        self.client, self.pid, self.out, self.hurry = client, pid, out, hurry
        self.children = children
        self.attempt = attempt
        self.seen_running: set[int] = set()  # children seen in a state other than FAILED in this attempt
        self.stale: dict[int, float] = {}  # children showing FAILED with no times: since when (monotonic)
        self.ids, self.main = node_ids(job, nodes, main), main
        self.launcher_start_ms = int(since * 1000)
        self.period = period
        self.noted: set[int] = set()
        self.failing = False

    def run(self) -> int:
        while alive(self.pid):
            finished = self.once()
            if finished:
                return 0
            self.wait()
        return 0

    def once(self) -> bool:
        """One DescribeJobs round; True when the watching is over (a report delivered, or no way to ask)."""
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        try:
            described = describe(self.client, self.ids)
        except (BotoCoreError, ClientError, ResponseParserError) as error:
            why = denied(error)
            if why:
                unwatched(self.children)
                say(f"cannot watch the child nodes in Batch ({why}): the job role needs batch:DescribeJobs; "
                    "training goes on, but a child that dies silently is not seen")  # fmt: skip
                return True
            if not self.failing:
                say(f"DescribeJobs failed ({type(error).__name__}: {str(error)[:120]}); asking again")
            self.failing = True
            return False
        if self.failing:
            say("DescribeJobs answers again")
            self.failing = False
        main = [j.started_at for j in described if j.index == self.main and j.started_at is not None]
        since_ms = main[0] if main else self.launcher_start_ms
        jobs = self.this_attempts([j for j in described if j.index != self.main])
        for job in jobs:
            if job.status == "SUCCEEDED" and job.index not in self.noted and not job.earlier_attempt(since_ms):
                self.noted.add(job.index)
                say(f"node {job.index}: Batch says SUCCEEDED before the main node ended; not acted on")
        self.record(j for j in jobs if j.status in TERMINAL and not j.earlier_attempt(since_ms))
        self.addresses(j for j in jobs if j.status not in TERMINAL and j.address and not j.earlier_attempt(since_ms))
        found = verdict(jobs, since_ms, self.told())
        if found is not None:
            time.sleep(REPORT_RACE_SECONDS)
            found = verdict(jobs, since_ms, self.told())
        if found is None:
            return False
        deliver(self.out, self.pid, *found)
        return True

    def this_attempts(self, jobs: list[NodeJob]) -> list[NodeJob]:
        """The children's entries, less a retry's FAILED entry with no times that may be the earlier
        attempt's (see the module's docstring)."""
        kept = []
        now = time.monotonic()
        for job in jobs:
            if job.status != "FAILED":
                self.seen_running.add(job.index)
            if self.attempt >= 2 and job.status == "FAILED" and job.never_ran and job.index not in self.seen_running:
                first = self.stale.setdefault(job.index, now)
                if now - first < STALE_FAILED_SECONDS:
                    continue
            kept.append(job)
        return kept

    def told(self) -> set[int]:
        """The children whose ending the listener has."""
        if self.children is None:
            return set()
        return {int(p.name[5:]) for p in self.children.glob("node-*") if p.name[5:].isdigit()}

    def record(self, ended: Iterable[NodeJob]) -> None:
        if self.children is None:
            return
        self.children.mkdir(parents=True, exist_ok=True)
        for job in ended:
            (self.children / f"node-{job.index}.batch").write_text(job.status + "\n")

    def addresses(self, running: Iterable[NodeJob]) -> None:
        """Each running child's address, for the listener (report_listener.py); written only when it changed."""
        if self.children is None:
            return
        self.children.mkdir(parents=True, exist_ok=True)
        for job in running:
            path = address_file(self.children, job.index)
            if not path.exists() or path.read_text().strip() != job.address:
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(job.address + "\n")
                tmp.replace(path)

    def wait(self) -> None:
        deadline = time.monotonic() + self.period
        while time.monotonic() < deadline and alive(self.pid):
            if self.period > FAST_PERIOD and self.hurry.exists():
                self.period = FAST_PERIOD
                return
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="the job id, without '#<node>'")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--main", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="the launcher: SIGUSR1 on a report")
    parser.add_argument("--out", type=Path, required=True, help="the launcher's report file")
    parser.add_argument("--hurry", type=Path, required=True, help="created by the launcher when its trainer failed")
    parser.add_argument("--since", type=float, required=True, help="this launcher's start, epoch seconds")
    parser.add_argument("--children", type=Path, help="the listener's folder of the children's words")
    parser.add_argument("--attempt", type=int, default=1, help="AWS_BATCH_JOB_ATTEMPT")
    parser.add_argument("--period", default=str(DEFAULT_PERIOD), help="NODE_WATCH_SECONDS; 0: do not watch")
    args = parser.parse_args(argv)
    try:
        period = float(args.period)
    except ValueError:
        period = -1.0
    if period == 0:
        return unwatched(args.children)
    if not 0 < period < float("inf"):
        say(f"NODE_WATCH_SECONDS='{args.period}' is not a number of seconds (0 turns the watch off); not watching")
        return unwatched(args.children)
    where = region(environ)
    if where is None:
        say("cannot watch the child nodes in Batch: no region (AWS_REGION, AWS_DEFAULT_REGION, ECS task metadata)")
        return unwatched(args.children)
    try:
        client = batch_client(where)
    except ImportError:
        say(f"cannot watch the child nodes in Batch: {sys.executable} has no boto3; set NODE_WATCH_PYTHON")
        return unwatched(args.children)
    watch = Watch(
        client=client,
        job=args.job,
        nodes=args.nodes,
        main=args.main,
        pid=args.pid,
        out=args.out,
        hurry=args.hurry,
        since=args.since,
        period=period,
        children=args.children,
        attempt=args.attempt,
    )
    try:
        return watch.run()
    except BaseException:
        unwatched(args.children)  # the listener must not wait for addresses that will never come
        raise


def unwatched(children: Path | None) -> int:
    """Tell the listener that no child's address will come from Batch (report_listener.py): it then takes the
    children's lines without checking who sent them, rather than never."""
    if children is not None:
        children.mkdir(parents=True, exist_ok=True)
        (children / ADDRESS_UNKNOWN).touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
