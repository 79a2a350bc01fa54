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
from tests.harness import EFA_TYPES
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
            "/latest/meta-data/iam/security-credentials/": "node-role",
            "/latest/meta-data/iam/security-credentials/node-role": json.dumps(
                {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "Token": "session"}
            ),
        }
        self._answer(answers[self.path].encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandInHost.bodies.append(({k.lower(): v for k, v in self.headers.items()}, body))
        with StandInHost.calls.open("a") as log:
            log.write(f"ecs {self.headers['X-Amz-Target'].split('.')[-1]} {json.loads(body)['status']}\n")
        self._answer(b"{}")

    def log_message(self, *args: object) -> None:
        pass


CLUSTER = "arn:aws:ecs:us-west-2:123456789012:cluster/AWSBatch-gpu-1a2b"
CONTAINER_INSTANCE = "arn:aws:ecs:us-west-2:123456789012:container-instance/AWSBatch-gpu-1a2b/0f1e2d"


def run_take_out(steps: list[str], tmp_path: Path, endpoint: str) -> tuple[list[str], str]:
    """The unit's steps on a fake host: systemd's "-" prefix dropped, the boot check's script from this
    repository, the stand-in endpoints for IMDS, introspection and ECS."""
    env, calls = fake_host(tmp_path)
    StandInHost.calls = calls
    marker = tmp_path / "take-out"
    marker.write_text("hardware fault: NVIDIA Xid 79, GPU has fallen off the bus\n")
    console = tmp_path / "console"
    for step in steps:
        step = step.removeprefix("-").replace(node_recovery.TAKE_OUT_MARKER, str(marker))
        step = step.replace("/dev/console", str(console)).replace(host_check.NODE_PATH, str(host_check.SCRIPT))
        if " drain " in step:
            step = re.sub(r" drain .*", f" drain us-west-2 {endpoint}/ {endpoint}/v1/metadata {endpoint}", step)
        subprocess.run(["/bin/sh", "-c", step], env=env, check=True, timeout=20)
    return calls.read_text().splitlines(), console.read_text()


@pytest.mark.parametrize("instance", ["g6.12xlarge", "trn2.48xlarge"])
def test_the_take_out_marker_drains_at_once_then_masks_the_agent_and_powers_off(instance, tmp_path):
    _, script = boot_script(instance)
    assert unit(script, "training-node-take-out.path") == ["[Path]", "PathExists=/var/lib/training-node/take-out"]
    service = unit(script, "training-node-take-out.service")
    assert service[:2] == ["[Service]", "Type=oneshot"]
    steps = [line.removeprefix("ExecStart=") for line in service[2:]]
    assert "systemctl --no-block start training-node-take-out.path" in script
    # The drain may fail without stopping the take-out: systemd ignores the exit of a "-" command.
    (drain,) = [step for step in steps if " drain " in step]
    assert drain == f"-python3 {host_check.NODE_PATH} drain <AWS::Region> https://ecs.<AWS::Region>.<AWS::URLSuffix>/"
    # The boot check's commands write the script before the unit can run it.
    assert script.index(host_check.NODE_PATH) < script.index("training-node-take-out.service")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHost)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    StandInHost.bodies.clear()
    try:
        calls, console = run_take_out(steps, tmp_path, f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
    # The reason goes to the console; no new task from the first second on; then the agent, then the node.
    assert calls == [
        "ecs UpdateContainerInstancesState DRAINING",
        "systemctl mask --runtime ecs.service",
        "sleep 10",
        "systemctl --no-block poweroff",
    ]
    assert "GPU has fallen off the bus" in console
    ((headers, body),) = StandInHost.bodies
    assert json.loads(body) == {"cluster": CLUSTER, "containerInstances": [CONTAINER_INSTANCE], "status": "DRAINING"}
    assert headers["x-amz-target"] == "AmazonEC2ContainerServiceV20141113.UpdateContainerInstancesState"
    assert "/us-west-2/ecs/aws4_request, " in headers["authorization"]  # signed for the region it was given
    assert headers["x-amz-security-token"] == "session"


def test_a_failed_drain_is_said_and_the_take_out_goes_on(tmp_path):
    steps = list(node_recovery.take_out_steps(region="us-west-2", url_suffix="amazonaws.com"))
    # Nothing listens on the endpoint: no introspection, no IMDS, no ECS.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env, calls = fake_host(tmp_path)
    marker = tmp_path / "take-out"
    marker.write_text("preflight: expected 4 GPUs, found 3\n")
    outputs = []
    for step in steps:
        step = step.removeprefix("-").replace(node_recovery.TAKE_OUT_MARKER, str(marker))
        step = step.replace("/dev/console", str(tmp_path / "console")).replace(
            host_check.NODE_PATH, str(host_check.SCRIPT)
        )
        if " drain " in step:
            step += f" {closed}/v1/metadata {closed}"
        done = subprocess.run(["/bin/sh", "-c", step], env=env, capture_output=True, text=True, timeout=20)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert any(o.startswith("training-node-take-out: could not set DRAINING (") for o in outputs)
    assert calls.read_text().splitlines()[-1] == "systemctl --no-block poweroff"


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
