"""The take-out's host check (node_scripts/boot_check.py `confirm`): on a fake host (device tree, stand-in
nvidia-smi and dmesg) with IMDS and CloudWatch Logs answered on 127.0.0.1. Only the host's own evidence
confirms a take-out: its device counts and the node-fault Xids of its kernel log, never the `xid-faults`
file of the folder every job container mounts read-write."""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from config import metrics
from tests.test_host_check import FIXTURES, XID_LINE, gpu_list, node, tool  # noqa: F401 - node: the fixture
from training_constructs.health.boot_breaker_function import trip
from training_constructs.health.node_recovery import NODE_STATE_DIR
from training_constructs.health.node_scripts import boot_check
from training_constructs.observability.node_metrics import collector

INSTANCE = "i-0fedcba9876543210"
# An Xid a job's own bug raises (31: a GPU memory page fault, an illegal address in the job's kernel).
APP_XID_LINE = "[  900.100000] NVRM: Xid (PCI:0000:38:00): 31, pid=4242, name=python, Ch 00000010, intr 10000000.\n"


# Paths this process opens while the first entry is "recording" (an audit hook: "open" events, PEP 578).
OPENED: list[str] = []


def _record_opens(event: str, args: tuple[Any, ...]) -> None:
    if OPENED and event == "open" and isinstance(args[0], (str, Path)):
        OPENED.append(str(args[0]))


sys.addaudithook(_record_opens)


@pytest.fixture
def host(node: dict[str, Any]) -> dict[str, Any]:  # noqa: F811 - the imported fixture, by name
    """The boot check tests' fake host: 4 GPUs, 1 EFA device, a clean kernel log (tests/test_host_check.py)."""
    return node


