"""The boot-time host check: node_scripts/boot_check.py against fake device trees and stand-in tools
that print what the real ones print (tests/fixtures/nvidia-h100), its CloudWatch Logs call against a
stand-in server on 127.0.0.1, and how each fleet's user data runs it before the ECS agent starts."""

from __future__ import annotations

import ast
import http.server
import json
import os
import re
import stat
import subprocess
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from config import metrics
from config.catalog import CATALOG, AcceleratorKind
from config.settings import fleet_construct_id as construct_id
from tests.harness import EFA_TYPES, ROOT, VARIANTS, bundle_command, fleet_name, node_files, resources, scrub, synth
from tests.test_compute import of_type, user_data
from training_constructs.common.node_files import compact_python, write_packed_files
from training_constructs.health import host_check
from training_constructs.health.node_scripts import boot_check
from training_constructs.observability.node_metrics import AGENT_CONFIG, COLLECTOR, INSTALL_DIR, agent_config

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


def gpu_list(count):
    return "".join(f"GPU {i}: NVIDIA L4 (UUID: GPU-{i})\n" for i in range(count))


def recording_tool(bin_dir: Path, name: str, log: Path, fails_unless: str = "") -> None:
    """A stand-in that appends its arguments to `log`; with `fails_unless`, `NAME cat UNIT` exits 1
    unless a file UNIT exists in that directory (systemctl cat of a unit the host does not have)."""
    bin_dir.mkdir(exist_ok=True)
    check = f'if [ "$1" = cat ] && [ ! -e "{fails_unless}/$2" ]; then exit 1; fi\n' if fails_unless else ""
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n{check}exit 0\n')
    script.chmod(0o755)


