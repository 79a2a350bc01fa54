"""Boot-time host check of a training node, run from the launch template's user data before the ECS
agent starts (the ECS AL2023 agent unit is ordered After=cloud-final.service). Host Python (AL2023's
system python3.9), stdlib only.

First it waits for what the AMI may still be setting up: the NVIDIA driver's load service where the
unit exists (`systemctl start` of a oneshot unit returns when it has run), then udev
(`udevadm settle`), then it counts the devices again until they are all there or SETTLE_SECONDS
have passed. Then it judges what a job cannot fix: accelerator count, Xid errors in the kernel log,
EFA devices (and the EFA provider when libfabric is on the host), and on Isaac Sim fleets the Vulkan
ICD and the GL/EGL driver libraries the NVIDIA container toolkit injects with the graphics capability.

A failure is a NODE fault (fewer GPUs, Neuron or EFA devices than the type has; Xid lines: this
instance is bad, another may not be) or a SHARED fault (a tool, library or file the AMI lacks, a
provider that does not load: every node of the fleet has it, so replacing the node cannot help).
Prints ONE JSON line (CloudWatch embedded metric format: BootCheckFailed 0/1, dimension sets
[Fleet] and [Fleet, Fault] with Fault node, shared or none) to stdout, which cloud-init copies to the
console, and sends the same line to a CloudWatch log group. Exit 0: healthy; EXIT_FAILED: a node
fault, the node must not take jobs; EXIT_SHARED: a shared fault only, written (one line) to
SHARED_FAULT_FILE for the job preflight, and the node registers; anything else: the check broke.

`boot_check.py drain REGION ECS_ENDPOINT`: the first step of a node's take-out
(training_constructs/health/node_recovery.py), with the same signed-request code: sets this container
instance DRAINING, on which ECS places no new task here ("Draining Amazon ECS container instances",
ECS developer guide) while the agent still reports the exit of the task that asked for the take-out.
The cluster and container instance come from the agent's introspection endpoint ("Amazon ECS container
introspection"); the instance role's AmazonEC2ContainerServiceforEC2Role grants
ecs:UpdateContainerInstancesState (the agent's own Spot draining uses it). Always exits 0: a failed
drain is said on the console, and the take-out goes on (mask, grace, power-off).

`boot_check.py confirm [ARGS_FILE]`: the take-out's host-side evidence, the only take-out the fleet's circuit
breaker counts (training_constructs/health/boot_breaker.py). The launcher asked for the take-out from inside a
job container, so its word proves nothing; the host checks itself again with the boot check's own arguments
(saved at boot to ARGS_FILE, under /run, which no job container mounts): the device counts, and the Xids that
need a GPU reset or a new node read from the kernel log itself (never the `xid-faults` file of the state
folder, which jobs can write). It sends ONE line to the boot-check log group, which jobs cannot write (the
multi-node jobs' awsvpc containers cannot reach IMDS, so not the instance role either), in embedded metric
format: TakeOutConfirmed 1 when it found a node fault, 0 when it did not, dimension [Fleet], with the
instance id and the failed checks. No arguments, no credentials or no endpoint: said on the console, nothing
counts. Always exits 0: the take-out goes on either way.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

EXIT_FAILED = 3
EXIT_SHARED = 4
NAMESPACE = "TrainingPlatform"  # config/metrics.py NAMESPACE
METRIC = "BootCheckFailed"  # config/metrics.py BOOT_CHECK_FAILED
CONFIRMED = "TakeOutConfirmed"  # config/metrics.py TAKE_OUT_CONFIRMED
TAKE_OUT = "training-node-take-out"  # node_recovery.py TAKE_OUT_UNIT: how its lines begin
FLEET_DIMENSION = "Fleet"  # config/metrics.py FLEET_DIMENSION
FAULT_DIMENSION = "Fault"  # config/metrics.py FAULT_DIMENSION
NODE, SHARED, NONE = "node", "shared", "none"  # config/metrics.py BOOT_FAULTS
# Read by the job preflight through the job containers' mount of its directory (user data makes it).
SHARED_FAULT_FILE = "/var/lib/training-node/shared-fault"
INSTANCE_FILE = "instance"  # beside it: container/launcher/straggler_record.py INSTANCE_FILE
# The boot check's arguments, for `confirm`: /run is the host's tmpfs (gone at the next boot), never mounted by a job.
ARGS_FILE = "/run/training-boot-check.args"
# The ECS AL2023 GPU AMI builds and loads the NVIDIA kernel module at boot in this oneshot unit,
# ordered before ecs.service but not before cloud-final (aws/amazon-ecs-ami
# scripts/al2023/gpu/nvidia-kmod-load.service), so user data can run before the GPUs exist.
DRIVER_UNIT = "nvidia-kmod-load.service"
SETTLE_SECONDS = 120
POLL_SECONDS = 5
IMDS = "http://169.254.169.254"
ECS_INTROSPECTION = "http://localhost:51678/v1/metadata"
ECS_TARGET = "AmazonEC2ContainerServiceV20141113"  # the ECS JSON API's target prefix (botocore's model)
# Xid lines as the NVIDIA driver logs them: "NVRM: Xid (PCI:0000:00:1e): 79, pid=..., GPU has fallen
# off the bus" (NVIDIA "Xid Errors" documentation).
XID = re.compile(r"NVRM: Xid \(PCI:[^)]*\): (\d+)")
# What `confirm` counts: the Xids that need a GPU reset or a new node (node_metrics/collector.py
# NODE_FAULT_XIDS); a job's own bug can raise others (13, 31, 43), and a job must not confirm its own take-out.
NODE_FAULT_XIDS = {48, 64, 74, 79, 95, 119, 120, 140, 154}
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")
# NVIDIA's RPM packaging (the ECS AL2023 GPU AMI's driver) installs nvidia_icd.<arch>.json, the .run
# installer nvidia_icd.json (NVIDIA/yum-packaging-nvidia-driver nvidia-driver.spec; the container
# toolkit's internal/discover/graphics.go looks for both). container/launcher/preflight.py uses the same pattern.
ICD_PATTERN = "nvidia_icd*.json"
# The counts retried while the AMI finishes loading drivers and udev makes the device nodes.
COUNTED = ("gpus", "neuron_devices", "efa_devices")
GRAPHICS_LIBRARIES = ("libGLX_nvidia.so.0", "libEGL_nvidia.so.0")
# The clock, replaceable by tests.
monotonic = time.monotonic
sleep = time.sleep


def run(*command: str, timeout: float = 60) -> str | None:
    """Output of a command found on PATH, or None when it is absent or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def wait_for_setup(args: argparse.Namespace, deadline: float) -> dict[str, str]:
    """Let the AMI finish what it does at boot, within the deadline: what each wait found."""
    waited: dict[str, str] = {}
    if args.gpus and args.driver_unit:
        if run("systemctl", "cat", args.driver_unit) is None:
            waited[args.driver_unit] = "absent"
        else:
            # Without --no-block, systemctl waits for the start job; for a oneshot unit that is its
            # ExecStart's end (systemctl(1); systemd.service(5), Type=oneshot). A unit that already ran
            # (RemainAfterExit) returns at once.
            left = max(deadline - monotonic(), 1)
            ran = run("systemctl", "start", args.driver_unit, timeout=left)
            waited[args.driver_unit] = "started" if ran is not None else "failed or timed out"
    left = max(int(deadline - monotonic()), 1)
    settled = run("udevadm", "settle", f"--timeout={left}", timeout=left + 5)
    waited["udev"] = "settled" if settled is not None else "no udevadm, or not settled"
    return waited