class StandInInstance(http.server.BaseHTTPRequestHandler):
    """IMDSv2 (token, instance id, the instance role's credentials) and CloudWatch Logs."""

    logs_calls: ClassVar[list[tuple[dict[str, str], dict[str, Any]]]] = []

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        self._answer(b"token-1")

    def do_GET(self) -> None:
        answers = {
            "/latest/meta-data/instance-id": INSTANCE,
            "/latest/meta-data/iam/security-credentials/": "node-role",
            "/latest/meta-data/iam/security-credentials/node-role": json.dumps(
                {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "Token": "session"}
            ),
        }
        self._answer(answers[self.path].encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandInInstance.logs_calls.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
        self._answer(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInInstance)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def saved_arguments(host: dict[str, Any], endpoint: str, tmp_path: Path) -> Path:
    """What the boot check saves at boot (ARGS_FILE): its own arguments, the log group's included."""
    saved = tmp_path / "boot-check.args"
    where = ["--log-group", "boot-logs", "--region", "us-west-2", "--logs-endpoint", f"{endpoint}/"]
    saved.write_text(json.dumps([*host["args"], *where, "--imds", endpoint]))
    return saved


def confirm(host: dict[str, Any], endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run `confirm`; the one line it sent to the log group (and printed)."""
    StandInInstance.logs_calls.clear()
    assert boot_check.main(["confirm", str(saved_arguments(host, endpoint, tmp_path))]) == 0
    (out,) = capsys.readouterr().out.strip().splitlines()
    (create, put) = StandInInstance.logs_calls
    assert create[0]["x-amz-target"] == "Logs_20140328.CreateLogStream"
    assert create[1] == {"logGroupName": "boot-logs", "logStreamName": INSTANCE}
    assert put[0]["x-amz-target"] == "Logs_20140328.PutLogEvents" and put[0]["x-amzn-logs-format"] == "json/emf"
    (event,) = put[1]["logEvents"]
    assert out == f"training-node-take-out: {event['message']}"
    line: dict[str, Any] = json.loads(event["message"])
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    assert directive == {
        "Namespace": metrics.NAMESPACE,
        "Dimensions": [[metrics.FLEET_DIMENSION]],
        "Metrics": [{"Name": metrics.TAKE_OUT_CONFIRMED, "Unit": "Count"}],
    }
    assert line["InstanceId"] == INSTANCE and line[metrics.FLEET_DIMENSION] == "gpu"
    return line


def test_a_missing_gpu_confirms_the_take_out(host, endpoint, tmp_path, capsys):
    tool(host["bin"], "nvidia-smi", gpu_list(3))
    line = confirm(host, endpoint, tmp_path, capsys)
    assert line[metrics.TAKE_OUT_CONFIRMED] == 1 and line["failed"] == ["gpus: expected 4, found 3"]


def test_a_missing_efa_device_confirms_the_take_out(host, endpoint, tmp_path, capsys):
    (host["dev"] / "infiniband" / "uverbs0").unlink()
    line = confirm(host, endpoint, tmp_path, capsys)
    assert line[metrics.TAKE_OUT_CONFIRMED] == 1 and line["failed"] == ["efa_devices: expected 1, found 0"]


def test_a_node_fault_xid_in_the_kernel_log_confirms_the_take_out(host, endpoint, tmp_path, capsys):
    tool(host["bin"], "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text() + XID_LINE)
    line = confirm(host, endpoint, tmp_path, capsys)
    assert line[metrics.TAKE_OUT_CONFIRMED] == 1 and line["failed"] == ["xid: expected [], found [79]"]


def test_a_healthy_host_does_not_confirm_whatever_the_shared_folder_claims(host, endpoint, tmp_path, capsys):
    # Every device present, a clean kernel log; the node-state folder the jobs mount (where the shared-fault
    # marker lives) holds an xid-faults record of an Xid 79, as the collector would write it, or a job.
    shared = host["marker"].parent
    (shared / collector.XID_FAULTS).write_text(f"{time.time():.3f} {XID_LINE.strip()}\n")
    (shared / "take-out").write_text("hardware fault: NVIDIA Xid 79\n")
    OPENED.clear()
    OPENED.append("recording")
    try:
        line = confirm(host, endpoint, tmp_path, capsys)
    finally:
        recorded = OPENED[1:]
        OPENED.clear()
    assert line[metrics.TAKE_OUT_CONFIRMED] == 0 and line["failed"] == []
    # It opened nothing in the folder the jobs share, nor in the real one.
    assert recorded and not [p for p in recorded if p.startswith((str(shared), NODE_STATE_DIR))]


def test_an_xid_a_job_can_raise_itself_does_not_confirm(host, endpoint, tmp_path, capsys):
    tool(host["bin"], "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text() + APP_XID_LINE)
    line = confirm(host, endpoint, tmp_path, capsys)
    assert line[metrics.TAKE_OUT_CONFIRMED] == 0 and line["failed"] == []
    # At boot, before any job ran, the same Xid is a node fault.
    at_boot = argparse.Namespace(gpus=4, neuron_devices=0, efa=1, vulkan=False, dev=str(host["dev"]))
    assert boot_check.check(at_boot)["xid"] == {"expected": [], "found": [31], "ok": False, "fault": "node"}


def test_without_the_boot_checks_arguments_it_says_so_and_sends_nothing(tmp_path, capsys):
    StandInInstance.logs_calls.clear()
    assert boot_check.main(["confirm", str(tmp_path / "absent")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("training-node-take-out: host check not run (") and "counts nothing" in out
    assert StandInInstance.logs_calls == []


def test_without_instance_metadata_it_says_so_and_sends_nothing(host, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    StandInInstance.logs_calls.clear()
    assert boot_check.main(["confirm", str(saved_arguments(host, closed, tmp_path))]) == 0
    (out,) = capsys.readouterr().out.strip().splitlines()
    assert out.startswith("training-node-take-out: host check not sent (") and out.endswith("counts nothing")
    assert StandInInstance.logs_calls == []


def test_the_boot_check_saves_its_arguments_where_no_job_reaches(host, monkeypatch, tmp_path, capsys):
    # /run: the host's own tmpfs, not the node-state folder every job container mounts (the only host folder
    # a job definition mounts: tests/test_node_recovery.py).
    assert boot_check.ARGS_FILE.startswith("/run/") and not boot_check.ARGS_FILE.startswith(NODE_STATE_DIR)
    saved = tmp_path / "run" / "training-boot-check.args"
    saved.parent.mkdir()
    monkeypatch.setattr(boot_check, "ARGS_FILE", str(saved))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    # Without a log group (a run by hand) there is nothing to send a take-out's line to: nothing is saved.
    boot_check.main(host["args"])
    assert not saved.exists()
    argv = [*host["args"], "--log-group", "boot-logs", "--region", "us-west-2", "--imds", closed]
    boot_check.main([*argv, "--logs-endpoint", f"{closed}/"])
    capsys.readouterr()
    assert json.loads(saved.read_text()) == [*argv, "--logs-endpoint", f"{closed}/"]


def test_the_host_and_the_breaker_use_one_metric_and_one_xid_list():
    # Node scripts and the function cannot import config/: their copies must match.
    assert boot_check.CONFIRMED == trip.CONFIRMED_FIELD == metrics.TAKE_OUT_CONFIRMED
    assert set(collector.NODE_FAULT_XIDS) == boot_check.NODE_FAULT_XIDS
    assert boot_check.TAKE_OUT == "training-node-take-out"