class FakeClock:
    """boot_check's clock: sleeping advances it at once, and runs what is due by then."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.due: list[tuple[float, object]] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        for at, action in list(self.due):
            if self.now - 1000.0 >= at:
                self.due.remove((at, action))
                action()  # type: ignore[operator]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A healthy g6.12xlarge-like Isaac Sim host: 4 GPUs, 1 EFA device, the Vulkan ICD, graphics libraries,
    the AMI's driver load unit, udev; a clock that never really sleeps."""
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "nvidia-smi", gpu_list(4))
    tool(bin_dir, "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text())
    tool(bin_dir, "ldconfig", (FIXTURES / "ldconfig-nvidia.txt").read_text())
    units = tmp_path / "units"
    units.mkdir()
    (units / boot_check.DRIVER_UNIT).touch()
    commands = tmp_path / "commands.log"
    recording_tool(bin_dir, "systemctl", commands, fails_unless=str(units))
    recording_tool(bin_dir, "udevadm", commands)
    dev = tmp_path / "dev"
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband" / "uverbs0").touch()
    icd = tmp_path / "icd.d"
    icd.mkdir()
    (icd / "nvidia_icd.json").write_text("{}")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    clock = FakeClock()
    monkeypatch.setattr(boot_check, "monotonic", clock.monotonic)
    monkeypatch.setattr(boot_check, "sleep", clock.sleep)
    marker = tmp_path / "training-node" / "shared-fault"
    marker.parent.mkdir()
    args = ["--fleet", "gpu", "--gpus", "4", "--efa", "1", "--vulkan", "--dev", str(dev), "--icd-dirs", str(icd)]
    args += ["--shared-fault-file", str(marker)]
    return {
        "bin": bin_dir,
        "dev": dev,
        "icd": icd,
        "args": args,
        "clock": clock,
        "units": units,
        "commands": commands,
        "marker": marker,
    }


def run(args, capsys):
    status = boot_check.main(args)
    out = capsys.readouterr().out.strip().splitlines()
    (line,) = out  # one JSON line per node
    return status, json.loads(line)


def test_a_healthy_node_passes_with_one_emf_line(node, capsys):
    node["marker"].write_text("boot check: from an earlier boot\n")
    status, result = run(node["args"], capsys)
    assert status == 0 and result["failed"] == [] and result[metrics.BOOT_CHECK_FAILED] == 0
    (directive,) = result["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == metrics.NAMESPACE
    # [Fleet]: the fleet's boot-check alarm; [Fleet, Fault]: what the circuit breaker counts.
    assert directive["Dimensions"] == [[metrics.FLEET_DIMENSION], [metrics.FLEET_DIMENSION, metrics.FAULT_DIMENSION]]
    assert directive["Metrics"] == [{"Name": metrics.BOOT_CHECK_FAILED, "Unit": "Count"}]
    assert result[metrics.FLEET_DIMENSION] == "gpu" and result[metrics.FAULT_DIMENSION] == "none"
    assert set(result["checks"]) == {"gpus", "xid", "efa_devices", "efa_provider", "vulkan_icd", "graphics_libraries"}
    assert result["seconds"] < 60 and node["clock"].slept == []
    assert not node["marker"].exists()  # a stale cause never outlives a healthy check


def test_fault_names_are_the_ones_the_alarms_read():
    assert (boot_check.NODE, boot_check.SHARED, boot_check.NONE) == metrics.BOOT_FAULTS
    assert boot_check.FAULT_DIMENSION == metrics.FAULT_DIMENSION
    assert boot_check.SHARED_FAULT_FILE == host_check.SHARED_FAULT_FILE
    assert boot_check.EXIT_SHARED == host_check.EXIT_SHARED


def failed(node, capsys, args=None):
    """A node fault: exit 3 (the user data powers the node off), no shared-fault marker."""
    status, result = run(args or node["args"], capsys)
    assert status == boot_check.EXIT_FAILED == host_check.EXIT_FAILED
    assert result[metrics.BOOT_CHECK_FAILED] == 1 and result[metrics.FAULT_DIMENSION] == "node"
    assert not node["marker"].exists()
    return result["failed"]


def shared(node, capsys, args=None):
    """A shared fault: exit 4 (the node registers), the cause in the marker file as one line."""
    status, result = run(args or node["args"], capsys)
    assert status == boot_check.EXIT_SHARED == host_check.EXIT_SHARED
    assert result[metrics.BOOT_CHECK_FAILED] == 1 and result[metrics.FAULT_DIMENSION] == "shared"
    (line,) = node["marker"].read_text().splitlines()
    assert line == "boot check: " + "; ".join(result["failed"])
    return result["failed"]


def test_wrong_gpu_count(node, capsys):
    tool(node["bin"], "nvidia-smi", (FIXTURES / "nvidia-smi-list-gpus.txt").read_text())
    assert failed(node, capsys) == ["gpus: expected 4, found 1"]


def test_a_node_short_of_one_gpu_is_a_node_fault_after_the_bounded_wait(node, capsys):
    tool(node["bin"], "nvidia-smi", gpu_list(3))
    assert failed(node, capsys) == ["gpus: expected 4, found 3"]
    # It kept counting for the whole settle time, and no longer.
    waited = sum(node["clock"].slept)
    assert waited == boot_check.SETTLE_SECONDS == 120
    assert max(node["clock"].slept) <= boot_check.POLL_SECONDS


def test_gpus_that_appear_20_seconds_after_the_start_pass(node, capsys):
    tool(node["bin"], "nvidia-smi", "No devices were found\n", status=6)
    (node["dev"] / "infiniband" / "uverbs0").unlink()
    node["clock"].due.append((20, lambda: tool(node["bin"], "nvidia-smi", gpu_list(4))))
    node["clock"].due.append((12, lambda: (node["dev"] / "infiniband" / "uverbs0").touch()))
    status, result = run(node["args"], capsys)
    assert status == 0 and result["failed"] == []
    assert 20 <= result["seconds"] < 20 + boot_check.POLL_SECONDS + 1


def test_the_settle_time_is_configurable(node, capsys):
    tool(node["bin"], "nvidia-smi", gpu_list(3))
    assert failed(node, capsys, [*node["args"], "--settle-seconds", "7", "--poll-seconds", "2"])
    assert node["clock"].slept == [2, 2, 2, 1]


def test_it_waits_for_the_amis_driver_unit_and_udev_first(node, capsys):
    assert run(node["args"], capsys)[0] == 0
    commands = node["commands"].read_text().splitlines()
    unit = boot_check.DRIVER_UNIT
    assert commands == [f"cat {unit}", f"start {unit}", "settle --timeout=120"]
    # Never the ECS agent: it waits for cloud-final, which waits for this script.
    assert not any("ecs" in c for c in commands)


def test_without_the_unit_it_starts_nothing(node, capsys):
    (node["units"] / boot_check.DRIVER_UNIT).unlink()
    status, result = run(node["args"], capsys)
    assert status == 0 and result["waited"][boot_check.DRIVER_UNIT] == "absent"
    assert node["commands"].read_text().splitlines() == [f"cat {boot_check.DRIVER_UNIT}", "settle --timeout=120"]


def test_neuron_fleets_wait_for_udev_only(node, capsys):
    for i in range(16):
        (node["dev"] / f"neuron{i}").touch()
    args = ["--fleet", "trn", "--neuron-devices", "16", "--efa", "1", "--dev", str(node["dev"])]
    assert run([*args, "--shared-fault-file", str(node["marker"])], capsys)[0] == 0
    assert node["commands"].read_text().splitlines() == ["settle --timeout=120"]


def test_xid_in_the_kernel_log(node, capsys):
    tool(node["bin"], "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text() + XID_LINE)
    assert failed(node, capsys) == ["xid: expected [], found [79]"]


def test_missing_efa_devices(node, capsys):
    (node["dev"] / "infiniband" / "uverbs0").unlink()
    assert failed(node, capsys) == ["efa_devices: expected 1, found 0"]


def test_missing_efa_provider_where_libfabric_is_on_the_host(node, capsys):
    tool(node["bin"], "fi_info", "fi_getinfo: -61 (No data available)\n", status=61)
    assert shared(node, capsys) == ["efa_provider: expected efa, found none"]
    tool(node["bin"], "fi_info", FI_INFO_EFA)
    assert run(node["args"], capsys)[0] == 0


def test_missing_vulkan_icd_is_a_shared_fault(node, capsys):
    (node["icd"] / "nvidia_icd.json").unlink()
    (node["icd"] / "intel_icd.x86_64.json").write_text("{}")  # another vendor's ICD does not count
    assert shared(node, capsys) == ["vulkan_icd: expected nvidia_icd*.json, found []"]
    assert node["clock"].slept == []  # nothing to wait for: no count is short


@pytest.mark.parametrize("name", ["nvidia_icd.x86_64.json", "nvidia_icd.aarch64.json"])
def test_the_icd_under_its_rpm_name_passes(node, capsys, name):
    # NVIDIA's RPM packaging, which the ECS AL2023 GPU AMI's driver comes from, installs the ICD as
    # nvidia_icd.<arch>.json (NVIDIA/yum-packaging-nvidia-driver, nvidia-driver.spec, %files libs).
    (node["icd"] / "nvidia_icd.json").rename(node["icd"] / name)
    status, result = run(node["args"], capsys)
    assert status == 0 and result["checks"]["vulkan_icd"]["found"] == [str(node["icd"] / name)]


def test_the_boot_check_and_the_preflight_share_one_icd_rule():
    import importlib.util

    spec = importlib.util.spec_from_file_location("preflight_rule", ROOT / "container" / "launcher" / "preflight.py")
    assert spec and spec.loader
    preflight = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preflight)
    assert boot_check.ICD_PATTERN == preflight.NVIDIA_ICD_PATTERN == "nvidia_icd*.json"
    assert set(boot_check.ICD_DIRS) <= set(preflight.NVIDIA_ICD_DIRS)


def test_missing_graphics_libraries_is_a_shared_fault(node, capsys):
    compute_only = "".join(
        line for line in (FIXTURES / "ldconfig-nvidia.txt").read_text().splitlines(True) if "GLX" not in line
    )
    tool(node["bin"], "ldconfig", compute_only)
    (found,) = shared(node, capsys)
    assert found.startswith("graphics_libraries: expected") and "libEGL_nvidia.so.0" in found


def test_no_driver_at_all_is_a_shared_fault(node, capsys):
    (node["bin"] / "nvidia-smi").unlink()
    assert shared(node, capsys) == ["gpus: expected 4, found no nvidia-smi on the host"]


def test_a_node_fault_outweighs_a_shared_one(node, capsys):
    (node["icd"] / "nvidia_icd.json").unlink()
    tool(node["bin"], "dmesg", (FIXTURES / "dmesg-nvrm.txt").read_text() + XID_LINE)
    assert failed(node, capsys) == ["xid: expected [], found [79]", "vulkan_icd: expected nvidia_icd*.json, found []"]


def test_wrong_neuron_device_count(node, capsys, tmp_path):
    for i in range(15):
        (node["dev"] / f"neuron{i}").touch()
    args = ["--fleet", "trn", "--neuron-devices", "16", "--efa", "1", "--dev", str(node["dev"])]
    args += ["--shared-fault-file", str(node["marker"])]
    assert failed(node, capsys, args) == ["neuron_devices: expected 16, found 15"]
    (node["dev"] / "neuron15").touch()
    assert run(args, capsys)[0] == 0


@pytest.mark.parametrize("script", [Path(boot_check.__file__), COLLECTOR], ids=["boot_check", "collector"])
def test_the_node_gets_the_same_program_less_its_docstrings_and_comments(script):
    source = script.read_text()
    shipped = compact_python(source)
    assert len(shipped) < len(source) * 0.8
    assert host_check.node_script() == compact_python(Path(boot_check.__file__).read_text()).encode()

    def first_lines_of_docstrings(tree):
        # compact_python keeps the module docstring's first line (argparse prints it) and a docstring
        # that is a body's only statement; it drops every other docstring.
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            first = body[0] if isinstance(body, list) and body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                if isinstance(node, ast.Module) or len(body) == 1:
                    first.value.value = first.value.value.strip().splitlines()[0]
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    node.body = body[1:]
        return ast.dump(tree)

    assert first_lines_of_docstrings(ast.parse(source)) == ast.dump(ast.parse(shipped))
    assert ast.parse(shipped, feature_version=(3, 9))


def test_scripts_parse_on_the_oldest_interpreters_they_run_on():
    # AL2023's system python on the nodes; Python 3.10 in the images.
    ast.parse(Path(boot_check.__file__).read_text(), feature_version=(3, 9))
    ast.parse((ROOT / "container" / "launcher" / "preflight.py").read_text(), feature_version=(3, 10))


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
    # The node runs exactly the script in the repository, less its docstrings and comments.
    assert node_files(script)[host_check.NODE_PATH] == host_check.node_script()
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
    # The ECS settings come first, then the node's files; the check runs before cloud-final ends, hence before
    # the agent.
    written = script.index(bundle_command(script))
    assert script.rindex("/etc/ecs/ecs.config") < written < script.index(command)


def test_a_failing_node_never_registers_and_terminates():
    lt, script = boot_script("g6.12xlarge")
    failing = script[script.index(f"-eq {host_check.EXIT_FAILED} ]; then") : script.index("elif")]
    assert "systemctl mask --runtime ecs.service" in failing
    assert "systemctl --no-block poweroff" in failing
    # Never a blocking call on the agent from inside cloud-final (it waits for cloud-final).
    assert not re.search(r"systemctl (restart|stop|start)\b", script)
    assert lt["InstanceInitiatedShutdownBehavior"] == "terminate"
    # A shared fault, or a check that could not run (any other status), does not take the node down (up
    # to the check's closing `fi`; the node's own take-out unit, training_constructs/health/node_recovery.py,
    # comes later).
    rest = script[script.index("elif") :]
    rest = rest[: rest.index("\nfi\n")]
    assert "poweroff" not in rest and "mask" not in rest
    assert f'elif [ "$boot_check_status" -eq {host_check.EXIT_SHARED} ]; then' in rest


def test_the_shared_fault_directory_exists_before_the_check_runs():
    _, script = boot_script("g6.12xlarge")
    lines = script.splitlines()
    mkdir = min(
        i for i, line in enumerate(lines) if line.startswith("mkdir -p ") and host_check.SHARED_FAULT_DIR in line
    )
    (command,) = [i for i, line in enumerate(lines) if line.startswith(f"python3 {host_check.NODE_PATH} ")]
    assert mkdir < command and host_check.SHARED_FAULT_FILE.startswith(host_check.SHARED_FAULT_DIR + "/")


@pytest.mark.parametrize("instance", ["g6.12xlarge", "p5.48xlarge", "p6-b300.48xlarge", "trn2.48xlarge"])
def test_user_data_stays_well_inside_ec2s_16_kb(instance):
    # EC2 refuses user data above 16 KB before its own base64 (EC2 user guide, "Run commands when you
    # launch an EC2 instance with user data"); Batch adds a part of its own, so keep room: 13 KB leaves
    # Batch 3 KB. The host check, the node-metrics collector and its agent configuration travel as one
    # gzip stream (training_constructs/common/node_files.py): about 1 KB smaller than packed one by one
    # (they share vocabulary), which made room for the take-out's host confirmation (issue 52).
    lt, script = boot_script(instance)
    assert len(user_data(lt).as_string().encode()) < 13 * 1024
    assert script.count("H4sI") == 1 and bundle_command(script)


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


def test_snapshots_keep_a_placeholder_for_the_packed_files():
    # The gzip bytes depend on the zlib build; the files themselves are pinned above and below.
    command = write_packed_files(host_check.host_check_files())
    splitter, _ = command.rsplit(" ", 1)
    assert scrub({"UserData": command}) == {"UserData": f"{splitter} '<packed-files>'"}


def test_the_bundle_in_the_user_data_writes_every_node_file_whole_with_its_folders(tmp_path: Path) -> None:
    # The fleet's own command, run with a root folder prefixed to its paths (the splitter's optional argument).
    _, script = boot_script("g6.12xlarge")
    root = tmp_path / "root"
    done = subprocess.run(["bash", "-c", f"{bundle_command(script)} {root}"], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    written = {f"/{path.relative_to(root)}": path for path in root.rglob("*") if not path.is_dir()}
    # Exactly these files (no temporary one left), each in the folder the splitter made for it.
    assert set(written) == {host_check.NODE_PATH, f"{INSTALL_DIR}/collector.py", AGENT_CONFIG}
    assert written[host_check.NODE_PATH].read_bytes() == host_check.node_script()
    assert written[f"{INSTALL_DIR}/collector.py"].read_bytes() == compact_python(COLLECTOR.read_text()).encode()
    assert json.loads(written[AGENT_CONFIG].read_bytes()) == agent_config(fleet=fleet_name("g6.12xlarge"), gpu=True)
    # The mode a shell redirect gave them before: 0666 less the umask.
    umask = os.umask(0o22)
    os.umask(umask)
    assert {stat.S_IMODE(path.stat().st_mode) for path in written.values()} == {0o666 & ~umask}
    # The test suite's reader of the bundle agrees with the node's.
    assert node_files(script) == {path: file.read_bytes() for path, file in written.items()}


def test_the_shared_fault_marker_replaces_a_link_a_job_put_there_never_writing_through_it(tmp_path: Path) -> None:
    # The state folder is mounted read-write in every job container; the boot check runs as root.
    precious = tmp_path / "host-file"
    precious.write_text("host data\n")
    marker = tmp_path / "shared-fault"
    marker.symlink_to(precious)
    checks = {"vulkan": {"expected": 1, "found": 0, "ok": False, "fault": boot_check.SHARED}}
    boot_check.mark_shared_fault(marker, checks)
    assert precious.read_text() == "host data\n"
    assert not marker.is_symlink() and marker.read_text() == "boot check: vulkan: expected 1, found 0\n"


def test_the_take_out_reason_on_the_console_is_never_read_through_a_link(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from training_constructs.health.node_recovery import TAKE_OUT_MARKER, take_out_steps

    if shutil.which("dd") is None:
        pytest.skip("needs dd")
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash\n")
    console = tmp_path / "console"
    say = take_out_steps(region="us-east-1", url_suffix="amazonaws.com")[0]
    command = say.replace(TAKE_OUT_MARKER, str(tmp_path / "take-out")).replace("/dev/console", str(console))
    argv = ["sh", "-c", command[len("sh -c '") : -1]]
    (tmp_path / "take-out").symlink_to(secret)
    subprocess.run(argv, check=True, timeout=10)
    assert "secret" not in console.read_text() and "powering off" in console.read_text()
    (tmp_path / "take-out").unlink()
    (tmp_path / "take-out").write_text("hang, hardware fault: Xid 79\x1b[2J\n")
    subprocess.run(argv, check=True, timeout=10)
    said = console.read_text()
    assert "(hang, hardware fault: Xid 79[2J)" in said  # the reason, printable characters only
