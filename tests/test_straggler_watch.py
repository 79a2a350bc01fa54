"""The straggler watch's parts (container/launcher/straggler_watch.py and what it rests on): its settings, the
rank lines it reads, the listener's pace and saved lines and its answer with an order, the beat acting on an
order, the main node's windows (a straggler named with its instance and AZ, a healthy pair left alone), the
replacement after a checkpoint (never twice in a row), and `why`'s sentences from the watch's lines. The whole
path runs in the fault catalog (slow-node, slow-node-replaced, no-straggler)."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import boto3
import pytest
from moto import mock_aws

from config import metrics
from tests.harness import ROOT
from trainctl.errors import TrainctlError
from trainctl.inspecting import stragglers
from trainctl.rehearsal.faults import parse_fault
from training_constructs.health.node_scripts import boot_check

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import ending
import failure_phase
import node_fault
import straggler_record
import straggler_watch
import watchers
from node_settings import BadInput, read_settings
from node_state import NodeState
from report_listener import Connections, Line, Senders
from stop_signals import StopSignals
from straggler_score import StragglerWatch, Thresholds


def settings(**env: str):
    return read_settings(
        ("train.py",), env, accelerators=lambda: 1, own_address=lambda: "10.0.0.9", which=lambda name: None
    )


# ------------------------------------------------------------------------------------------- settings
def test_the_defaults_are_the_issues_and_replace_needs_checkpoints():
    s = settings().stragglers
    assert (s.window_seconds, s.ratio, s.min_excess_ms, s.windows, s.action) == (60.0, 1.2, 10.0, 3, "report")
    with pytest.raises(BadInput, match="STRAGGLER_ACTION=replace needs CHECKPOINT_URI"):
        settings(STRAGGLER_ACTION="replace")
    assert settings(STRAGGLER_ACTION="replace", CHECKPOINT_URI="s3://b/p").stragglers.action == "replace"


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("STRAGGLER_ACTION", "kill", "is not one of: report, replace"),
        ("STRAGGLER_RATIO", "1", "is not a number above 1"),
        ("STRAGGLER_WINDOWS", "0", "is not a positive integer"),
        ("STRAGGLER_WINDOW_SECONDS", "soon", "is not a number of seconds"),
        ("STRAGGLER_MIN_EXCESS_MS", "-5", "is not a number of milliseconds"),
    ],
)
def test_a_bad_setting_is_named_with_what_is_allowed(name, value, said):
    with pytest.raises(BadInput, match=f"{name}='{value}' {said}"):
        settings(**{name: value})


# ------------------------------------------------------------------------------------------- rank lines
def test_each_rank_gives_its_newest_complete_window_once(tmp_path):
    (tmp_path / "rank-0.txt").write_text("100.0 0.050000 40 0.07\n160.0 0.052000 40 0.06\n")
    (tmp_path / "rank-1.txt").write_text("100.0 0.090000 40 0.1\n160.0 0.0")  # its second line is still being written
    lines = straggler_watch.RankLines(tmp_path)
    assert lines.newest() == {0: 0.052, 1: 0.09}
    assert lines.newest() == {}  # nothing new
    with (tmp_path / "rank-1.txt").open("a") as out:
        out.write("95000 41 0.1\n")
    assert lines.newest() == {1: 0.095}


# ------------------------------------------------------------------------------------------- the listener
def test_the_listener_keeps_paces_and_saves_and_ignores_other_jobs(tmp_path):
    take = {"job": "j", "out": tmp_path / "report", "pid": 1, "hangs": None, "children": tmp_path}
    node_fault.take('pace j {"node":2,"ranks":{"5":0.04}}', **take)
    node_fault.take('saved j {"node":2,"at":1234.5}', **take)
    node_fault.take('pace other {"node":3,"ranks":{"6":0.04}}', **take)
    node_fault.take("pace j not-json", **take)
    assert json.loads((tmp_path / "node-2.pace").read_text())["ranks"] == {"5": 0.04}
    assert json.loads((tmp_path / "node-2.saved").read_text())["at"] == 1234.5
    assert not (tmp_path / "node-3.pace").exists() and not (tmp_path / "report").exists()


def serve(children: Path, job: str) -> tuple[int, threading.Event]:
    """A listener's connections on 127.0.0.1 that answer with the node's order, until the event is set."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    done = threading.Event()
    connections = Connections(server, reply=lambda text: node_fault.order_for(children, text, job))

    def loop() -> None:
        while not done.is_set():
            connections.read(connections.sockets(), time.monotonic())
            time.sleep(0.01)
        connections.close()
        server.close()

    threading.Thread(target=loop, daemon=True).start()
    return server.getsockname()[1], done


