"""Hang watch for distributed_run.sh: every node watches its trainer's progress, and a job in which no node
makes progress ends within minutes, with each node's Python stacks beside the job's checkpoints.

    progress_watch.py relay --fd 1|2 --mark FILE     # copy the trainer's output, stamping FILE's mtime
    progress_watch.py watch --pid PID --launcher PID --dir DIR --hang-seconds N --node I --nodes N
        [--checkpoint-dir CHECKPOINT_DIR] [--uri S3_URI] [--out FILE --hangs FILE | --report-to ADDRESS ...]

Progress (progress_signals.py) is any of: the heartbeat file (TRAINING_HEARTBEAT_FILE, DIR/heartbeat: the
training script touches it once per step, on every rank), the trainer's output (the relay stamps
DIR/output), files changing under CHECKPOINT_DIR, disk I/O of the ranks and their descendants, and CPU time
of the processes the ranks started (never the ranks' own: a rank waiting in a collective spins). A node
hangs when none has moved for HANG_SECONDS, or for twice the longest silence it came back from where that
is longer; a node whose trainer never showed output or a heartbeat does not.

A hung node dumps the Python stacks of its ranks (py-spy; a SIGSTOPped rank with --nonblocking) and copies
PyTorch's flight-recorder files (TORCH_FR_DUMP_TEMP_FILE<rank>, written when NCCL's own watchdog times out),
uploads them to --uri (<checkpoint prefix>evidence/<job id>/attempt-<A>/node-<I>/), and tells the main node
through node_fault.py's channel ("hang <job> <json>", with its last progress, and which ranks wait in a
collective and which do not). It looks again every limit while it stays hung, and uploads and tells again
only when the stacks, the flight-recorder files or its hardware sign changed. A child's watch says it is
there when it starts, and a node whose progress resumes says so. The main node ends the attempt once no node
progresses (hang_verdict.py): one line naming the rank and node that stopped first and where the evidence
is, written to --out for the launcher (SIGUSR1), which ends the attempt with it. Exit code: 75 (retried on
fresh nodes) when a hung node shows a hardware sign (node_fault.py judge; that node is taken out), on the
first attempt, or when no node touched the heartbeat; HANG_EXIT (124, not retried by the job definitions)
from the second attempt on.
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
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import node_fault  # beside this file in every image
from cold_start import alive
from hang_evidence import collect, find_ranks, fingerprint, in_collective, innermost, ras_view, upload
from hang_verdict import HANG_EXIT as HANG_EXIT  # the launcher's code for a repeated hang, named here too
from hang_verdict import NodeReport, children, ended_children, verdict
from progress_signals import HUNG, PROGRESSING, Progress, Signals

CHUNK = 65536
# A report must fit the listener's 4096 bytes (node_fault.REPORT_BYTES) with 32 ranks or more on a node.
MAX_OUTSIDE, MAX_FRAME = 8, 80


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
    checkpoints: Path | None = None

    @property
    def main(self) -> bool:
        return self.out is not None


@dataclass(frozen=True)
class Examined:
    """A hung node's report, what its evidence said (hang_evidence.fingerprint) and when it was looked at."""

    report: NodeReport
    fingerprint: str
    at: float
    changed: bool


def say(text: str) -> None:
    print(f"progress_watch.py: {text}", file=sys.stderr, flush=True)