def check(args: argparse.Namespace, xids_counted: set[int] | None = None) -> dict[str, dict[str, Any]]:
    """Each check as {expected, found, ok, fault}; `fault` says what a failure would be. `xids_counted`: only
    these Xid codes fail the xid check (None: every one, as at boot, before any job ran)."""
    checks: dict[str, dict[str, Any]] = {}
    dev = Path(args.dev)

    def record(name: str, expected: Any, found: Any, ok: bool, fault: str = NODE) -> None:
        checks[name] = {"expected": expected, "found": found, "ok": ok, "fault": fault}

    if args.gpus:
        if shutil.which("nvidia-smi") is None:
            # The AMI has no NVIDIA driver at all: the wrong AMI for the fleet, shared by every node.
            record("gpus", args.gpus, "no nvidia-smi on the host", False, SHARED)
        else:
            listed = run("nvidia-smi", "--list-gpus") or ""
            found = len(re.findall(r"^GPU \d+:", listed, flags=re.MULTILINE))
            record("gpus", args.gpus, found, found >= args.gpus)
        log = run("dmesg") or ""
        xids = sorted({int(code) for code in XID.findall(log)})
        if xids_counted is not None:
            xids = [x for x in xids if x in xids_counted]
        record("xid", [], xids, not xids)
    if args.neuron_devices:
        found = len([p for p in dev.glob("neuron*") if re.fullmatch(r"neuron\d+", p.name)])
        record("neuron_devices", args.neuron_devices, found, found >= args.neuron_devices)
    if args.efa:
        found = len(list((dev / "infiniband").glob("uverbs*")))
        record("efa_devices", args.efa, found, found >= args.efa)
        if shutil.which("fi_info"):
            listed = run("fi_info", "-p", "efa") or ""
            ok = "provider: efa" in listed
            record("efa_provider", "efa", "efa" if ok else "none", ok, SHARED)
        else:
            # The ECS AMIs carry the EFA kernel driver only; libfabric ships in the image, and the
            # job preflight checks the provider there.
            record("efa_provider", "efa", "no fi_info on the host (checked by the job preflight)", True, SHARED)
    if args.vulkan:
        icds = sorted(str(p) for d in args.icd_dirs.split(":") for p in Path(d).glob(ICD_PATTERN) if p.is_file())
        record("vulkan_icd", ICD_PATTERN, icds, bool(icds), SHARED)
        libraries = run("ldconfig", "-p") or ""
        present = [lib for lib in GRAPHICS_LIBRARIES if lib in libraries]
        ok = len(present) == len(GRAPHICS_LIBRARIES)
        record("graphics_libraries", list(GRAPHICS_LIBRARIES), present, ok, SHARED)
    return checks


