"""Node metrics through the launch template's user data: the CloudWatch agent (GPU metrics through its
nvidia_gpu input on NVIDIA fleets) and the node collector (collector.py: EFA counters on every fleet,
NVIDIA Xid errors and GPU power on GPU fleets), as files and commands for `ecs_agent_user_data`.

Every metric lands in config.metrics.NAMESPACE with the dimensions Fleet and InstanceId and no others:
the agent rolls the per-GPU series (index, name, ...) up to the node (`aggregation_dimensions`) and
drops the originals (`drop_original_metrics`; CloudWatch agent guide, "Manually create or edit the
CloudWatch agent configuration file"). Nothing runs before a node exists, so nothing emits at zero.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from config.metrics import (
    EFA_COUNTER_METRICS,
    FLEET_DIMENSION,
    GPU_MEASUREMENTS,
    GPU_POWER,
    INSTANCE_DIMENSION,
    NAMESPACE,
    NODE_HEARTBEAT,
    XID_ERRORS,
)
from training_constructs.common.node_files import NodeFile, compact_python

COLLECTOR = Path(__file__).with_name("collector.py")
INSTALL_DIR = "/opt/training-node-metrics"
AGENT_CONFIG = f"{INSTALL_DIR}/cloudwatch-agent.json"
SERVICE = "training-node-metrics"
STATSD_ADDRESS = "127.0.0.1:8125"
INTERVAL_SECONDS = 60
# The agent is not on the ECS-optimized AL2023 AMIs. Amazon Linux 2023 locks its package repository to
# the release the AMI was built from (AL2023 user guide, "Deterministic upgrades through versioned
# repositories"), so this installs the agent version of that AMI release, not whatever is newest.
AGENT_PACKAGE = "amazon-cloudwatch-agent"
AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"


def gpu_metric_names() -> list[str]:
    return [f"nvidia_smi_{measurement}" for measurement in GPU_MEASUREMENTS]


def collector_metric_names(*, gpu: bool) -> list[str]:
    return [*EFA_COUNTER_METRICS.values(), NODE_HEARTBEAT, *([XID_ERRORS, GPU_POWER] if gpu else [])]


def agent_config(*, fleet: str, gpu: bool) -> dict[str, Any]:
    """The agent configuration: StatsD from the collector on every fleet, nvidia_gpu on GPU fleets."""
    collected: dict[str, Any] = {
        "statsd": {
            "service_address": STATSD_ADDRESS,
            "metrics_collection_interval": INTERVAL_SECONDS,
            "metrics_aggregation_interval": INTERVAL_SECONDS,
            "drop_original_metrics": collector_metric_names(gpu=gpu),
        }
    }
    if gpu:
        collected["nvidia_gpu"] = {
            "measurement": list(GPU_MEASUREMENTS),
            "metrics_collection_interval": INTERVAL_SECONDS,
            "append_dimensions": {FLEET_DIMENSION: fleet},
            "drop_original_metrics": gpu_metric_names(),
        }
    return {
        "agent": {"metrics_collection_interval": INTERVAL_SECONDS},
        "metrics": {
            "namespace": NAMESPACE,
            "append_dimensions": {INSTANCE_DIMENSION: "${aws:InstanceId}"},
            "aggregation_dimensions": [[FLEET_DIMENSION, INSTANCE_DIMENSION]],
            "metrics_collected": collected,
        },
    }


def _write(path: str, content: str) -> str:
    marker = "TRAINING_NODE_METRICS_EOF"
    if marker in content:
        raise ValueError(f"{path}: content contains the heredoc marker")
    return f"cat > {path} <<'{marker}'\n{content.rstrip()}\n{marker}"


def node_metrics_files(*, fleet: str, gpu: bool) -> list[NodeFile]:
    """The collector, compacted (docstrings and comments out: the user data has room for little more), and
    the agent configuration; the launch template writes them in one bundle before any command runs."""
    return [
        (f"{INSTALL_DIR}/collector.py", compact_python(COLLECTOR.read_text()).encode()),
        (AGENT_CONFIG, json.dumps(agent_config(fleet=fleet, gpu=gpu), separators=(",", ":")).encode()),
    ]


def node_metrics_commands(*, fleet: str, gpu: bool) -> list[str]:
    """Shell commands for the node's user data, which runs them after writing `node_metrics_files`. The
    agent is installed in the background so that the ECS agent registers the node without waiting; a
    failed setup says so on the instance console (EC2 GetConsoleOutput) instead of failing the boot."""
    gpu_flag = " --gpu" if gpu else ""
    unit = "\n".join(
        [
            "[Unit]",
            "Description=Training node metrics (EFA counters, GPU Xid errors and power) to the CloudWatch agent",
            "[Service]",
            f"ExecStart=/usr/bin/python3 {INSTALL_DIR}/collector.py --fleet {fleet}{gpu_flag}"
            f" --statsd {STATSD_ADDRESS} --interval {INTERVAL_SECONDS}",
            "Restart=always",
            "RestartSec=30",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    )
    setup = " && ".join(
        [
            f"dnf install -y {AGENT_PACKAGE}",
            f"{AGENT_CTL} -a fetch-config -m ec2 -s -c file:{AGENT_CONFIG}",
            f"systemctl enable --now {SERVICE}.service",
        ]
    )
    failure = f"echo '{SERVICE}: CloudWatch agent setup failed, no node metrics' > /dev/console"
    return [
        _write(f"/etc/systemd/system/{SERVICE}.service", unit),
        f"({setup} || {failure}) > /var/log/{SERVICE}-setup.log 2>&1 &",
    ]
