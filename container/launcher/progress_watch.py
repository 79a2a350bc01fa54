"""Hang watch for distributed_run.sh: every node watches its trainer's progress, and a job in which no node
makes progress ends within minutes, with each node's Python stacks beside the job's checkpoints.

    progress_watch.py relay --fd 1|2 --mark FILE     # copy the trainer's output, stamping FILE's mtime
    progress_watch.py watch --pid PID --launcher PID --dir DIR --hang-seconds N --node I --nodes N ...

Progress is the heartbeat file (TRAINING_HEARTBEAT_FILE, DIR/heartbeat: the training script touches it
once per step, on every rank) once it exists, and before that any output of the trainer (the relay
stamps DIR/output). A node hangs when its last progress is older than HANG_SECONDS, or than twice the
slowest step seen (the longest interval between two heartbeats, or two outputs before there is one) where
that is longer; a node that never showed progress does not. A hung node dumps the Python stacks of its
ranks (py-spy; a SIGSTOPped rank with --nonblocking, which reads its memory without stopping it) and
copies PyTorch's flight-recorder files (TORCH_FR_DUMP_TEMP_FILE<rank>, written when NCCL's own watchdog
times out), uploads them to --uri (<checkpoint prefix>/evidence/attempt-<A>/node-<I>/), and tells the main
node through node_fault.py's channel ("hang <job> <json>", with its last progress); a node whose progress
resumes says so. The main node ends the attempt once every node hangs: one line naming the rank and node
that stopped first (first_stopped) and where the evidence is, written to --out for the launcher
(SIGUSR1), which ends the attempt with it. Exit code: 75 (retried on fresh nodes) when a hung node shows a
hardware sign (node_fault.py judge; that node is taken out) or on the first attempt; HANG_EXIT (124, not
retried by the job definitions) from the second on.
Stdlib only, Python 3.10; boto3 for the upload (as checkpoint_sync.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import node_fault  # beside this file in every image
from cold_start import alive
from hang_evidence import collect, find_ranks, upload

NODE_FAULT_EXIT = 75
# GNU coreutils `timeout` exits 124 when the command timed out: a hang seen again after its retry. The job
# definitions retry 75 alone, so 124 ends the job (training_constructs/jobs/multi_node_job.py RETRY_RULES).
HANG_EXIT = 124
HUNG, PROGRESSING = "hung", "progressing"
CHUNK = 65536


TAIL_BYTES = 16384
TAIL_EVERY_SECONDS = 2.0


def relay(fd: int, mark: Path | None, tail: Path | None = None) -> int:
    """Copy stdin to `fd` as it comes (no line buffering: a progress bar's carriage returns count too), stamp
    `mark`'s mtime whenever output arrives, and keep the stream's last TAIL_BYTES in `tail` (written at
    most every TAIL_EVERY_SECONDS and at the end: the launcher quotes a failed trainer's last error)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # A stop goes to the launcher, which stops the trainer; the trainer's last words must still pass.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kept = bytearray()
    written = 0.0
    while True:
        chunk = os.read(0, CHUNK)
        if not chunk:
            _write_tail(tail, kept)
            return 0
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
        if mark is not None:
            try:
                os.utime(mark)
            except FileNotFoundError:
                mark.touch()
        if tail is not None:
            kept += chunk
            del kept[:-TAIL_BYTES]
            if time.monotonic() - written >= TAIL_EVERY_SECONDS:
                _write_tail(tail, kept)
                written = time.monotonic()


def _write_tail(tail: Path | None, kept: bytes | bytearray) -> None:
    if tail is None:
        return
    partial = tail.with_name(f".{tail.name}.tmp")
    partial.write_bytes(kept)
    partial.replace(tail)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@dataclass
class Progress:
    """A node's progress: the heartbeat once it exists, else the trainer's output."""

    hang_seconds: float
    heartbeat: Path
    output: Path
    source: str = ""
    last: float | None = None
    slowest: float = 0.0

    def sample(self) -> None:
        beat = _mtime(self.heartbeat)
        if beat is not None and self.source != "heartbeat":
            # Output intervals are no steps: the floor counts heartbeats alone from here on.
            self.source, self.last, self.slowest = "heartbeat", beat, 0.0
            return
        seen = beat if beat is not None else _mtime(self.output)
        if seen is None:
            return
        if self.source == "":
            self.source = "output"
        if self.last is not None and seen > self.last:
            self.slowest = max(self.slowest, seen - self.last)
        if self.last is None or seen > self.last:
            self.last = seen

    @property
    def limit(self) -> float:
        """HANG_SECONDS, never below twice the slowest step seen."""
        return max(self.hang_seconds, 2 * self.slowest)

    def state(self, now: float) -> str:
        """HUNG once the last progress is older than the limit; a node that never showed any is not."""
        return HUNG if self.last is not None and now - self.last >= self.limit else PROGRESSING


@dataclass
class NodeReport:
    node: int
    host: str
    state: str
    last: float | None
    limit: float
    source: str
    ranks: list[tuple[int, str]] = field(default_factory=list)
    hardware: str | None = None
    evidence: str | None = None
    note: str = ""

    @property
    def stopped_ranks(self) -> list[int]:
        return [rank for rank, state in self.ranks if state in ("T", "t", "Z", "D")]


def _clock(epoch: float | None) -> str:
    if epoch is None:
        return "none"
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%H:%M:%S UTC")


def first_stopped(hung: Sequence[NodeReport]) -> NodeReport:
    """The node that stopped first: among the nodes whose last progress lies within one limit of the newest
    (a node whose last output came hours ago, as with rank-0-only logging, is not the cause), one with a
    hardware sign or a rank stopped by a signal, else the oldest last progress."""
    newest = max(h.last or 0.0 for h in hung)
    candidates = [h for h in hung if (h.last or 0.0) >= newest - max(h.limit for h in hung)]
    marked = [h for h in candidates if h.hardware or h.stopped_ranks]
    return min(marked or candidates, key=lambda h: (h.last or 0.0, h.node))


def hang_exit(attempt: int, hardware: bool) -> int:
    """75 (retried) on a hardware sign or the first attempt; HANG_EXIT (not retried) from the second on."""
    return NODE_FAULT_EXIT if hardware or attempt <= 1 else HANG_EXIT


def verdict(reports: Mapping[int, NodeReport], nodes: int, attempt: int, now: float) -> tuple[int, str] | None:
    """(exit code, line) once every node is hung; None before."""
    hung = [r for r in reports.values() if r.state == HUNG]
    if len(hung) < nodes:
        return None
    first = first_stopped(hung)
    hardware = [r for r in hung if r.hardware]
    code = hang_exit(attempt, bool(hardware))
    stopped = first.stopped_ranks
    if stopped:
        who = f"rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} on node {first.node}"
        why = "stopped: state " + "".join(sorted({s for r, s in first.ranks if r in stopped}))
    else:
        ranks = ", ".join(str(r) for r, _ in first.ranks) or "none found"
        who, why = f"node {first.node} (ranks {ranks})", f"by its {first.source or 'output'}"
    newest = max((r.last for r in hung if r.last is not None), default=now)
    parts = [
        f"node {first.node} ({first.host}): hang: no progress on any node for {now - newest:.0f} s"
        f" (limit {first.limit:.0f} s)",
        f"{who} stopped first (last progress {_clock(first.last)}, {why})",
    ]
    parts += [f"node {r.node} shows a hardware fault: {r.hardware}" for r in hardware]
    where = {r.evidence.rstrip("/").rsplit("/", 1)[0] + "/" for r in hung if r.evidence}
    if where:
        parts.append(f"stacks at {' '.join(sorted(where))}")
    else:
        parts.append("stacks in each node's log (no CHECKPOINT_URI to upload them to)")
    failed = [f"node {r.node}: {r.note}" for r in hung if r.note]
    if failed:
        parts.append("; ".join(failed)[:200])
    if not hardware:
        parts.append("retried once" if code == NODE_FAULT_EXIT else f"a hang again on attempt {attempt}")
    return code, "; ".join(parts)


@dataclass(frozen=True)
class Watch:
    pid: int
    launcher: int
    directory: Path
    hang_seconds: float
    node: int
    nodes: int
    attempt: int
    since: float
    job: str
    uri: str | None
    out: Path | None
    hangs: Path | None
    report_to: str | None
    report_port: int
    within: float
    poll: float

    @property
    def main(self) -> bool:
        return self.out is not None


def say(text: str) -> None:
    print(f"progress_watch.py: {text}", file=sys.stderr, flush=True)


def examine(watch: Watch, progress: Progress, environ: Mapping[str, str]) -> NodeReport:
    """This node's hang report: its ranks' stacks and flight-recorder files, uploaded; its hardware."""
    host = socket.gethostname()
    ranks = find_ranks(watch.pid)
    evidence = watch.directory / "evidence"
    shutil.rmtree(evidence, ignore_errors=True)
    notes = collect(ranks, evidence, environ.get("TORCH_FR_DUMP_TEMP_FILE", ""))
    report = NodeReport(watch.node, host, HUNG, progress.last, progress.limit, progress.source)
    report.ranks = [(r.rank, r.state) for r in ranks]
    if watch.uri:
        failure = upload(watch.uri, evidence)
        if failure:
            notes.append(f"evidence upload failed ({failure}); stacks in this node's log")
        else:
            report.evidence = watch.uri
    if not report.evidence:
        for path in sorted(evidence.glob("stacks-rank-*.txt")):
            sys.stderr.write(path.read_text())
    report.note = "; ".join(notes)[:240]
    report.hardware = node_fault.judge(environ, watch.since, settle=0)
    idle = time.time() - (progress.last or 0.0)
    say(
        f"node {watch.node} ({host}): no progress for {idle:.0f} s (limit {progress.limit:.0f} s, by its "
        f"{progress.source}); ranks {report.ranks}; evidence {report.evidence or 'in this log'}"
        + (f"; {report.note}" if report.note else "")
        + "; the attempt ends once every node has stopped"
    )
    return report


def _children(hangs: Path | None) -> dict[int, NodeReport]:
    """The children's latest reports, from the file the main node's listener appends to."""
    latest: dict[int, NodeReport] = {}
    if hangs is None or not hangs.exists():
        return latest
    for line in hangs.read_text().splitlines():
        try:
            fields = json.loads(line)
            fields["ranks"] = [tuple(r) for r in fields.get("ranks", [])]
            report = NodeReport(**fields)
        except (ValueError, TypeError):
            continue
        latest[report.node] = report
    return latest


def run(watch: Watch, environ: Mapping[str, str] = os.environ) -> int:
    progress = Progress(watch.hang_seconds, watch.directory / "heartbeat", watch.directory / "output")
    mine: NodeReport | None = None
    examined = 0.0
    while alive(watch.pid) and alive(watch.launcher):
        now = time.time()
        progress.sample()
        state = progress.state(now)
        # Again every limit while it lasts: a node quiet for hours (its ranks log nothing, the others train)
        # has fresh stacks when the whole job stops.
        if state == HUNG and (mine is None or now - examined >= progress.limit):
            mine, examined = examine(watch, progress, environ), now
            if not watch.main:
                tell(watch, mine)
        elif state == PROGRESSING and mine is not None:
            say(f"node {watch.node}: progress again")
            if not watch.main:
                host = socket.gethostname()
                tell(watch, NodeReport(watch.node, host, PROGRESSING, progress.last, progress.limit, progress.source))
            mine = None
        if watch.main and watch.out is not None:
            reports = _children(watch.hangs)
            reports[watch.node] = mine or NodeReport(watch.node, "", PROGRESSING, None, 0, "")
            decided = verdict(reports, watch.nodes, watch.attempt, now)
            if decided:
                code, line = decided
                tmp = watch.out.with_suffix(".tmp")
                tmp.write_text(f"{code} {line}\n")
                tmp.replace(watch.out)
                os.kill(watch.launcher, signal.SIGUSR1)
                # The launcher's stop (SIGTERM) stays pending on a rank a signal stopped: continue it, so
                # that the stop ends it now rather than torchrun's SIGKILL 30 s later.
                for rank in find_ranks(watch.pid):
                    if rank.state in ("T", "t"):
                        os.kill(rank.pid, signal.SIGCONT)
                if mine is not None and mine.hardware:
                    node_fault.mark(environ, f"hang, hardware fault: {mine.hardware}")
                return 0
        time.sleep(watch.poll)
    return 0


def tell(watch: Watch, report: NodeReport) -> None:
    """A child's report to the main node; a child with a hardware sign then asks for its take-out."""
    if watch.report_to:
        payload = f"{node_fault.HANG_REPORT} {watch.job} {json.dumps(asdict(report), separators=(',', ':'))}"
        if not node_fault.send(watch.report_to, watch.report_port, payload, watch.within):
            say(f"could not tell the main node {watch.report_to}:{watch.report_port}")
    if report.hardware and report.state == HUNG:
        node_fault.mark(os.environ, f"hang, hardware fault: {report.hardware}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("relay")
    p.add_argument("--fd", type=int, choices=(1, 2), required=True)
    p.add_argument("--mark", type=Path, help="stamped whenever output arrives (the hang watch's progress)")
    p.add_argument("--tail", type=Path, help="where the stream's last bytes are kept")
    p = commands.add_parser("watch")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--launcher", type=int, required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--hang-seconds", type=float, required=True)
    p.add_argument("--node", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--since", type=float, default=0.0)
    p.add_argument("--job", default="local")
    p.add_argument("--uri", help="where this node's evidence goes: s3://bucket/prefix/")
    p.add_argument("--out", type=Path, help="main node: the launcher's report file")
    p.add_argument("--hangs", type=Path, help="main node: the children's hang reports (node_fault.py listen)")
    p.add_argument("--report-to")
    p.add_argument("--report-port", type=int, default=0)
    p.add_argument("--within", type=float, default=60.0)
    p.add_argument("--poll", type=float, default=float(os.environ.get("HANG_POLL_SECONDS") or 5))
    args = parser.parse_args(argv)
    if args.command == "relay":
        return relay(args.fd, args.mark, args.tail)
    watch = Watch(
        args.pid, args.launcher, args.dir, args.hang_seconds, args.node, args.nodes, args.attempt, args.since,
        args.job, args.uri, args.out, args.hangs, args.report_to, args.report_port, args.within, args.poll,
    )  # fmt: skip
    return run(watch)


if __name__ == "__main__":
    sys.exit(main())