def test_a_line_is_answered_with_its_nodes_order_and_only_its_own(tmp_path):
    (tmp_path / "node-1.order").write_text("straggler straggler: rank 1 2.00x\n")
    port, done = serve(tmp_path, "j")
    try:
        assert (
            node_fault.send("127.0.0.1", port, "alive j 1", within=2, answer=True)
            == "straggler straggler: rank 1 2.00x"
        )
        assert node_fault.send("127.0.0.1", port, "alive j 2", within=2, answer=True) == ""
        assert node_fault.send("127.0.0.1", port, "alive other 1", within=2, answer=True) == ""
        assert node_fault.send("127.0.0.1", port, "alive j 1", within=2) is True  # a sender that does not read
    finally:
        done.set()


def test_a_child_told_it_is_the_straggler_writes_the_order_and_signals_its_launcher_once(tmp_path):
    (tmp_path / "node-1.order").write_text("straggler straggler: rank 1 2.00x\n")
    port, done = serve(tmp_path, "j")
    launcher = subprocess.Popen(["sleep", "30"])  # SIGUSR1 ends sleep: the launcher was signalled
    order = tmp_path / "own-order"
    try:
        node_fault.beat("127.0.0.1", port, "j", 1, launcher.pid, every=0.2, order=order)
        assert launcher.wait(timeout=10) == -signal.SIGUSR1
        assert order.read_text() == "straggler: rank 1 2.00x\n"
    finally:
        done.set()
        launcher.kill()


def test_a_child_without_an_order_is_left_alone(tmp_path):
    port, done = serve(tmp_path, "j")
    launcher = subprocess.Popen(["sleep", "1.5"])
    try:
        node_fault.beat("127.0.0.1", port, "j", 1, launcher.pid, every=0.2, order=tmp_path / "own-order")
        assert launcher.wait(timeout=10) == 0 and not (tmp_path / "own-order").exists()
    finally:
        done.set()


# ------------------------------------------------------------------------------------------- the main node
def main_watch(tmp_path: Path, action: str = "report", pid: int = 1) -> straggler_watch.MainWatch:
    (tmp_path / "timing").mkdir(exist_ok=True)
    (tmp_path / "children").mkdir(exist_ok=True)
    args = argparse.Namespace(
        dir=tmp_path / "timing", children=tmp_path / "children", node=0, window=60.0, fleet="gpu", job="j",
        action=action, saved=tmp_path / "uploaded", order=tmp_path / "own-order", out=tmp_path / "report",
        pid=pid, marker_uri="", attempt=1, nodes=2, verified=True, log_windows=False,
    )  # fmt: skip
    thresholds = Thresholds()
    return straggler_watch.MainWatch(args, thresholds, straggler_watch.RankLines(args.dir), StragglerWatch(thresholds))


def one_window(watch: straggler_watch.MainWatch, tmp_path: Path, own: float, child: float, at: float) -> None:
    """One window: a line from the main node's rank 0, a pace from node 1 (the listener writes a new file each
    time; its mtime says it is new), then the main node's tick."""
    with (tmp_path / "timing" / "rank-0.txt").open("a") as out:
        out.write(f"{at} {own} 40 {own}\n")
    pace = {"node": 1, "ranks": {"1": child}, "instance": "i-0123456789abcdef0", "az": "us-east-1b"}
    path = tmp_path / "children" / "node-1.pace"
    path.write_text(json.dumps(pace))
    os.utime(path, ns=(int(at * 1e9), int(at * 1e9)))
    watch.tick()


