"""The main node's hang verdict (container/launcher/hang_verdict.py) on hand-written reports and files: which
node is named (a rank stopped by a signal, else a rank outside any collective while others wait in one,
else the oldest progress), children that ended or never said a word, and the stacks a hung node reads
(hang_evidence.py) and uploads again only when they changed (progress_watch.examine)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.test_hang_watch import retried

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import ending  # noqa: E402
import hang_evidence as evidence  # noqa: E402
import hang_verdict as verdicts  # noqa: E402
import node_fault  # noqa: E402
import progress_signals as signals  # noqa: E402
import progress_watch as watch  # noqa: E402

# What py-spy 0.4 prints (dumped from a rank in a gloo all_reduce and from one asleep in user code).
IN_ALL_REDUCE = """Process 26641: python /tmp/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 26641 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
    <module> (train.py:10)
Thread 26650 (idle): "Thread-1 (_pin_memory_loop)"
    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:59)
"""
ASLEEP = """Process 26642: python /tmp/train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 26642 (idle): "MainThread"
    stalled_in_user_code (train.py:6)
    <module> (train.py:8)
"""
IN_BACKWARD = """Thread 7 (active): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:829)
    backward (torch/autograd/__init__.py:347)
    backward (torch/_tensor.py:626)
    train (train.py:40)
