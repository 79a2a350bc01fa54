"""The main node's listener trusts only the job's own nodes (container/launcher/report_listener.py): on Batch a
line is taken only from the address DescribeJobs gives the node it speaks for, and no connection can hold the
listener. Forged lines come from 127.0.0.2 (all of 127.0.0.0/8 is this machine's loopback)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import node_fault  # container/ is on the path only from here
import node_watch
import report_listener
from report_listener import ADDRESS_UNKNOWN, Line, Senders, speaker

JOB = "job-a"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def send_from(source: str, port: int, text: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as connection:
        connection.sendall((text + "\n").encode())


def end_line(node: int, code: int, line: str) -> str:
    fields = {"node": node, "code": code, "line": line, "rank": None, "when": "", "error": ""}
    return f"end {JOB} {json.dumps(fields)}"


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(condition())


class Listening:
    def __init__(self, tmp_path: Path, *, verify: bool) -> None:
        self.port = free_port()
        self.launcher = subprocess.Popen(["sleep", "60"])  # stands in for the launcher, which SIGUSR1 stops
        self.out, self.children = tmp_path / "report", tmp_path / "children"
        self.children.mkdir()
        args = (self.port, self.launcher.pid, self.out, JOB, 0.05, None, self.children, verify)
        self.thread = threading.Thread(target=node_fault.listen, args=args, daemon=True)
        self.thread.start()
        assert wait_for(self.accepting)

    def accepting(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        self.launcher.kill()
        self.launcher.wait()
        self.thread.join(timeout=10)


@pytest.fixture
def verified(tmp_path: Path) -> Iterator[Listening]:
    listening = Listening(tmp_path, verify=True)
    yield listening
    listening.stop()


def test_a_forged_ending_from_another_address_ends_nothing_and_is_said(verified: Listening, capfd: Any) -> None:
    (verified.children / "node-1.address").write_text("127.0.0.1\n")
    send_from("127.0.0.2", verified.port, end_line(1, 2, "node 1 (h): bad input"))
    send_from("127.0.0.2", verified.port, f"alive {JOB} 1")
    time.sleep(0.5)
    assert not verified.out.exists() and verified.launcher.poll() is None
    assert not (verified.children / "node-1").exists() and not (verified.children / "node-1.alive").exists()
    said = capfd.readouterr().err
    assert "a line for node 1 came from 127.0.0.2, but Batch gives node 1 127.0.0.1: ignored" in said
    assert said.count("came from 127.0.0.2") == 1  # once per address, not per line
    # The node's own address is heard.
    send_from("127.0.0.1", verified.port, end_line(1, 75, "node 1 (h): expected 4 GPUs, found 3"))
    assert wait_for(verified.out.exists)
    assert verified.out.read_text() == "75 node 1 (h): expected 4 GPUs, found 3\n"
    assert verified.launcher.wait(timeout=10) == -10  # SIGUSR1


def test_a_node_cannot_speak_for_another(verified: Listening) -> None:
    (verified.children / "node-1.address").write_text("127.0.0.1\n")
    (verified.children / "node-2.address").write_text("127.0.0.3\n")
    send_from("127.0.0.1", verified.port, end_line(2, 75, "node 2 (h): lost a GPU"))
    time.sleep(0.5)
    assert not verified.out.exists() and verified.launcher.poll() is None


def test_a_line_waits_for_its_nodes_address_and_counts_from_when_it_came(verified: Listening) -> None:
    sent = time.time()
    send_from("127.0.0.1", verified.port, f"alive {JOB} 1")
    time.sleep(0.5)
    alive = verified.children / "node-1.alive"
    assert not alive.exists()  # Batch has not said where node 1 is yet
    (verified.children / "node-1.address").write_text("127.0.0.1\n")
    assert wait_for(alive.exists)
    assert sent - 1 <= alive.stat().st_mtime <= sent + 0.4  # when it came, not when it was checked


def test_a_silent_connection_holds_no_one_up(tmp_path: Path) -> None:
    listening = Listening(tmp_path, verify=False)
    try:
        idle = socket.create_connection(("127.0.0.1", listening.port), timeout=10)
        started = time.monotonic()
        send_from("127.0.0.1", listening.port, end_line(1, 75, "node 1 (h): lost a GPU"))
        assert wait_for(listening.out.exists)
        assert time.monotonic() - started < report_listener.CONNECTION_SECONDS  # not after the idle one
        assert idle.recv(16) == b""  # the idle connection is closed once its time is up
        assert time.monotonic() - started < report_listener.CONNECTION_SECONDS + 5
        idle.close()
    finally:
        listening.stop()


def line(text: str, peer: str = "10.0.1.5") -> Line:
    return Line(text, peer, time.time())


def test_the_speaker_is_the_node_a_line_names_for_this_job_only() -> None:
    assert speaker(f"alive {JOB} 3", JOB) == 3
    assert speaker(end_line(2, 1, "x"), JOB) == 2
    assert speaker(f"hang {JOB} " + json.dumps({"node": 4, "state": "hung"}), JOB) == 4
    assert speaker("alive job-b 3", JOB) is None
    assert speaker(f"end {JOB} " + json.dumps({"node": True}), JOB) is None
    assert speaker(f"end {JOB} not-json", JOB) is None


def test_without_addresses_lines_wait_unless_batch_cannot_be_asked_then_are_taken_said_once(
    tmp_path: Path, capsys: Any
) -> None:
    senders = Senders(tmp_path, JOB)
    # However long: a node Batch never shows running sends nothing that counts.
    assert senders.judge(line(f"alive {JOB} 1")) == "wait"
    assert senders.judge(line(end_line(1, 2, "node 1 (h): bad input"))) == "wait"
    (tmp_path / ADDRESS_UNKNOWN).touch()  # the node watch cannot call DescribeJobs
    assert senders.judge(line(f"alive {JOB} 1")) == "take"
    assert senders.judge(line(f"alive {JOB} 2")) == "take"
    assert capsys.readouterr().err.count("without checking the sender") == 1
    assert senders.judge(line("alive job-b 1")) == "take"  # another job's: node_fault.take drops it


class Described:
    """DescribeJobs answering fixed entries."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
        return {"jobs": [e for e in self.entries if e["jobId"] in jobs]}