def test_a_child_twice_as_slow_is_named_once_with_its_instance_and_az(tmp_path, capsys):
    watch = main_watch(tmp_path)
    for k in range(4):
        one_window(watch, tmp_path, own=0.040, child=0.085, at=100 + k)
    out = capsys.readouterr().out.splitlines()
    metrics_lines = [json.loads(line) for line in out if line.startswith("{")]
    named = [line for line in out if "straggler: node" in line]
    assert len(metrics_lines) == 4 and {m["Node"] for m in metrics_lines} == {1}
    assert metrics_lines[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "StragglerWindows"}]
    assert (
        metrics_lines[0]["Instance"] == "i-0123456789abcdef0" and metrics_lines[0]["AvailabilityZone"] == "us-east-1b"
    )
    assert len(named) == 1 and "node 1 (instance i-0123456789abcdef0, AZ us-east-1b), rank 1:" in named[0]
    assert "2.12x" in named[0] and "reporting only" in named[0]
    assert watch.pending is None  # report: nothing is replaced


def test_a_healthy_pair_is_left_alone_and_a_recovered_node_is_said_back(tmp_path, capsys):
    watch = main_watch(tmp_path)
    for k in range(5):
        one_window(watch, tmp_path, own=0.040, child=0.044, at=100 + k)  # 1.1x: within the ratio
    assert capsys.readouterr().out == ""
    for k in range(3):
        one_window(watch, tmp_path, own=0.040, child=0.080, at=200 + k)
    one_window(watch, tmp_path, own=0.040, child=0.041, at=300)
    out = capsys.readouterr().out
    assert out.count("straggler: node 1") == 1 and "node 1 is back in line: 1.02x" in out


def test_replace_waits_for_a_checkpoint_then_orders_the_child(tmp_path, capsys):
    watch = main_watch(tmp_path, action="replace")
    for k in range(3):
        one_window(watch, tmp_path, own=0.040, child=0.085, at=100 + k)
    assert watch.pending is not None and "replacing it after the next checkpoint" in capsys.readouterr().out
    since = watch.pending[1]
    (tmp_path / "uploaded").write_text(f"{since - 5}\n")  # an upload before the node was named does not count
    assert not watch.saved_since(since)
    (tmp_path / "children" / "node-1.saved").write_text(json.dumps({"node": 1, "at": since + 2}))
    assert watch.saved_since(since)
    (tmp_path / "children" / "node-1").write_text("{}")  # its ending arrives at once
    watch.replace()
    order = (tmp_path / "children" / "node-1.order").read_text()
    assert order.startswith("straggler straggler: rank 1 2.12x") and "instance i-0123456789abcdef0" in order
    assert not (tmp_path / "report").exists()  # the child ends itself: the main node reports nothing of its own


def replaced_with_a_launcher(tmp_path: Path, own: float, child: float) -> subprocess.Popen[bytes]:
    """A stand-in launcher (sleep: SIGUSR1 ends it), and the main watch with `replace` after three windows."""
    launcher = subprocess.Popen(["sleep", "30"])
    watch = main_watch(tmp_path, action="replace", pid=launcher.pid)
    for k in range(3):
        one_window(watch, tmp_path, own=own, child=child, at=100 + k)
    watch.replace()
    return launcher


def test_the_main_node_named_orders_itself_and_signals_its_launcher(tmp_path):
    launcher = replaced_with_a_launcher(tmp_path, own=0.090, child=0.040)
    try:
        assert launcher.wait(timeout=10) == -signal.SIGUSR1
        assert (tmp_path / "own-order").read_text().startswith("straggler: rank 0 2.25x")
    finally:
        launcher.kill()


def test_a_child_that_does_not_end_is_ended_from_the_main_node(tmp_path, monkeypatch):
    monkeypatch.setattr(straggler_watch, "ORDER_SECONDS", 0.5)
    launcher = replaced_with_a_launcher(tmp_path, own=0.040, child=0.085)
    try:
        code, line = (tmp_path / "report").read_text().split(" ", 1)
        assert int(code) == ending.NODE_FAULT_EXIT and line.startswith("node 1: a straggler")
        assert "ending the attempt from the main node" in line and ending.TAKEN_OUT not in line
    finally:
        launcher.kill()