"""


def test_the_innermost_frame_of_the_main_thread_says_whether_a_rank_waits_on_its_peers():
    assert evidence.innermost(IN_ALL_REDUCE) == "all_reduce (torch/distributed/distributed_c10d.py:3252)"
    assert evidence.in_collective(evidence.innermost(IN_ALL_REDUCE) or "")
    assert evidence.in_collective(evidence.innermost(IN_BACKWARD) or "")  # DDP waits for its all-reduce there
    assert evidence.innermost(ASLEEP) == "stalled_in_user_code (train.py:6)"
    assert not evidence.in_collective("stalled_in_user_code (train.py:6)")
    assert evidence.in_collective("barrier (deepspeed/comm/comm.py:420)")
    assert evidence.in_collective("wait (my_trainer/sync.py:12)")
    assert evidence.innermost("py-spy could not read this rank's stacks: Permission denied\n") is None


def report(
    node: int, last: float | None, state: str = signals.HUNG, *, ranks: Any = None, **extra: Any
) -> verdicts.NodeReport:
    extra.setdefault("heartbeat", True)
    ranks = ranks if ranks is not None else [(node, "S")]
    return verdicts.NodeReport(node, f"host-{node}", state, last, 300, "heartbeat", ranks=ranks, **extra)


def test_a_rank_outside_any_collective_while_its_peers_wait_is_named_though_it_spoke_last():
    # Node 0's rank waits in the all-reduce; node 1's rank logged once more and fell asleep in user code.
    waiting, asleep = report(0, 5000.1, waiting=[0]), report(1, 5000.4, outside=[(1, "stalled_in_user_code (t.py:6)")])
    code, line = verdicts.verdict({0: waiting, 1: asleep}, 2, attempt=1, now=5301)
    assert line.startswith("node 1 (host-1): hang: ")
    assert (
        "rank 1 on node 1 stopped first (last progress 01:23:20 UTC, outside any collective while rank 0 waits" in line
    )
    assert "in one: rank 1 in stalled_in_user_code (t.py:6)" in line and code == 75
    # Without a rank waiting in a collective anywhere (NCCL's wait for the device shows as user code), the
    # stacks say nothing: the oldest progress is named.
    both_outside = {0: report(0, 5000.1, outside=[(0, "train (t.py:40)")]), 1: asleep}
    assert verdicts.verdict(both_outside, 2, 1, 5301)[1].startswith("node 0 (host-0)")
    # A rank stopped by a signal comes first.
    stopped = report(0, 5000.1, ranks=[(0, "T")], waiting=[])
    assert "rank 0 on node 0 stopped first" in verdicts.verdict({0: stopped, 1: asleep}, 2, 1, 5301)[1]


def test_a_child_that_ended_does_not_hold_the_verdict_back(tmp_path):
    faults = tmp_path / "faults"
    (faults / "children").mkdir(parents=True)
    reports = {0: report(0, 5000.0), 2: report(2, 5000.2)}
    assert verdicts.verdict(reports, 3, 1, 5301, verdicts.ended_children(faults)) is None  # node 1: no word yet
    ending = {"node": 1, "code": 0, "line": "node 1: training finished"}
    (faults / "children" / "node-1").write_text(json.dumps(ending))
    (faults / "children" / "node-9").write_text("{not json")
    ended = verdicts.ended_children(faults)
    assert ended == {1: verdicts.Ended(1, 0, "node 1: training finished")}
    code, line = verdicts.verdict(reports, 3, 1, 5301, ended)
    assert code == 75 and "node 1 had ended (exit 0)" in line and "no word" not in line
    # An ended child is not waited for, but the nodes still training are: a progressing one holds it back.
    progressing = {**reports, 2: report(2, 5290.0, signals.PROGRESSING)}
    assert verdicts.verdict(progressing, 3, 1, 5301, ended) is None


def test_a_child_never_heard_from_holds_the_verdict_back_only_for_the_limit_and_a_minute(tmp_path):
    hangs = tmp_path / "hangs"
    hello = verdicts.NodeReport(2, "host-2", signals.PROGRESSING, None, 300, "")  # a child's watch at its start
    hangs.write_text(json.dumps(asdict(report(1, 5000.3))) + "\n" + json.dumps(asdict(hello)) + "\n")
    heard = verdicts.children(hangs) | {0: report(0, 5000.0)}
    # Node 2 said it is there and never hung: it progresses, and the verdict waits for it however long.
    assert verdicts.verdict(heard, 3, 1, 5000 + 10**6) is None
    # Node 2 never said a word (it cannot reach the listener, or runs no watch): until every hung node has
    # been quiet for its limit and a minute, its report may still be on its way.
    silent = {n: r for n, r in heard.items() if n != 2}
    assert verdicts.verdict(silent, 3, 1, 5000.3 + 300 + 59) is None
    code, line = verdicts.verdict(silent, 3, 1, 5000.3 + 300 + 60)
    assert code == 75 and "node 2: no word from it" in line
    assert line.startswith("node 0 (host-0): hang: no progress on any node for 360 s")


def test_without_a_heartbeat_a_second_hang_is_retried_again():
    quiet = {0: report(0, 5000.0, heartbeat=False), 1: report(1, 5000.1, heartbeat=False)}
    code, line = verdicts.verdict(quiet, 2, attempt=2, now=5400)
    assert code == 75 and line.endswith(
        "retried (no node touched TRAINING_HEARTBEAT_FILE: a hang is final only with it)"
    )
    quiet[1].heartbeat = True
    assert verdicts.verdict(quiet, 2, attempt=2, now=5400)[0] == verdicts.HANG_EXIT


# --- the oldest progress, the children's latest reports, and the exit code ---------------------------


def test_the_node_whose_last_progress_is_oldest_is_named_and_the_job_ends_only_when_every_node_stopped():
    reports = {0: report(0, 5000.4), 1: report(1, 5000.1), 2: report(2, 5000.3)}
    code, line = verdicts.verdict(reports, 3, attempt=1, now=5301)
    assert code == 75
    assert line.startswith("node 1 (host-1): hang: no progress on any node for 301 s")
    assert "node 1 (ranks 1) stopped first" in line and "retried once" in line
    # One node still progressing, or one not heard from: no verdict.
    assert verdicts.verdict({**reports, 2: report(2, 5200, signals.PROGRESSING)}, 3, 1, 5301) is None
    assert verdicts.verdict({0: reports[0], 1: reports[1]}, 3, 1, 5301) is None
    # A node whose last output came long ago (rank-0-only logging) is not the cause; a stopped rank is.
    quiet = {0: report(0, 5000.4), 1: report(1, 100.0), 2: report(2, 5000.3)}
    assert verdicts.verdict(quiet, 3, 1, 5301)[1].startswith("node 2 (host-2)")
    stopped_rank = verdicts.NodeReport(1, "h1", signals.HUNG, 5000.4, 300, "output", [(2, "S"), (3, "T")])
    stopped = {0: report(0, 5000.1), 1: stopped_rank}
    assert "rank 3 on node 1 stopped first" in verdicts.verdict(stopped, 2, 1, 5301)[1]


def test_a_child_whose_progress_resumed_holds_the_verdict_back(tmp_path):
    """The main node reads the children's latest report each (node_fault.py listen appends them)."""
    hangs = tmp_path / "hangs"
    lines = [report(1, 5000.0), report(1, 5310.0, signals.PROGRESSING)]
    hangs.write_text("".join(json.dumps(asdict(r)) + "\n" for r in lines) + "not json\n")
    children = verdicts.children(hangs)
    assert children[1].state == signals.PROGRESSING
    assert verdicts.verdict({**children, 0: report(0, 5000.0)}, 2, 1, 5320) is None
    hangs.write_text(hangs.read_text() + json.dumps(asdict(report(1, 5311.0))) + "\n")
    assert verdicts.verdict({**verdicts.children(hangs), 0: report(0, 5000.0)}, 2, 1, 5620) is not None


