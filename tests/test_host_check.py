"""The boot-time host check: node_scripts/boot_check.py against fake device trees and stand-in tools
that print what the real ones print (tests/fixtures/nvidia-h100), its CloudWatch Logs call against a
stand-in server on 127.0.0.1, and how each fleet's user data runs it before the ECS agent starts."""

from __future__ import annotations

import ast
import base64
import gzip
import http.server
import json
import re
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from config import metrics
from config.catalog import CATALOG, AcceleratorKind
from config.settings import fleet_construct_id as construct_id
from tests.harness import EFA_TYPES, ROOT, VARIANTS, fleet_name, resources, scrub, synth
from tests.test_compute import of_type, user_data
from training_constructs.health import host_check
from training_constructs.health.node_scripts import boot_check

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h100"
# An Xid line in the form the NVIDIA driver logs it (NVIDIA "Xid Errors" documentation).
XID_LINE = "[  812.113233] NVRM: Xid (PCI:0000:38:00): 79, pid=2210, name=python, GPU has fallen off the bus.\n"
FI_INFO_EFA = "provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n    type: FI_EP_RDM\n"


def tool(bin_dir: Path, name: str, output: str, status: int = 0) -> None:
    bin_dir.mkdir(exist_ok=True)
    text = bin_dir / f"{name}.out"
    text.write_text(output)
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\ncat "{text}"\nexit {status}\n')
    script.chmod(0o755)


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A healthy g6.12xlarge-like Isaac Sim host: 4 GPUs, 1 EFA device, the Vulkan ICD, graphics libraries."""
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "nvidia-smi", "".join(f"GPU {i}: NVIDIA L4 (UUID: GPU-{i})\n" for i in range(4)))
    tool(bin_dir, "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text())
    tool(bin_dir, "ldconfig", (FIXTURES / "ldconfig-nvidia.txt").read_text())
    dev = tmp_path / "dev"
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband" / "uverbs0").touch()
    icd = tmp_path / "icd.d"
    icd.mkdir()
    (icd / "nvidia_icd.json").write_text("{}")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    args = ["--fleet", "gpu", "--gpus", "4", "--efa", "1", "--vulkan", "--dev", str(dev), "--icd-dirs", str(icd)]
    return {"bin": bin_dir, "dev": dev, "icd": icd, "args": args}


def run(args, capsys):
    status = boot_check.main(args)
    out = capsys.readouterr().out.strip().splitlines()
    (line,) = out  # one JSON line per node
    return status, json.loads(line)


def test_a_healthy_node_passes_with_one_emf_line(node, capsys):
    status, result = run(node["args"], capsys)
    assert status == 0 and result["failed"] == [] and result[metrics.BOOT_CHECK_FAILED] == 0
    (directive,) = result["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == metrics.NAMESPACE
    assert directive["Dimensions"] == [[metrics.FLEET_DIMENSION]]
    assert directive["Metrics"] == [{"Name": metrics.BOOT_CHECK_FAILED, "Unit": "Count"}]
    assert result[metrics.FLEET_DIMENSION] == "gpu"
    assert set(result["checks"]) == {"gpus", "xid", "efa_devices", "efa_provider", "vulkan_icd", "graphics_libraries"}
    assert result["seconds"] < 60


def failed(node, capsys, args=None):
    status, result = run(args or node["args"], capsys)
    assert status == boot_check.EXIT_FAILED == host_check.EXIT_FAILED
    assert result[metrics.BOOT_CHECK_FAILED] == 1
    return result["failed"]


def test_wrong_gpu_count(node, capsys):
    tool(node["bin"], "nvidia-smi", (FIXTURES / "nvidia-smi-list-gpus.txt").read_text())
    assert failed(node, capsys) == ["gpus: expected 4, found 1"]


def test_xid_in_the_kernel_log(node, capsys):
    tool(node["bin"], "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text() + XID_LINE)
    assert failed(node, capsys) == ["xid: expected [], found [79]"]


def test_missing_efa_devices(node, capsys):
    (node["dev"] / "infiniband" / "uverbs0").unlink()
    assert failed(node, capsys) == ["efa_devices: expected 1, found 0"]


def test_missing_efa_provider_where_libfabric_is_on_the_host(node, capsys):
    tool(node["bin"], "fi_info", "fi_getinfo: -61 (No data available)\n", status=61)
    assert failed(node, capsys) == ["efa_provider: expected efa, found none"]
    tool(node["bin"], "fi_info", FI_INFO_EFA)
    assert run(node["args"], capsys)[0] == 0


def test_missing_vulkan_icd(node, capsys):
    (node["icd"] / "nvidia_icd.json").unlink()
    assert failed(node, capsys) == ["vulkan_icd: expected nvidia_icd.json, found []"]


def test_missing_graphics_libraries(node, capsys):
    compute_only = "".join(
        line for line in (FIXTURES / "ldconfig-nvidia.txt").read_text().splitlines(True) if "GLX" not in line
    )
    tool(node["bin"], "ldconfig", compute_only)
    (found,) = failed(node, capsys)
    assert found.startswith("graphics_libraries: expected") and "libEGL_nvidia.so.0" in found


def test_no_driver_at_all(node, capsys):
    (node["bin"] / "nvidia-smi").unlink()
    assert "gpus: expected 4, found 0" in failed(node, capsys)


def test_wrong_neuron_device_count(node, capsys, tmp_path):
    for i in range(15):
        (node["dev"] / f"neuron{i}").touch()
    args = ["--fleet", "trn", "--neuron-devices", "16", "--efa", "1", "--dev", str(node["dev"])]
    assert failed(node, capsys, args) == ["neuron_devices: expected 16, found 15"]
    (node["dev"] / "neuron15").touch()
    assert run(args, capsys)[0] == 0


def test_scripts_parse_on_the_oldest_interpreters_they_run_on():
    # AL2023's system python on the nodes; Python 3.10 in the images.
    ast.parse(Path(boot_check.__file__).read_text(), feature_version=(3, 9))
    ast.parse((ROOT / "container" / "preflight.py").read_text(), feature_version=(3, 10))


class Recorder(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, str, dict[str, str], bytes]]] = []

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        Recorder.requests.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}, b""))
        self._answer(b"token-1")

    def do_GET(self) -> None:
        Recorder.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, b""))
        self._answer(b"i-0123456789abcdef0")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.requests.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self._answer(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_line_goes_to_the_log_group_signed_with_the_instance_role(server):
    Recorder.requests.clear()
    creds = {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "Token": "session"}
    boot_check.ship('{"BootCheckFailed":0}', "boot-logs", "i-0123", "us-west-2", creds, f"{server}/")
    (create, put) = Recorder.requests
    assert create[2]["x-amz-target"] == "Logs_20140328.CreateLogStream"
    assert json.loads(create[3]) == {"logGroupName": "boot-logs", "logStreamName": "i-0123"}
    assert put[2]["x-amz-target"] == "Logs_20140328.PutLogEvents"
    assert put[2]["x-amzn-logs-format"] == "json/emf"
    assert put[2]["x-amz-security-token"] == "session"
    auth = put[2]["authorization"]
    day = put[2]["x-amz-date"][:8]
    assert auth.startswith(f"AWS4-HMAC-SHA256 Credential=ASIAEXAMPLE/{day}/us-west-2/logs/aws4_request, ")
    assert re.search(r"SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target;", auth)
    assert re.search(r"Signature=[0-9a-f]{64}$", auth)
    (event,) = json.loads(put[3])["logEvents"]
    assert event["message"] == '{"BootCheckFailed":0}'


def test_instance_metadata_is_read_with_an_imdsv2_token(server):
    Recorder.requests.clear()
    assert boot_check.imds("meta-data/instance-id", base=server) == "i-0123456789abcdef0"
    (put, get) = Recorder.requests
    assert put[1] == "/latest/api/token" and "x-aws-ec2-metadata-token-ttl-seconds" in put[2]
    assert get[1] == "/latest/meta-data/instance-id" and get[2]["x-aws-ec2-metadata-token"] == "token-1"


# How each fleet runs it: from the synthesized templates.
def boot_script(instance):
    _, lt, _ = of_type(instance)
    (part,) = [p for p in user_data(lt).walk() if not p.is_multipart()]
    return lt, part.get_payload(decode=True).decode()


@pytest.mark.parametrize("instance", EFA_TYPES)
def test_every_fleet_checks_its_host_before_the_agent_starts(instance):
    lt, script = boot_script(instance)
    spec = CATALOG[instance]
    lines = script.splitlines()
    (packed,) = [line for line in lines if line.startswith("echo '") and line.endswith(host_check.NODE_PATH)]
    blob = packed.split("'")[1]
    # The node runs exactly the script in the repository.
    assert gzip.decompress(base64.b64decode(blob)) == Path(boot_check.__file__).read_bytes()
    (command,) = [line for line in lines if line.startswith(f"python3 {host_check.NODE_PATH} ")]
    arguments = command.split()
    value = {arguments[i]: arguments[i + 1] for i in range(2, len(arguments) - 1) if arguments[i].startswith("--")}
    assert value["--fleet"] == fleet_name(instance)
    efa = [i for i in lt["NetworkInterfaces"] if i.get("InterfaceType") == "efa"]
    assert int(value["--efa"]) == spec.max_efa_interfaces == len(efa)
    if spec.accelerator_kind is AcceleratorKind.NEURON:
        assert int(value["--neuron-devices"]) == spec.accelerator_count and "--gpus" not in value
    else:
        assert int(value["--gpus"]) == spec.accelerator_count and "--neuron-devices" not in value
    assert ("--vulkan" in arguments) is spec.runs_isaac_sim
    assert value["--log-group"].startswith("<") and "BootCheckLogs" in value["--log-group"]
    assert value["--logs-endpoint"] == "https://logs.<AWS::Region>.<AWS::URLSuffix>/"
    # The ECS settings come first; the check runs before cloud-final ends, hence before the agent.
    assert lines.index(command) > max(i for i, line in enumerate(lines) if "/etc/ecs/ecs.config" in line)


def test_a_failing_node_never_registers_and_terminates():
    lt, script = boot_script("g6.12xlarge")
    failing = script[script.index(f"-eq {host_check.EXIT_FAILED} ]; then") : script.index("elif")]
    assert "systemctl mask --runtime ecs.service" in failing
    assert "systemctl --no-block poweroff" in failing
    # Never a blocking call on the agent from inside cloud-final (it waits for cloud-final).
    assert not re.search(r"systemctl (restart|stop|start)\b", script)
    assert lt["InstanceInitiatedShutdownBehavior"] == "terminate"
    # A check that could not run (any other status) does not take the node down (up to the check's
    # closing `fi`; the node's own take-out unit, training_constructs/health/node_recovery.py, comes later).
    elif_branch = script[script.index("elif") :]
    assert "poweroff" not in elif_branch[: elif_branch.index("\nfi\n")]


@pytest.mark.parametrize("instance", ["g6.12xlarge", "p5.48xlarge", "p6-b300.48xlarge", "trn2.48xlarge"])
def test_user_data_stays_well_inside_ec2s_16_kb(instance):
    # EC2 refuses user data above 16 KB before its own base64 (EC2 user guide, "Run commands when you
    # launch an EC2 instance with user data"); Batch adds a part of its own, so keep room. The host
    # check and the node-metrics collector both travel packed (training_constructs/common/node_files.py).
    lt, script = boot_script(instance)
    assert len(user_data(lt).as_string().encode()) < 12 * 1024
    assert len([line for line in script.splitlines() if line.startswith("echo 'H4sI")]) == 2


def test_boot_results_are_kept_with_the_apps_retention():
    for variant, days in (
        ("default", 30),
        ("pinned-az-endpoints", int(VARIANTS["pinned-az-endpoints"]["logRetentionDays"])),
    ):
        template = synth(variant).templates["TrainingCompute"]
        groups = {k: r for k, r in resources(template, "AWS::Logs::LogGroup").items() if "BootCheckLogs" in k}
        assert {k.split("BootCheckLogs")[0] for k in groups} == {construct_id("gpu"), construct_id("trainium")}
        for group in groups.values():
            assert group["DeletionPolicy"] == "Retain" and group["Properties"]["RetentionInDays"] == days


def test_the_signature_is_the_one_botocore_computes(server, monkeypatch):
    import datetime

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    Recorder.requests.clear()
    creds = {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "secret", "Token": "session"}
    boot_check.logs_call("PutLogEvents", {"logGroupName": "g"}, "eu-west-1", creds, f"{server}/")
    ((_, _, sent, body),) = Recorder.requests
    when = datetime.datetime.strptime(sent["x-amz-date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: when)
    signed = ("content-type", "x-amz-target", "x-amzn-logs-format")
    request = AWSRequest("POST", f"{server}/", data=body, headers={k: sent[k] for k in signed})
    botocore.auth.SigV4Auth(Credentials("ASIAEXAMPLE", "secret", "session"), "logs", "eu-west-1").add_auth(request)
    assert sent["authorization"] == request.headers["Authorization"]


def test_snapshots_keep_a_placeholder_for_the_packed_script():
    # The gzip bytes depend on the zlib build; the script itself is pinned above.
    line = f"echo '{host_check.packed_script()}' | base64 -d"
    assert scrub({"UserData": line}) == {"UserData": "echo '<packed-script>' | base64 -d"}