def node_entry(index: int, status: str, started: int | None, address: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"jobId": f"{JOB}#{index}", "status": status, "container": {}}
    if started is not None:
        entry["startedAt"] = started
    if address:
        entry["container"]["networkInterfaces"] = [{"attachmentId": "eni-attach-1", "privateIpv4Address": address}]
    return entry


def watch(tmp_path: Path, client: Any) -> node_watch.Watch:
    return node_watch.Watch(
        client=client, job=JOB, nodes=4, main=0, pid=os.getpid(), out=tmp_path / "report",
        hurry=tmp_path / "hurry", since=time.time(), period=1.0, children=tmp_path / "children",
    )  # fmt: skip


def test_the_node_watch_writes_each_running_childs_address_from_describejobs(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    entries = [
        node_entry(0, "RUNNING", now - 5000, "10.0.1.4"),
        node_entry(1, "RUNNING", now, "10.0.1.5"),
        node_entry(2, "STARTING", None, None),  # no interface yet
        node_entry(3, "RUNNING", now - 3_600_000, "10.0.1.9"),  # the earlier attempt's entry, still shown
    ]
    assert watch(tmp_path, Described(entries)).once() is False
    children = tmp_path / "children"
    assert (children / "node-1.address").read_text() == "10.0.1.5\n"
    assert not (children / "node-0.address").exists()  # the main node sends it nothing
    assert not (children / "node-2.address").exists() and not (children / "node-3.address").exists()


def test_a_node_watch_that_cannot_ask_batch_says_so_to_the_listener(tmp_path: Path) -> None:
    from botocore.exceptions import ClientError

    class Denied:
        def describe_jobs(self, jobs: list[str]) -> dict[str, Any]:
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "DescribeJobs")

    assert watch(tmp_path, Denied()).once() is True
    assert (tmp_path / "children" / ADDRESS_UNKNOWN).exists()


def test_describejobs_gives_a_node_jobs_address_where_the_watch_reads_it() -> None:
    # Batch API reference, ContainerDetail.networkInterfaces and NetworkInterface.privateIpv4Address, as
    # botocore's own model of the Batch API has them.
    import botocore.session

    model = botocore.session.get_session().get_service_model("batch")
    container = model.shape_for("ContainerDetail")
    interfaces = container.members["networkInterfaces"]
    assert interfaces.type_name == "list" and "privateIpv4Address" in interfaces.member.members
    job = model.shape_for("JobDetail")
    assert job.members["container"].name == "ContainerDetail"


@pytest.mark.parametrize("period", ["0", "soon"])
def test_a_node_watch_that_does_not_run_tells_the_listener_not_to_wait(tmp_path: Path, period: str) -> None:
    children = tmp_path / "children"
    args = ["--job", JOB, "--nodes", "2", "--main", "0", "--pid", str(os.getpid()), "--out", str(tmp_path / "r"),
            "--hurry", str(tmp_path / "h"), "--since", "0", "--children", str(children),
            "--period", period]  # fmt: skip
    assert node_watch.main(args, environ={}) == 0
    assert (children / ADDRESS_UNKNOWN).exists()