def test_a_hang_is_retried_once_then_reported_and_a_hardware_sign_makes_it_a_node_fault():
    assert [verdicts.hang_exit(attempt, hardware=False, heartbeat=True) for attempt in (1, 2, 3)] == [75, 124, 124]
    assert verdicts.hang_exit(2, hardware=True, heartbeat=True) == 75
    # Without a heartbeat silence is never proof enough: every attempt is retried.
    assert [verdicts.hang_exit(attempt, hardware=False, heartbeat=False) for attempt in (1, 2, 3)] == [75, 75, 75]
    assert retried(verdicts.hang_exit(1, hardware=False, heartbeat=True))
    assert not retried(verdicts.hang_exit(2, hardware=False, heartbeat=True))
    # The launcher ends the main node with the watch's code (ending.for_report keeps 124: not retried).
    assert ending.HANG_EXIT == verdicts.HANG_EXIT == watch.HANG_EXIT and ending.HANG_EXIT in ending.FINAL_CODES
    reports = {0: report(0, 5000, hardware="NVIDIA Xid needing a GPU reset or a new node: 79")}
    code, line = verdicts.verdict(reports, 1, attempt=2, now=5400)
    assert code == 75 and "node 0 shows a hardware fault: NVIDIA Xid" in line and "retried once" not in line


# --- a hung node looks again, and uploads only what changed --------------------------------------------


def test_a_hung_node_uploads_and_reports_its_stacks_again_only_when_they_changed(tmp_path, monkeypatch):
    rank = evidence.Rank(4242, 0, "S")
    dumps = iter([ASLEEP, ASLEEP.replace("(idle)", "(active)"), IN_ALL_REDUCE])
    uploads: list[list[str]] = []

    def upload(uri: str, directory: Path) -> None:
        uploads.append(sorted(p.name for p in directory.rglob("*") if p.is_file()))

    monkeypatch.setattr(watch, "find_ranks", lambda pid: [rank])
    monkeypatch.setattr(evidence, "dump_stacks", lambda r: (next(dumps), True))
    monkeypatch.setattr(watch, "upload", upload)
    monkeypatch.setattr(watch.node_fault, "judge", lambda environ, since, settle: None)
    node = watch.Watch(1, 1, tmp_path, 300, 1, 2, 1, 0.0, "j", "s3://b/e/", None, None, None, 0, 1, 1)
    progress = signals.Progress(300, tmp_path / "heartbeat", tmp_path / "output")
    progress.last, progress.source = 1000.0, signals.OUTPUT
    first = watch.examine(node, progress, {}, None)
    assert first.changed and first.report.outside == [(0, "stalled_in_user_code (train.py:6)")]
    assert first.report.evidence == "s3://b/e/" and uploads == [["stacks-rank-0.txt"]]
    # The same stacks (py-spy's idle/active mark aside): nothing uploaded, nothing to tell the main node.
    again = watch.examine(node, progress, {}, first)
    assert not again.changed and again.report is first.report and len(uploads) == 1
    moved = watch.examine(node, progress, {}, again)
    assert moved.changed and moved.report.waiting == [0] and len(uploads) == 2


def test_a_report_from_a_node_of_many_ranks_fits_the_listeners_line(tmp_path, monkeypatch):
    ranks = [evidence.Rank(5000 + r, r, "S") for r in range(64)]
    long_frame = ASLEEP.replace("stalled_in_user_code", "a_very_long_function_name_" * 8)
    monkeypatch.setattr(watch, "find_ranks", lambda pid: ranks)
    monkeypatch.setattr(evidence, "dump_stacks", lambda r: (long_frame, True))
    monkeypatch.setattr(watch, "upload", lambda uri, directory: "AccessDenied: " + "x" * 300)
    monkeypatch.setattr(watch.node_fault, "judge", lambda environ, since, settle: "NVIDIA Xid 79 " + "y" * 300)
    node = watch.Watch(
        1, 1, tmp_path, 300, 1, 2, 1, 0.0, "j" * 36, "s3://" + "b" * 200 + "/", None, None, None, 0, 1, 1
    )
    progress = signals.Progress(300, tmp_path / "heartbeat", tmp_path / "output")
    progress.last, progress.source = 1000.0, signals.OUTPUT
    report = watch.examine(node, progress, {}, None).report
    payload = f"hang {node.job} {json.dumps(asdict(report), separators=(',', ':'))}"
    assert len(payload.encode()) < node_fault.REPORT_BYTES and len(report.outside) == 8
    assert verdicts.NodeReport.parse(json.dumps(asdict(report))) == report


def test_the_line_states_the_largest_limit_the_verdict_waited_for():
    """Every node must be past its own limit: the catalog judges a hang against the limit the line states."""
    stalled = verdicts.NodeReport(1, "h1", signals.HUNG, 5000.0, 30, "heartbeat", [(1, "T")])
    waiting = verdicts.NodeReport(0, "h0", signals.HUNG, 5000.5, 70, "heartbeat", [(0, "S")])
    decided = verdicts.verdict({0: waiting, 1: stalled}, 2, 1, 5071.0)
    assert decided is not None
    assert "(limit 70 s)" in decided[1] and "on node 1 stopped first" in decided[1]