@mock_aws
def test_a_job_that_replaced_a_node_in_its_last_attempt_does_not_replace_again(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpt-straggler")
    uri = "s3://ckpt-straggler/lineage/evidence/job-1/straggler-replaced.json"
    assert straggler_record.previous_replacement(uri, attempt=2) is None  # nothing replaced yet
    assert straggler_record.write_marker(uri, {"attempt": 1, "node": 1, "instance": "i-1"}) is None
    said = straggler_record.previous_replacement(uri, attempt=2)
    assert said is not None and "attempt 1 replaced node 1 (i-1)" in said
    assert straggler_record.previous_replacement(uri, attempt=3) is None  # not in a row: the next may replace


def test_a_node_fault_that_takes_the_straggler_out():
    result = ending.for_straggler("node 1 (ip-10-0-0-3): straggler: rank 1 2.00x")
    assert (
        result.code == ending.NODE_FAULT_EXIT == 75 and result.mark == "node 1 (ip-10-0-0-3): straggler: rank 1 2.00x"
    )
    assert ending.TAKEN_OUT in (result.line or "") and "Batch retries it on other nodes" in (result.line or "")


def test_the_metric_name_is_the_dashboards():
    assert straggler_record.STRAGGLER_WINDOWS == metrics.STRAGGLER_WINDOWS


def test_where_reads_the_boot_checks_file_else_says_unknown(tmp_path):
    (tmp_path / "instance").write_text("i-0abc us-west-2c\n")
    assert straggler_record.where({"NODE_STATE_DIR": str(tmp_path)}) == ("i-0abc", "us-west-2c")
    assert straggler_record.where({"NODE_STATE_DIR": str(tmp_path / "none")}) == (socket.gethostname(), "unknown")


# ------------------------------------------------------------------------------------------- the fault and why
def test_slow_node_takes_a_share_between_0_and_1():
    assert parse_fault("slow-node:1=0.5@checkpoint:1").value == 0.5
    assert parse_fault("slow-node").value == 0.5
    with pytest.raises(TrainctlError, match="above 0 and below 1"):
        parse_fault("slow-node=1")


def test_why_tells_each_attempts_straggler_and_whether_it_came_back():
    lines = {
        "s1": ["straggler_watch.py: straggler: node 1 (instance i-1, AZ a), rank 1: 92 ms; reporting only"],
        "s2": [
            "straggler_watch.py: straggler: node 2 (instance i-2, AZ b), rank 4: 70 ms; reporting only",
            "straggler_watch.py: node 2 is back in line: 1.01x the other nodes' median",
        ],
    }
    job = {"attempts": [{"container": {"logStreamName": "s1"}}]}
    streams = stragglers.main_streams(job, {"container": {"logStreamName": "s2"}})
    assert streams == [(1, "s1"), (2, "s2")]
    said = stragglers.notes(streams, "g", lambda group, stream: lines[stream])
    assert said[0].startswith("attempt 1: node 1 was named a straggler") and "back in line" not in said[0]
    assert said[1].startswith("attempt 2: node 2 was named") and said[1].endswith("it was back in line later")


TOKEN = "imds-session-1"  # noqa: S105 - a stand-in IMDS session token


class Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 as the boot check asks it: a token, then the instance id and the AZ with that token."""

    answers: ClassVar[dict[str, str]] = {
        "/latest/meta-data/instance-id": "i-0fedcba987654321",
        "/latest/meta-data/placement/availability-zone": "eu-west-1c",
    }

    def do_PUT(self) -> None:
        self._answer(TOKEN if self.path == "/latest/api/token" else None)

    def do_GET(self) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token")
        self._answer(self.answers.get(self.path) if token == TOKEN else None)

    def _answer(self, body: str | None) -> None:
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())

    def log_message(self, *args: object) -> None:
        pass


def test_the_boot_check_writes_what_the_watch_reads(tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        boot_check.write_instance(tmp_path / boot_check.INSTANCE_FILE, f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
    assert boot_check.INSTANCE_FILE == straggler_record.INSTANCE_FILE
    assert straggler_record.where({"NODE_STATE_DIR": str(tmp_path)}) == ("i-0fedcba987654321", "eu-west-1c")


# ------------------------------------------------------------------------------------------- the launcher
def started_watch(**env: str) -> tuple[dict[str, str], list[list[str]]]:
    node = NodeState(settings=settings(**env), signals=StopSignals(), started=time.time())
    spawned: list[list[str]] = []
    node.spawn = lambda command, **options: spawned.append(command)  # type: ignore[method-assign]
    if node.settings.is_main and node.settings.batch is not None:
        node.faults = node.folder()
    return watchers.start_straggler_watch(node, None), spawned


def test_the_trainer_of_a_multi_node_job_loads_the_timing_and_each_node_runs_its_watch(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/image/lib")
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_ID": "j#0", "MASTER_ADDR": "10.0.0.1"}
    env, (command,) = started_watch(**nodes, AWS_BATCH_JOB_NODE_INDEX="0", STRAGGLER_WINDOW_SECONDS="30")
    inject = str(ROOT / "container" / "launcher" / "inject")
    assert env["PYTHONPATH"] == f"{inject}:/opt/image/lib" and env["STRAGGLER_WINDOW_SECONDS"] == "30"
    assert Path(env["STRAGGLER_TIMING_DIR"]).is_dir() and command[1].endswith("straggler_watch.py")
    assert "--children" in command and command[command.index("--action") + 1] == "report"
    env, (command,) = started_watch(**nodes, AWS_BATCH_JOB_NODE_INDEX="1")
    assert "--report-to" in command and "--children" not in command and "STRAGGLER_TIMING_DIR" in env


def test_one_node_or_a_window_of_0_times_nothing():
    assert started_watch(AWS_BATCH_JOB_NUM_NODES="1", AWS_BATCH_JOB_NODE_INDEX="0") == ({}, [])
    two = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "0", "MASTER_ADDR": "10.0.0.1"}
    assert started_watch(**two, STRAGGLER_WINDOW_SECONDS="0") == ({}, [])


def test_a_pace_is_scored_once_and_a_node_outside_the_job_never(tmp_path, capsys):
    watch = main_watch(tmp_path)
    one_window(watch, tmp_path, own=0.040, child=0.085, at=100)
    for _ in range(3):  # no new pace from node 1: its one slow window is not counted again
        with (tmp_path / "timing" / "rank-0.txt").open("a") as out:
            out.write("1 0.040 40 0.04\n")
        watch.tick()
    assert watch.watch.streaks.get(1) == 1
    ghost = {"node": 7, "ranks": {"7": 9.0}}
    (tmp_path / "children" / "node-7.pace").write_text(json.dumps(ghost))
    watch.tick()
    assert 7 not in watch.watch.streaks and "straggler" not in capsys.readouterr().out


def named_for_replace(tmp_path: Path, **args: object) -> straggler_watch.MainWatch:
    watch = main_watch(tmp_path, action="replace")
    vars(watch.args).update(args)
    for k in range(3):
        one_window(watch, tmp_path, own=0.040, child=0.085, at=100 + k)
    return watch


def test_replace_is_refused_where_the_listener_cannot_check_senders(tmp_path, capsys):
    (tmp_path / "children").mkdir()
    (tmp_path / "children" / "addresses.unknown").touch()  # the node watch could not ask Batch
    watch = named_for_replace(tmp_path)
    assert watch.pending is None and "not replaced: the listener takes the paces unchecked" in capsys.readouterr().out


def test_replace_is_dropped_once_the_attempt_is_ending(tmp_path, capsys):
    watch = named_for_replace(tmp_path)
    assert watch.pending is not None and not watch.ending()
    (tmp_path / "stopping").write_text("1\n")  # the copier's state folder: the trainer was stopped or failed
    assert watch.ending()


def test_forged_or_malformed_lines_speak_for_no_node_and_stop_nothing(tmp_path):
    senders = Senders(tmp_path, "j")
    (tmp_path / "node-1.address").write_text("10.0.0.5")
    forged = [
        'pace j {"node":"1","ranks":{"1":9}}',
        'pace j {"node":1.0,"ranks":{"1":9}}',
        'saved j {"node":true,"at":1e12}',
        'end j {"node":1e999,"code":75,"line":"x"}',
        "pace j " + "[" * 5000,
    ]
    for text in forged:
        assert senders.judge(Line(text, "10.9.9.9", 0.0)) == "drop"
        node_fault.take(text, job="j", out=tmp_path / "report", pid=1, hangs=None, children=tmp_path)
    assert not any((tmp_path / name).exists() for name in ("node-1.pace", "node-1.saved", "node-1", "report"))
    assert senders.judge(Line('pace j {"node":1,"ranks":{"1":9}}', "10.9.9.9", 0.0)) == "drop"  # wrong address
    assert senders.judge(Line('pace j {"node":1,"ranks":{"1":9}}', "10.0.0.5", 0.0)) == "take"
    assert senders.judge(Line('pace other {"node":"1"}', "10.9.9.9", 0.0)) == "take"  # another job's: ignored later
    assert node_fault.order_for(tmp_path, "pace j " + "[" * 5000, "j") == b""


def test_a_child_named_ends_as_a_node_fault_and_tells_the_main_node(tmp_path):
    two = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1", "MASTER_ADDR": "10.0.0.1"}
    node = NodeState(settings=settings(**two), signals=StopSignals(), started=time.time())
    told: list[tuple[int, str]] = []
    node.tell_main = lambda code, text, *rest, **options: told.append((code, text))  # type: ignore[method-assign]
    (node.folder() / watchers.STRAGGLER_ORDER).write_text("straggler: rank 1 2.19x the other nodes' median\n")
    verdict, fault = failure_phase.judge_failure(node, 143, reported=True, failed_at=time.monotonic())
    assert verdict is not None and verdict.code == ending.NODE_FAULT_EXIT and fault == ""
    assert verdict.mark is not None and verdict.mark.endswith("straggler: rank 1 2.19x the other nodes' median")
    assert told == [(75, f"straggler: rank 1 2.19x the other nodes' median; {ending.TAKEN_OUT}")]
    # Without the order, a child stopped by a report is judged as before: no straggler ending.
    (node.folder() / watchers.STRAGGLER_ORDER).unlink()
    assert node.straggler_order() == ""


def test_a_watch_that_cannot_score_says_why_once(tmp_path):
    watch = main_watch(tmp_path)
    assert watch.quiet(100.0) is None  # under three windows of 60 s
    said = watch.quiet(190.0)
    assert said is not None and said.startswith("no step timings from any node after 190 s")
    assert watch.quiet(400.0) is None  # once
    for name in ("lonely", "scored"):
        (tmp_path / name).mkdir()
    lonely = main_watch(tmp_path / "lonely")
    with (tmp_path / "lonely" / "timing" / "rank-0.txt").open("a") as out:
        out.write("1 0.040 40 0.04\n")
    lonely.tick()  # the main node's own ranks, and no child's pace
    assert "step timings from node 0 only: no window scored" in (lonely.quiet(190.0) or "")
    scored = main_watch(tmp_path / "scored")
    one_window(scored, tmp_path / "scored", own=0.040, child=0.041, at=100)
    assert scored.quiet(190.0) is None


class PagedLogs:
    """FilterLogEvents as CloudWatch Logs may answer it: pages without events that still carry a token."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []
        self.pages = [
            {"events": [], "nextToken": "a"},
            {"events": [{"message": "straggler_watch.py: straggler: node 1 (...)"}], "nextToken": "b"},
            {"events": []},
        ]

    def filter_log_events(self, **options: object) -> dict[str, object]:
        self.calls.append(options)
        return self.pages[len(self.calls) - 1]


def test_why_reads_every_page_of_the_watchs_lines_and_survives_a_refusal():
    logs = PagedLogs()
    found = stragglers.log_finder(logs)("group", "stream-1")
    assert found == ["straggler_watch.py: straggler: node 1 (...)"]
    assert [call.get("nextToken") for call in logs.calls] == [None, "a", "b"]
    assert logs.calls[0]["filterPattern"] == '"straggler_watch.py: "' and logs.calls[0]["logStreamNames"] == [
        "stream-1"
    ]

    class Refusing:
        def filter_log_events(self, **options: object) -> dict[str, object]:
            raise RuntimeError("AccessDeniedException")

    assert stragglers.log_finder(Refusing())("group", "stream-1") == []
