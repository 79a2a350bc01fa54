"""Boot-time host check of a training node, run from the launch template's user data before the ECS
agent starts (the ECS AL2023 agent unit is ordered After=cloud-final.service). Host Python (AL2023's
system python3.9), stdlib only.

Checks what a job cannot fix: accelerator count, Xid errors in the kernel log, EFA devices (and the
EFA provider when libfabric is on the host), and on Isaac Sim fleets the Vulkan ICD and the GL/EGL
driver libraries the NVIDIA container toolkit injects with the graphics capability. Prints ONE JSON
line (CloudWatch embedded metric format: BootCheckFailed 0/1, dimension Fleet) to stdout, which
cloud-init copies to the console, and sends the same line to a CloudWatch log group. Exit 0: healthy;
EXIT_FAILED: the node must not take jobs; anything else: the check itself broke.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import json
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
NAMESPACE = "TrainingPlatform"  # config/metrics.py NAMESPACE
METRIC = "BootCheckFailed"  # config/metrics.py BOOT_CHECK_FAILED
FLEET_DIMENSION = "Fleet"  # config/metrics.py FLEET_DIMENSION
IMDS = "http://169.254.169.254"
# Xid lines as the NVIDIA driver logs them: "NVRM: Xid (PCI:0000:00:1e): 79, pid=..., GPU has fallen
# off the bus" (NVIDIA "Xid Errors" documentation).
XID = re.compile(r"NVRM: Xid \(PCI:[^)]*\): (\d+)")
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")
GRAPHICS_LIBRARIES = ("libGLX_nvidia.so.0", "libEGL_nvidia.so.0")


def run(*command: str) -> str | None:
    """Output of a command found on PATH, or None when it is absent or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def check(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each check as {expected, found, ok}."""
    checks: dict[str, dict[str, Any]] = {}
    dev = Path(args.dev)

    def record(name: str, expected: Any, found: Any, ok: bool) -> None:
        checks[name] = {"expected": expected, "found": found, "ok": ok}

    if args.gpus:
        listed = run("nvidia-smi", "--list-gpus") or ""
        found = len(re.findall(r"^GPU \d+:", listed, flags=re.MULTILINE))
        record("gpus", args.gpus, found, found >= args.gpus)
        log = run("dmesg") or ""
        xids = sorted({int(code) for code in XID.findall(log)})
        record("xid", [], xids, not xids)
    if args.neuron_devices:
        found = len([p for p in dev.glob("neuron*") if re.fullmatch(r"neuron\d+", p.name)])
        record("neuron_devices", args.neuron_devices, found, found >= args.neuron_devices)
    if args.efa:
        found = len(list((dev / "infiniband").glob("uverbs*")))
        record("efa_devices", args.efa, found, found >= args.efa)
        if shutil.which("fi_info"):
            listed = run("fi_info", "-p", "efa") or ""
            record("efa_provider", "efa", "efa" if "provider: efa" in listed else "none", "provider: efa" in listed)
        else:
            # The ECS AMIs carry the EFA kernel driver only; libfabric ships in the image, and the
            # job preflight checks the provider there.
            record("efa_provider", "efa", "no fi_info on the host (checked by the job preflight)", True)
    if args.vulkan:
        icds = [d for d in args.icd_dirs.split(":") if Path(d, "nvidia_icd.json").is_file()]
        record("vulkan_icd", "nvidia_icd.json", icds, bool(icds))
        libraries = run("ldconfig", "-p") or ""
        present = [lib for lib in GRAPHICS_LIBRARIES if lib in libraries]
        record("graphics_libraries", list(GRAPHICS_LIBRARIES), present, len(present) == len(GRAPHICS_LIBRARIES))
    return checks


def report(fleet: str, instance: dict[str, str], checks: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
    failed = [f"{name}: expected {c['expected']}, found {c['found']}" for name, c in checks.items() if not c["ok"]]
    return {
        "_aws": {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [[FLEET_DIMENSION]],
                    "Metrics": [{"Name": METRIC, "Unit": "Count"}],
                }
            ],
        },
        FLEET_DIMENSION: fleet,
        METRIC: 1 if failed else 0,
        **instance,
        "seconds": round(seconds, 1),
        "failed": failed,
        "checks": checks,
    }


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


def logs_call(action: str, body: dict[str, Any], region: str, creds: dict[str, str], endpoint: str) -> None:
    """One CloudWatch Logs JSON API call, signed with Signature Version 4 (IAM user guide,
    "Create a signed AWS API request")."""
    payload = json.dumps(body).encode()
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = endpoint.split("://", 1)[1].split("/", 1)[0]
    headers = {
        "content-type": "application/x-amz-json-1.1",
        "host": host,
        "x-amz-date": stamp,
        "x-amz-security-token": creds["Token"],
        "x-amz-target": f"Logs_20140328.{action}",
        # Ask CloudWatch Logs to extract the embedded metrics (CloudWatch user guide, "Using the
        # PutLogEvents API to send manually-created embedded metric format logs").
        "x-amzn-logs-format": "json/emf",
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
    scope = f"{day}/{region}/logs/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = _sign(_sign(_sign(_sign(("AWS4" + creds["SecretAccessKey"]).encode(), day), region), "logs"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds['AccessKeyId']}/{scope}, SignedHeaders={names}, Signature={signature}"
    )
    request = urllib.request.Request(endpoint, data=payload, method="POST", headers=headers)
    urllib.request.urlopen(request, timeout=10).read()


def ship(line: str, log_group: str, stream: str, region: str, creds: dict[str, str], endpoint: str) -> None:
    try:
        logs_call("CreateLogStream", {"logGroupName": log_group, "logStreamName": stream}, region, creds, endpoint)
    except urllib.error.HTTPError as error:
        if b"ResourceAlreadyExistsException" not in error.read():
            raise
    event = {"timestamp": int(time.time() * 1000), "message": line}
    body = {"logGroupName": log_group, "logStreamName": stream, "logEvents": [event]}
    logs_call("PutLogEvents", body, region, creds, endpoint)


def main(argv: list[str]) -> int:
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
    args = parser.parse_args(argv)
    started = time.monotonic()
    checks = check(args)
    instance: dict[str, str] = {}
    creds = None
    if args.log_group:
        try:
            instance["InstanceId"] = imds("meta-data/instance-id")
            instance["InstanceType"] = imds("meta-data/instance-type")
            role = imds("meta-data/iam/security-credentials/").split()[0]
            creds = json.loads(imds(f"meta-data/iam/security-credentials/{role}"))
        except (OSError, ValueError, IndexError) as error:
            print(f"boot check: instance metadata unreachable ({error}); result on the console only", file=sys.stderr)
    line = json.dumps(report(args.fleet, instance, checks, time.monotonic() - started), separators=(",", ":"))
    print(line, flush=True)
    if args.log_group and args.region and args.logs_endpoint and creds:
        try:
            ship(line, args.log_group, instance["InstanceId"], args.region, creds, args.logs_endpoint)
        except OSError as error:
            print(f"boot check: could not write to {args.log_group} ({error}); console only", file=sys.stderr)
    return EXIT_FAILED if any(not c["ok"] for c in checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
