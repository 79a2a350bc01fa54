"""Straggler watch for distributed_run.sh, on every node of a multi-node job: which node trains slower than
the others (straggler_score.py says how it is judged; step_timing.py, loaded into every rank, measures).

    straggler_watch.py --dir TIMING --pid LAUNCHER --job J --node I --window S --saved FILE
        --report-to ADDRESS --report-port P                                        # a child
        --children DIR --order FILE [--ratio R --min-excess-ms M --windows K
        --action report|replace --out REPORT --marker-uri URI --attempt A --log-windows]  # the main node

Every window each rank's step_timing.py appends a line to TIMING/rank-<RANK>.txt; a node's watch takes each
rank's newest line. A child sends its ranks' medians to the main node's listener (node_fault.py) as
"pace <job> <json>", and "saved <job> <json>" whenever its checkpoint copier finished an upload (FILE, written
by checkpoint_sync.py). The main node scores each window (its own ranks' and the paces received since the
last window) and prints, in the job's log:
- per window a node counts as slow in: one embedded-metric line, StragglerWindows (dimension Fleet), with the
  job, node, rank, instance, AZ and ratio as properties;
- once when a node becomes a straggler: "straggler_watch.py: straggler: node N (instance ..., AZ ...), rank
  R: ... ms ..., X.XXx the other nodes' ...", and once when it is back in line.
With --action replace, once the straggler's streak holds and a checkpoint upload completed after it was named
(any node's), the straggler is told to end the attempt as a node fault: a child through the listener's
answer to its next line (CHILDREN/node-<n>.order, node_fault.py beat), the main node through its own order
file and SIGUSR1 to its launcher. Its launcher then ends as a node fault whose host takes it out
(failure_phase.py). Before acting, the watch writes MARKER_URI; a job whose previous attempt replaced a node
does not replace another (it reports) until a person resubmits it. A child that does not end within
ORDER_SECONDS is ended from the main node (exit 75, no take-out). Stdlib only, Python 3.10; boto3 for the
marker (as checkpoint_sync.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import node_fault  # beside this file in every image
from cold_start import alive
from ending import NODE_FAULT_EXIT
from report_listener import ADDRESS_UNKNOWN
from straggler_record import describe, emf_line, previous_replacement, where, write_marker
from straggler_score import NodeScore, StragglerWatch, Thresholds

PACE = "pace"
SAVED = "saved"
ORDER = "straggler"  # the first word of an order (node_fault.py beat acts on it)
# A child hears its order with its next keepalive (5 s), stops its trainer (up to TRAINER_STOP_SECONDS, 20 s)
# and reports (seconds): past this the main node ends the attempt itself.
ORDER_SECONDS = 60.0
TICK_SECONDS = 1.0


@dataclass
class RankLines:
    """The rank files of one node, read from where the last read ended."""

    folder: Path
    offsets: dict[Path, int] = field(default_factory=dict)

    def newest(self) -> dict[int, float]:
        """rank -> the median of its newest window written since the last call."""
        found: dict[int, float] = {}
        for path in sorted(self.folder.glob("rank-*.txt")) if self.folder.is_dir() else []:
            rank = path.stem.removeprefix("rank-")
            try:
                with path.open("rb") as lines:
                    lines.seek(self.offsets.get(path, 0))
                    text = lines.read()
            except OSError:
                continue
            whole = text[: text.rfind(b"\n") + 1]  # a line being written waits for the next read
            self.offsets[path] = self.offsets.get(path, 0) + len(whole)
            for line in whole.decode(errors="replace").splitlines():
                parts = line.split()
                with contextlib.suppress(ValueError, IndexError):
                    if rank.isdigit():
                        found[int(rank)] = float(parts[1])
        return found


def saved_at(path: Path | None) -> float:
    try:
        return float(path.read_text().strip()) if path is not None else 0.0
    except (OSError, ValueError):
        return 0.0


def say(text: str) -> None:
    print(f"straggler_watch.py: {text}", flush=True)


@dataclass
class MainWatch:
    args: argparse.Namespace
    thresholds: Thresholds
    own: RankLines
    watch: StragglerWatch
    places: dict[int, tuple[str, str]] = field(default_factory=dict)
    named: dict[int, NodeScore] = field(default_factory=dict)  # stragglers now
    pending: tuple[NodeScore, float] | None = None  # the straggler to replace, and since when
    replace_off: str | None = None  # why this attempt does not replace
    scored: dict[Path, int] = field(default_factory=dict)  # each child's pace file, as of the pace last scored
    seen: set[int] = field(default_factory=set)  # the nodes whose timings came in
    scored_windows: int = 0
    said_quiet: bool = False

    def window(self) -> dict[int, dict[int, list[float]]]:
        window: dict[int, dict[int, list[float]]] = {}
        own = self.own.newest()
        if own:
            window[self.args.node] = {rank: [value] for rank, value in own.items()}
        for path in self.args.children.glob("node-*.pace"):
            try:
                written = path.stat().st_mtime_ns
                if self.scored.get(path) == written:
                    continue  # scored in an earlier window: no new pace since
                pace = json.loads(path.read_text())
                node = int(pace["node"])
                ranks = {int(rank): [float(value)] for rank, value in dict(pace["ranks"]).items()}
            except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
                continue
            self.scored[path] = written
            if node != self.args.node and 0 <= node < self.args.nodes and ranks:
                window[node] = ranks
                self.places[node] = (str(pace.get("instance", "?"))[:40], str(pace.get("az", "?"))[:40])
        return window

    def tick(self) -> None:
        window = self.window()
        self.seen |= set(window)
        scores, found = self.watch.add(window)
        self.scored_windows += bool(scores)
        if self.args.log_windows and scores:
            said = (
                f"node {n} rank {r.rank} {r.seconds * 1000:.1f} ms {r.ratio:.2f}x" for n, r in sorted(scores.items())
            )
            say(f"window: {'; '.join(said)}")
        for node, result in scores.items():
            instance, az = self.places.get(node, ("?", "?"))
            if result.slow:
                print(emf_line(self.args.fleet, self.args.job, result, instance, az), flush=True)
            if node in self.named and not result.slow:
                del self.named[node]
                say(f"node {node} is back in line: {result.ratio:.2f}x the other nodes' median")
                if self.pending is not None and self.pending[0].node == node:
                    self.pending = None
                    say(f"node {node} is not replaced: it is back in line")
        for result in found:
            if result.node in self.named:
                continue
            self.named[result.node] = result
            instance, az = self.places.get(result.node, ("?", "?"))
            text = describe(result, instance, az, self.thresholds, self.args.window)
            if self.replace_off is None and (self.args.children / ADDRESS_UNKNOWN).exists():
                self.replace_off = "the listener takes the paces unchecked (no batch:DescribeJobs for the node watch)"
            if self.args.action != "replace":
                say(f"straggler: {text}; reporting only (STRAGGLER_ACTION=report)")
            elif self.replace_off is not None:
                say(f"straggler: {text}; not replaced: {self.replace_off}")
            elif self.pending is None:
                say(f"straggler: {text}; replacing it after the next checkpoint (STRAGGLER_ACTION=replace)")
                self.pending = (result, time.time())
            else:
                say(f"straggler: {text}; one straggler is replaced at a time (node {self.pending[0].node} first)")

    def quiet(self, watched: float) -> str | None:
        """Once, after three windows without a score: why none was scored (no timings at all, or from one
        node only), so that a watch that cannot work says so instead of looking like a healthy job."""
        if self.said_quiet or self.scored_windows or watched < 3 * self.args.window:
            return None
        self.said_quiet = True
        if not self.seen:
            return (
                f"no step timings from any node after {watched:.0f} s: the training processes use no "
                'DistributedDataParallel the launcher can time (docs/health.md, "Slow nodes")'
            )
        nodes = ", ".join(map(str, sorted(self.seen)))
        return (
            f"after {watched:.0f} s step timings from node {nodes} only: no window scored (a node compares with "
            "the others; their watches send to the listener's port)"
        )

    def ending(self) -> bool:
        """The attempt is ending already (the trainer stopped or failed, or a report came): a replacement now
        would turn another ending into a node fault."""
        state = self.args.saved.parent if self.args.saved is not None else None
        stopping = state is not None and any((state / name).exists() for name in ("stopping", "status"))
        return stopping or (self.args.out is not None and self.args.out.exists())

    def saved_since(self, since: float) -> bool:
        if saved_at(self.args.saved) > since:
            return True
        for path in self.args.children.glob("node-*.saved"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                if float(json.loads(path.read_text())["at"]) > since:
                    return True
        return False

    def replace(self) -> None:
        """The pending straggler ends the attempt: the checkpoint it waited for is in S3."""
        assert self.pending is not None
        result, _ = self.pending
        self.pending = None
        self.replace_off = "this attempt replaced one already"
        instance, az = self.places.get(result.node, ("?", "?"))
        record = {"attempt": self.args.attempt, "node": result.node, "instance": instance, "az": az,
                  "rank": result.rank, "ratio": round(result.ratio, 3), "at": time.time()}  # fmt: skip
        if self.args.marker_uri:
            failed = write_marker(self.args.marker_uri, record)
            if failed is not None:
                say(f"node {result.node} is not replaced: its record could not be written to "
                    f"{self.args.marker_uri} ({failed}), and without it a retry could replace again")  # fmt: skip
                return
        order = (
            f"{ORDER} straggler: rank {result.rank} {result.ratio:.2f}x the other nodes' median "
            f"({result.seconds * 1000:.1f} vs {result.others * 1000:.1f} ms per step, instance {instance}, "
            f"AZ {az}); replaced after the checkpoint"
        )
        say(f"a checkpoint upload completed: node {result.node} ends this attempt as a node fault")
        if result.node == self.args.node:
            write_order(self.args.order, order.removeprefix(ORDER + " "))
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.args.pid, signal.SIGUSR1)
            return
        write_order(self.args.children / f"node-{result.node}.order", order)
        deadline = time.monotonic() + ORDER_SECONDS
        while time.monotonic() < deadline and alive(self.args.pid):
            if (self.args.children / f"node-{result.node}").exists():
                return  # its ending came (node_fault.py listen): the launcher judges from it
            time.sleep(TICK_SECONDS)
        if alive(self.args.pid) and self.args.out is not None:
            node_fault.deliver(
                self.args.out, self.args.pid, NODE_FAULT_EXIT,
                f"node {result.node}: a straggler ({order.removeprefix(ORDER + ' straggler: ')}) that did not end "
                f"within {ORDER_SECONDS:.0f} s of its order; ending the attempt from the main node",
            )  # fmt: skip


def write_order(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def run_main(args: argparse.Namespace) -> int:
    thresholds = Thresholds(args.ratio, args.min_excess_ms / 1000, args.windows)
    main = MainWatch(args, thresholds, RankLines(args.dir), StragglerWatch(thresholds))
    main.places[args.node] = where()
    if args.action == "replace" and not args.verified:
        main.replace_off = "the listener cannot check who sends the paces here (not on Batch)"
    if args.action == "replace" and args.marker_uri and main.replace_off is None:
        main.replace_off = previous_replacement(args.marker_uri, args.attempt)
        if main.replace_off is not None:
            say(f"STRAGGLER_ACTION=replace: {main.replace_off}; a node is not replaced twice in a row without a "
                "person (resubmit the job): this attempt reports stragglers only")  # fmt: skip
    started = time.monotonic()
    next_window = started + args.window
    while alive(args.pid):
        time.sleep(TICK_SECONDS)
        now = time.monotonic()
        if now >= next_window:
            next_window = now + args.window
            try:
                main.tick()
            except Exception as error:  # a window that cannot be scored must not end the watch: said, then on
                say(f"a window not scored: {error!r:.200}")
            quiet = main.quiet(now - started)
            if quiet:
                say(quiet)
        if main.pending is not None and main.ending():
            say(f"node {main.pending[0].node} is not replaced: this attempt is ending already")
            main.pending = None
        elif main.pending is not None and main.saved_since(main.pending[1]):
            main.replace()
    return 0


def run_child(args: argparse.Namespace) -> int:
    lines = RankLines(args.dir)
    instance, az = where()
    last_saved = saved_at(args.saved)
    next_window = time.monotonic() + args.window
    while alive(args.pid):
        time.sleep(TICK_SECONDS)
        stamp = saved_at(args.saved)
        if stamp > last_saved:
            last_saved = stamp
            payload = json.dumps({"node": args.node, "at": stamp}, separators=(",", ":"))
            node_fault.send(args.report_to, args.report_port, f"{SAVED} {args.job} {payload}", within=2)
        if time.monotonic() >= next_window:
            next_window = time.monotonic() + args.window
            ranks = lines.newest()
            if ranks:
                pace = {"node": args.node, "ranks": ranks, "instance": instance, "az": az}
                payload = json.dumps(pace, separators=(",", ":"))
                node_fault.send(args.report_to, args.report_port, f"{PACE} {args.job} {payload}", within=2)
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the ranks' timing folder (STRAGGLER_TIMING_DIR)")
    parser.add_argument("--pid", type=int, required=True, help="the launcher's")
    parser.add_argument("--job", required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--saved", type=Path, help="checkpoint_sync.py's stamp of its last upload")
    parser.add_argument("--report-to")
    parser.add_argument("--report-port", type=int)
    parser.add_argument("--children", type=Path, help="the listener's folder (the main node)")
    parser.add_argument("--order", type=Path, help="this node's order file (the launcher reads it)")
    parser.add_argument("--out", type=Path, help="the main node's report file")
    parser.add_argument("--nodes", type=int, default=1 << 20, help="the job's node count")
    parser.add_argument("--verified", action="store_true", help="the listener checks each line's sender (Batch)")
    parser.add_argument("--ratio", type=float, default=Thresholds.ratio)
    parser.add_argument("--min-excess-ms", type=float, default=Thresholds.min_excess_seconds * 1000)
    parser.add_argument("--windows", type=int, default=Thresholds.windows)
    parser.add_argument("--action", choices=("report", "replace"), default="report")
    parser.add_argument("--marker-uri", default="")
    parser.add_argument("--attempt", type=int, default=1)
    parser.add_argument("--fleet", default=os.environ.get(node_fault.FLEET_ENV, "unknown"))
    parser.add_argument("--log-windows", action="store_true", help="a line per window with every node's score")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.children is not None:
        return run_main(args)
    if args.report_to is None or args.report_port is None:
        print("straggler_watch.py: a child needs --report-to and --report-port", file=sys.stderr)
        return 2
    return run_child(args)


if __name__ == "__main__":
    sys.exit(main())
