"""The host side of self-healing: the take-out unit (its steps run on a fake host), the collector's Xid
follower on GPU fleets, the compacted collector the user data carries, the node-state directory every
job container mounts, and NCCL_NET on every GPU training job definition."""

from __future__ import annotations

import ast
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from config.catalog import CATALOG, AcceleratorKind
from tests.harness import EFA_TYPES, bundle_command, node_files
from tests.test_host_check import boot_script
from tests.test_jobs import KINDS, container, environment, of_type
from training_constructs.common.node_files import compact_python
from training_constructs.health import host_check, node_recovery
from training_constructs.health.node_scripts import boot_check
from training_constructs.observability.node_metrics import COLLECTOR, collector


def fake_host(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose systemctl, sleep and the console writer append what they were asked to calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for tool in ("systemctl", "sleep"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def unit(script: str, name: str) -> list[str]:
    start = script.index(f"cat > /etc/systemd/system/{name} <<'UNIT_EOF'\n")
    body = script[start:].split("\n", 1)[1]
    return body[: body.index("\nUNIT_EOF")].splitlines()


class StandInHost(http.server.BaseHTTPRequestHandler):
    """The ECS agent's introspection endpoint, IMDSv2 and the ECS API, on 127.0.0.1; every ECS call is
    appended to the fake host's calls.log, so its order against systemctl and sleep shows."""

    calls: ClassVar[Path]
    bodies: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        self._answer(b"token-1")

    def do_GET(self) -> None:
        answers = {
            "/v1/metadata": json.dumps({"Cluster": CLUSTER, "ContainerInstanceArn": CONTAINER_INSTANCE}),
            "/latest/meta-data/instance-id": INSTANCE,
            "/latest/meta-data/iam/security-credentials/": "node-role",
            "/latest/meta-data/iam/security-credentials/node-role": json.dumps(
                {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "Token": "session"}
            ),
        }
        self._answer(answers[self.path].encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandInHost.bodies.append(({k.lower(): v for k, v in self.headers.items()}, body))
        service, action = self.headers["X-Amz-Target"].split(".")
        with StandInHost.calls.open("a") as log:
            if service.startswith("Logs_"):
                log.write(f"logs {action}\n")
            else:
                log.write(f"ecs {action} {json.loads(body)['status']}\n")
        self._answer(b"{}")

    def log_message(self, *args: object) -> None:
        pass


CLUSTER = "arn:aws:ecs:us-west-2:123456789012:cluster/AWSBatch-gpu-1a2b"
INSTANCE = "i-0123456789abcdef0"
CONTAINER_INSTANCE = "arn:aws:ecs:us-west-2:123456789012:container-instance/AWSBatch-gpu-1a2b/0f1e2d"


def run_take_out(steps: list[str], tmp_path: Path, endpoint: str) -> list[str]:
    """The unit's steps on a fake host: systemd's "-" prefix dropped, the boot check's script from this
    repository, the stand-in endpoints for IMDS, introspection, ECS and CloudWatch Logs, the console written
    into the same record as the calls. The host's check finds one of its two Neuron devices missing."""
    env, calls = fake_host(tmp_path)
    StandInHost.calls = calls
    marker = tmp_path / "take-out"
    marker.write_text("hardware fault: NVIDIA Xid 79, GPU has fallen off the bus\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "neuron0").touch()
    saved = tmp_path / "boot-check.args"
    where = ["--log-group", "boot-logs", "--region", "us-west-2", "--logs-endpoint", f"{endpoint}/"]
    saved.write_text(
        json.dumps(["--fleet", "trn", "--neuron-devices", "2", "--dev", str(dev), *where, "--imds", endpoint])
    )
    for step in steps:
        step = step.removeprefix("-").replace(node_recovery.TAKE_OUT_MARKER, str(marker))
        step = step.replace("/dev/console", str(calls)).replace(host_check.NODE_PATH, str(host_check.SCRIPT))
        if " drain " in step:
            step = re.sub(r" drain .*", f" drain us-west-2 {endpoint}/ {endpoint}/v1/metadata {endpoint}", step)
        if step.endswith(" confirm"):
            step += f" {saved}"
        subprocess.run(["/bin/sh", "-c", step], env=env, check=True, timeout=20)
    return calls.read_text().splitlines()


@pytest.mark.parametrize("instance", ["g6.12xlarge", "trn2.48xlarge"])
def test_the_take_out_marker_drains_at_once_then_masks_the_agent_and_powers_off(instance, tmp_path):
    _, script = boot_script(instance)
    assert unit(script, "training-node-take-out.path") == ["[Path]", "PathExists=/var/lib/training-node/take-out"]
    service = unit(script, "training-node-take-out.service")
    # The steps' output (the drain's and the host check's words) reaches the console too.
    assert service[:3] == ["[Service]", "Type=oneshot", "StandardOutput=journal+console"]
    steps = [line.removeprefix("ExecStart=") for line in service[3:]]
    assert "systemctl --no-block start training-node-take-out.path" in script
    # The drain and the host check may fail without stopping the take-out: systemd ignores the exit of a "-"
    # command. The host check is bounded: a oneshot service has no start timeout of its own.
    (drain,) = [step for step in steps if " drain " in step]
    assert drain == f"-python3 {host_check.NODE_PATH} drain <AWS::Region> https://ecs.<AWS::Region>.<AWS::URLSuffix>/"
    (confirm,) = [step for step in steps if " confirm" in step]
    assert confirm == f"-timeout {node_recovery.CONFIRM_SECONDS} python3 {host_check.NODE_PATH} confirm"
    # The node's files, the boot check's script among them, are written before the unit can run it.
    assert host_check.NODE_PATH in node_files(script)
    assert script.index(bundle_command(script)) < script.index("training-node-take-out.service")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHost)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    StandInHost.bodies.clear()
    try:
        calls = run_take_out(steps, tmp_path, f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
    # The reason goes to the console; no new task from the first second on; then the agent; then the host's own
    # check goes to the boot-check log group, while the agent still runs; the grace; then the node.
    said, *rest = calls
    assert said.startswith("training-node-take-out: node fault (hardware fault: NVIDIA Xid 79, GPU has fallen off")
    assert rest == [
        "ecs UpdateContainerInstancesState DRAINING",
        "systemctl mask --runtime ecs.service",
        "logs CreateLogStream",
        "logs PutLogEvents",
        "sleep 10",
        "systemctl --no-block poweroff",
    ]
    ((headers, body), _, (_, put)) = StandInHost.bodies
    assert json.loads(body) == {"cluster": CLUSTER, "containerInstances": [CONTAINER_INSTANCE], "status": "DRAINING"}
    assert headers["x-amz-target"] == "AmazonEC2ContainerServiceV20141113.UpdateContainerInstancesState"
    assert "/us-west-2/ecs/aws4_request, " in headers["authorization"]  # signed for the region it was given
    assert headers["x-amz-security-token"] == "session"
    (event,) = json.loads(put)["logEvents"]
    line = json.loads(event["message"])
    assert line["TakeOutConfirmed"] == 1 and line["InstanceId"] == INSTANCE
    assert line["failed"] == ["neuron_devices: expected 2, found 1"]


def test_a_failed_drain_and_a_failed_host_check_are_said_and_the_take_out_goes_on(tmp_path):
    steps = list(node_recovery.take_out_steps(region="us-west-2", url_suffix="amazonaws.com"))
    # Nothing listens on the endpoint: no introspection, no IMDS, no ECS, no CloudWatch Logs.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env, calls = fake_host(tmp_path)
    marker = tmp_path / "take-out"
    marker.write_text("preflight: expected 4 GPUs, found 3\n")
    saved = tmp_path / "boot-check.args"
    where = ["--log-group", "boot-logs", "--region", "us-west-2", "--logs-endpoint", f"{closed}/", "--imds", closed]
    saved.write_text(json.dumps(["--fleet", "trn", "--neuron-devices", "1", "--dev", str(tmp_path), *where]))
    outputs = []
    for step in steps:
        step = step.removeprefix("-").replace(node_recovery.TAKE_OUT_MARKER, str(marker))
        step = step.replace("/dev/console", str(tmp_path / "console")).replace(
            host_check.NODE_PATH, str(host_check.SCRIPT)
        )
        if " drain " in step:
            step += f" {closed}/v1/metadata {closed}"
        if step.endswith(" confirm"):
            step += f" {saved}"
        done = subprocess.run(["/bin/sh", "-c", step], env=env, capture_output=True, text=True, timeout=20)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert any(o.startswith("training-node-take-out: could not set DRAINING (") for o in outputs)
    # Unsent, the host's check counts nothing, and says so.
    (unsent,) = [o for o in outputs if "host check" in o]
    assert unsent.startswith("training-node-take-out: host check not sent (") and "counts nothing" in unsent
    assert calls.read_text().splitlines()[-2:] == ["sleep 10", "systemctl --no-block poweroff"]


def test_the_drain_request_is_signed_as_botocore_signs_it(monkeypatch):
    import datetime

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHost)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    StandInHost.bodies.clear()
    try:
        assert boot_check.drain("eu-west-1", f"{endpoint}/", f"{endpoint}/v1/metadata", endpoint) == CONTAINER_INSTANCE
    finally:
        httpd.shutdown()
    ((sent, body),) = StandInHost.bodies
    when = datetime.datetime.strptime(sent["x-amz-date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: when)
    request = AWSRequest(
        "POST", f"{endpoint}/", data=body, headers={k: sent[k] for k in ("content-type", "x-amz-target")}
    )
    botocore.auth.SigV4Auth(Credentials("ASIAEXAMPLE", "secret", "session"), "ecs", "eu-west-1").add_auth(request)
    assert sent["authorization"] == request.headers["Authorization"]


@pytest.mark.parametrize("instance", ["g6.12xlarge", "trn2.48xlarge"])
def test_the_collector_follows_the_kernel_log_for_node_fault_xids_on_gpu_fleets_only(instance):
    _, script = boot_script(instance)
    (line,) = [x for x in script.splitlines() if x.startswith("ExecStart=/usr/bin/python3 /opt/training-node-metrics/")]
    # --gpu starts the kernel-log follower; its state directory defaults to the mounted one.
    assert (" --gpu" in line) is (CATALOG[instance].accelerator_kind is AcceleratorKind.NVIDIA_GPU)
    assert str(collector.STATE_DIR) == node_recovery.NODE_STATE_DIR


def test_the_compacted_collector_is_the_same_program(tmp_path):
    source = COLLECTOR.read_text()
    compact = compact_python(source)
    assert len(compact) < len(source) * 0.7
    # Same code: the ASTs match once docstrings are gone from both.
    assert ast.dump(_without_docstrings(ast.parse(source))) == ast.dump(_without_docstrings(ast.parse(compact)))
    ast.parse(compact, feature_version=(3, 9))
    script = tmp_path / "collector.py"
    script.write_text(compact)
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and "Node metrics of a training instance" in done.stdout


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(node.body) > 1:
                node.body = node.body[1:]
            elif isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                first.value.value = ""
    return tree


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("instance", EFA_TYPES)
def test_every_job_container_mounts_the_node_state_directory_read_write(instance, kind):
    c = container(of_type(instance, kind))
    (volume,) = c["Volumes"]
    assert volume["Host"]["SourcePath"] == "/var/lib/training-node"
    (mount,) = c["MountPoints"]
    assert mount == {"SourceVolume": volume["Name"], "ContainerPath": "/var/lib/training-node", "ReadOnly": False}


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_every_gpu_training_job_refuses_a_socket_fallback(instance):
    env = environment(container(of_type(instance, "TrainingJob")))
    if CATALOG[instance].accelerator_kind is AcceleratorKind.NVIDIA_GPU:
        # aws-ofi-nccl's plugin name: with it set, NCCL fails instead of falling back to TCP sockets.
        assert env["NCCL_NET"] == "AWS Libfabric"
    else:
        assert "NCCL_NET" not in env