def settled_check(args: argparse.Namespace, deadline: float) -> dict[str, dict[str, Any]]:
    """The checks, the device counts retried until they pass or the deadline comes."""
    while True:
        checks = check(args)
        short = [n for n in COUNTED if n in checks and not checks[n]["ok"] and checks[n]["fault"] == NODE]
        left = deadline - monotonic()
        if not short or left <= 0:
            return checks
        sleep(min(args.poll_seconds, left))


def failures(checks: dict[str, dict[str, Any]], fault: str) -> list[str]:
    return [
        f"{name}: expected {c['expected']}, found {c['found']}"
        for name, c in checks.items()
        if not c["ok"] and c["fault"] == fault
    ]


def fault_of(checks: dict[str, dict[str, Any]]) -> str:
    """A node fault outweighs a shared one: the node goes either way."""
    if failures(checks, NODE):
        return NODE
    return SHARED if failures(checks, SHARED) else NONE


def emf(metric: str, *dimensions: list[str]) -> dict[str, Any]:
    """The embedded-metric-format directive of a line (CloudWatch user guide, "Specification: Embedded metric
    format"): `metric`, a count, under each dimension set."""
    directive = {"Namespace": NAMESPACE, "Dimensions": list(dimensions), "Metrics": [{"Name": metric, "Unit": "Count"}]}
    return {"_aws": {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": [directive]}}


def report(
    fleet: str,
    instance: dict[str, str],
    checks: dict[str, dict[str, Any]],
    seconds: float,
    waited: dict[str, str] | None = None,
) -> dict[str, Any]:
    fault = fault_of(checks)
    return {
        # [Fleet]: any failure (the fleet's boot-check alarm); [Fleet, Fault]: node faults apart from shared
        # ones (the circuit breaker counts node faults).
        **emf(METRIC, [FLEET_DIMENSION], [FLEET_DIMENSION, FAULT_DIMENSION]),
        FLEET_DIMENSION: fleet,
        FAULT_DIMENSION: fault,
        METRIC: 0 if fault == NONE else 1,
        **instance,
        "seconds": round(seconds, 1),
        "failed": failures(checks, NODE) + failures(checks, SHARED),
        "waited": waited or {},
        "checks": checks,
    }


def mark_shared_fault(path: Path, checks: dict[str, dict[str, Any]]) -> None:
    """One line naming the shared fault, for the job preflight to refuse jobs with (exit 78)."""
    line = "; ".join(failures(checks, SHARED))
    write_shared(path, f"boot check: {line}\n")


def write_shared(path: Path, text: str) -> None:
    """`path` made anew with `text` in the folder jobs share with the host (every job container mounts it
    read-write): whatever stood there, a job's link included, is removed (unlink(2) never follows a link), and
    O_CREAT | O_EXCL makes a new regular file and follows no link (open(2))."""
    if os.path.lexists(path):
        os.unlink(path)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as out:
        out.write(text)


def write_instance(path: Path, base: str = IMDS) -> None:
    """ "<instance id> <AZ>" where jobs read it (their containers run with IMDS blocked): the launcher's
    straggler watch names a slow node by them (container/launcher/straggler_record.py). Both are instance
    metadata categories (EC2 user guide, "Instance metadata categories": instance-id,
    placement/availability-zone); ECS's task metadata documents an AvailabilityZone for Fargate tasks only."""
    try:
        found = imds("meta-data/instance-id", base), imds("meta-data/placement/availability-zone", base)
        write_shared(path, " ".join(found) + "\n")
    except (OSError, ValueError, IndexError) as error:
        print(f"boot check: {path} not written ({error}); jobs name this node by its host name", file=sys.stderr)


def imds(path: str, base: str = IMDS) -> str:
    """IMDSv2: a session token, then the path (EC2 user guide, "Use IMDSv2")."""
    put = urllib.request.Request(
        f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    token = urllib.request.urlopen(put, timeout=5).read().decode()
    get = urllib.request.Request(f"{base}/latest/{path}", headers={"X-aws-ec2-metadata-token": token})
    return str(urllib.request.urlopen(get, timeout=5).read().decode())


def _sign(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def api_call(
    service: str, target: str, body: dict[str, Any], region: str, creds: dict[str, str], endpoint: str, **extra: str
) -> bytes:
    """One AWS JSON 1.1 API call, signed with Signature Version 4 (IAM user guide, "Create a signed AWS
    API request"); `extra` headers are signed too."""
    payload = json.dumps(body).encode()
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = endpoint.split("://", 1)[1].split("/", 1)[0]
    headers = {
        "content-type": "application/x-amz-json-1.1",
        "host": host,
        "x-amz-date": stamp,
        "x-amz-security-token": creds["Token"],
        "x-amz-target": target,
        **extra,
    }
    names = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            *(f"{k}:{headers[k]}" for k in sorted(headers)),
            "",
            names,
            hashlib.sha256(payload).hexdigest(),
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = _sign(_sign(_sign(_sign(("AWS4" + creds["SecretAccessKey"]).encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds['AccessKeyId']}/{scope}, SignedHeaders={names}, Signature={signature}"
    )
    request = urllib.request.Request(endpoint, data=payload, method="POST", headers=headers)
    return bytes(urllib.request.urlopen(request, timeout=10).read())


def logs_call(action: str, body: dict[str, Any], region: str, creds: dict[str, str], endpoint: str) -> None:
    """One CloudWatch Logs call. x-amzn-logs-format asks CloudWatch Logs to extract the embedded metrics
    (CloudWatch user guide, "Using the PutLogEvents API to send manually-created embedded metric format logs")."""
    api_call("logs", f"Logs_20140328.{action}", body, region, creds, endpoint, **{"x-amzn-logs-format": "json/emf"})


def instance_credentials(base: str = IMDS) -> dict[str, str]:
    role = imds("meta-data/iam/security-credentials/", base).split()[0]
    found: dict[str, str] = json.loads(imds(f"meta-data/iam/security-credentials/{role}", base))
    return found


def drain(region: str, endpoint: str, introspection: str = ECS_INTROSPECTION, imds_base: str = IMDS) -> str:
    """Set this container instance DRAINING; its ARN."""
    agent = json.loads(urllib.request.urlopen(introspection, timeout=5).read())
    instance = agent["ContainerInstanceArn"]
    body = {"cluster": agent["Cluster"], "containerInstances": [instance], "status": "DRAINING"}
    creds = instance_credentials(imds_base)
    api_call("ecs", ECS_TARGET + ".UpdateContainerInstancesState", body, region, creds, endpoint)
    return str(instance)


def drain_main(argv: list[str]) -> int:
    """drain REGION ECS_ENDPOINT [INTROSPECTION_URL IMDS_URL]"""
    try:
        print(f"{TAKE_OUT}: {drain(*argv[:4])} DRAINING: no new task here")
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        print(f"{TAKE_OUT}: could not set DRAINING ({error}); masking the agent, powering off")
    return 0


def ship(line: str, log_group: str, stream: str, region: str, creds: dict[str, str], endpoint: str) -> None:
    try:
        logs_call("CreateLogStream", {"logGroupName": log_group, "logStreamName": stream}, region, creds, endpoint)
    except urllib.error.HTTPError as error:
        if b"ResourceAlreadyExistsException" not in error.read():
            raise
    event = {"timestamp": int(time.time() * 1000), "message": line}
    body = {"logGroupName": log_group, "logStreamName": stream, "logEvents": [event]}
    logs_call("PutLogEvents", body, region, creds, endpoint)


def confirm(args: argparse.Namespace) -> int:
    """The take-out's host check and its one line (the module's docstring); shared faults never count."""
    found = failures(check(args, NODE_FAULT_XIDS), NODE)
    try:
        instance = imds("meta-data/instance-id", args.imds)
        line = {**emf(CONFIRMED, [FLEET_DIMENSION]), FLEET_DIMENSION: args.fleet, CONFIRMED: int(bool(found))}
        text = json.dumps({**line, "InstanceId": instance, "failed": found})
        ship(text, args.log_group, instance, args.region, instance_credentials(args.imds), args.logs_endpoint)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as error:
        text = f"host check not sent ({error}); this take-out counts nothing"
    print(f"{TAKE_OUT}: {text}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["drain"]:
        return drain_main(argv[1:])
    confirming = argv[:1] == ["confirm"]
    if confirming:
        try:
            argv = json.loads(Path(argv[1] if argv[1:] else ARGS_FILE).read_text())
        except (OSError, ValueError) as error:
            print(f"{TAKE_OUT}: host check not run ({error}); this take-out counts nothing")
            return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--neuron-devices", type=int, default=0)
    parser.add_argument("--efa", type=int, default=0)
    parser.add_argument("--vulkan", action="store_true")
    parser.add_argument("--log-group", help="CloudWatch log group for the result line")
    parser.add_argument("--region", help="the log group's region")
    parser.add_argument("--logs-endpoint", help="https://logs.<region>.<partition's URL suffix>/")
    parser.add_argument("--dev", default="/dev")
    parser.add_argument("--icd-dirs", default=":".join(ICD_DIRS))
    parser.add_argument("--driver-unit", default=DRIVER_UNIT, help="systemd unit that loads the GPU driver")
    parser.add_argument("--settle-seconds", type=float, default=SETTLE_SECONDS)
    parser.add_argument("--poll-seconds", type=float, default=POLL_SECONDS)
    parser.add_argument("--shared-fault-file", default=SHARED_FAULT_FILE)
    parser.add_argument("--imds", default=IMDS)
    args = parser.parse_args(argv)
    if confirming:
        return confirm(args)
    if args.log_group:
        try:
            write_shared(Path(ARGS_FILE), json.dumps(argv))
        except OSError as error:
            print(f"boot check: could not save its arguments ({error}); take-outs will count nothing", file=sys.stderr)
    started = monotonic()
    deadline = started + args.settle_seconds
    marker = Path(args.shared_fault_file)
    if os.path.lexists(marker):
        os.unlink(marker)  # from an earlier boot of this instance (a link is removed, not followed)
    waited = wait_for_setup(args, deadline)
    checks = settled_check(args, deadline)
    instance: dict[str, str] = {}
    creds = None
    if args.log_group:
        try:
            instance["InstanceId"] = imds("meta-data/instance-id", args.imds)
            instance["InstanceType"] = imds("meta-data/instance-type", args.imds)
            creds = instance_credentials(args.imds)
        except (OSError, ValueError, IndexError) as error:
            print(f"boot check: instance metadata unreachable ({error}); result on the console only", file=sys.stderr)
        write_instance(marker.with_name(INSTANCE_FILE), args.imds)
    result = report(args.fleet, instance, checks, monotonic() - started, waited)
    line = json.dumps(result, separators=(",", ":"))
    print(line, flush=True)
    if args.log_group and args.region and args.logs_endpoint and creds:
        try:
            ship(line, args.log_group, instance["InstanceId"], args.region, creds, args.logs_endpoint)
        except OSError as error:
            print(f"boot check: could not write to {args.log_group} ({error}); console only", file=sys.stderr)
    if result[FAULT_DIMENSION] == SHARED:
        try:
            mark_shared_fault(marker, checks)
        except OSError as error:
            print(f"boot check: could not write {marker} ({error})", file=sys.stderr)
        return EXIT_SHARED
    return EXIT_FAILED if result[FAULT_DIMENSION] == NODE else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