def examine(watch: Watch, progress: Progress, environ: Mapping[str, str], before: Examined | None) -> Examined:
    """This node's stacks, flight-recorder files and hardware sign; uploaded and said only when they differ
    from what was seen `before` (a hung node looks again every limit: a dump costs little, an upload and a
    report more, and the same stacks say nothing new)."""
    now = time.time()
    ranks = find_ranks(watch.pid)
    evidence = watch.directory / "evidence"
    shutil.rmtree(evidence, ignore_errors=True)
    notes, stacks = collect(ranks, evidence, environ.get("TORCH_FR_DUMP_TEMP_FILE", ""))
    ras = ras_view(evidence, environ)
    hardware = node_fault.judge(environ, watch.since, settle=0)
    seen = f"{hardware}\n{fingerprint(evidence)}"
    if before is not None and seen == before.fingerprint:
        return Examined(before.report, seen, now, changed=False)
    host = socket.gethostname()
    report = NodeReport(watch.node, host, HUNG, progress.last, progress.limit, progress.source)
    report.ranks = [(r.rank, r.state) for r in ranks]
    report.hardware, report.heartbeat, report.ras = hardware, progress.heartbeat_seen, ras
    for rank, text in sorted(stacks.items()):
        frame = innermost(text)
        if frame is not None and in_collective(frame):
            report.waiting.append(rank)
        elif frame is not None and len(report.outside) < MAX_OUTSIDE:
            report.outside.append((rank, frame[:MAX_FRAME]))
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
    idle = now - (progress.last or 0.0)
    say(
        f"node {watch.node} ({host}): no progress for {idle:.0f} s (limit {progress.limit:.0f} s, last by its "
        f"{progress.source}); ranks {report.ranks}, waiting in a collective {report.waiting}; evidence "
        f"{report.evidence or 'in this log'}"
        + (f"; {report.note}" if report.note else "")
        + (f"; {ras}" if ras else "")
        + "; the attempt ends once no node progresses"
    )
    return Examined(report, seen, now, changed=True)


def decide(watch: Watch, mine: NodeReport | None, now: float, environ: Mapping[str, str]) -> bool:
    """On the main node: the verdict once no node progresses, for the launcher. True once it is written."""
    if watch.out is None:
        return False
    reports = children(watch.hangs)
    reports[watch.node] = mine or NodeReport(watch.node, "", PROGRESSING, None, 0, "")
    ended = ended_children(watch.hangs.parent if watch.hangs else None)
    decided = verdict(reports, watch.nodes, watch.attempt, now, ended)
    if decided is None:
        return False
    code, line = decided
    # First wins, as for the listener and the node watch: a child's report already there is not replaced.
    node_fault.deliver(watch.out, watch.launcher, code, line)
    # The launcher's stop (SIGTERM) stays pending on a rank a signal stopped: continue it, so that the stop
    # ends it now rather than torchrun's SIGKILL 30 s later.
    for rank in find_ranks(watch.pid):
        if rank.state in ("T", "t"):
            os.kill(rank.pid, signal.SIGCONT)
    if mine is not None and mine.hardware:
        node_fault.mark(environ, f"hang, hardware fault: {mine.hardware}")
    return True


def run(watch: Watch, environ: Mapping[str, str] = os.environ) -> int:
    signals = Signals(watch.pid, watch.checkpoints)
    progress = Progress(watch.hang_seconds, watch.directory / "heartbeat", watch.directory / "output", signals)
    if not watch.main:
        # The main node waits for word from every child before it calls a hang without it (hang_verdict.py).
        tell(watch, NodeReport(watch.node, socket.gethostname(), PROGRESSING, None, watch.hang_seconds, ""))
    examined: Examined | None = None
    while alive(watch.pid) and alive(watch.launcher):
        now = time.time()
        progress.sample(now)
        state = progress.state(now)
        if state == HUNG and (examined is None or now - examined.at >= progress.limit):
            examined = examine(watch, progress, environ, examined)
            if examined.changed and not watch.main:
                tell(watch, examined.report)
        elif state == PROGRESSING and examined is not None:
            say(f"node {watch.node}: progress again (by its {progress.source})")
            if not watch.main:
                host = socket.gethostname()
                tell(watch, NodeReport(watch.node, host, PROGRESSING, progress.last, progress.limit, progress.source))
            examined = None
        if decide(watch, examined.report if examined else None, now, environ):
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
    p.add_argument("--checkpoint-dir", type=Path, help="CHECKPOINT_DIR: files changing there are progress")
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
        args.checkpoint_dir,
    )  # fmt: skip
    return run(watch)


if __name__ == "__main__":
    sys.exit(main())
