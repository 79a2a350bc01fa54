"""The node collector (training_constructs/observability/node_metrics/collector.py) against fake sysfs trees, the real
H100 kernel log and nvidia-smi output, and the agent configuration it feeds."""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from config import metrics
from training_constructs.common.node_files import compact_python
from training_constructs.observability.node_metrics import (
    COLLECTOR,
    INSTALL_DIR,
    agent_config,
    node_metrics_commands,
    node_metrics_files,
)
from training_constructs.observability.node_metrics import collector as c

# Real output of an H100 node (driver 580.159.04), copied from the team's shared fixtures.
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-h100"
# The line format of NVIDIA's Xid catalog ("Xid Errors", NVIDIA driver documentation).
XID_79 = "[ 1234.567890] NVRM: Xid (PCI:0000:00:1e): 79, pid=4242, name=python, GPU has fallen off the bus."


def efa_tree(root: Path, counters: dict[str, dict[str, int]]) -> Path:
    """/sys/class/infiniband/<device>/ports/1/hw_counters/<counter> files, as the EFA driver lays them out."""
    for device, values in counters.items():
        directory = root / device / "ports" / "1" / "hw_counters"
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in values.items():
            (directory / name).write_text(f"{value}\n")
    return root


def test_counters_are_summed_over_devices_and_missing_ones_count_zero(tmp_path):
    root = efa_tree(
        tmp_path,
        {
            "rdmap16s27": {"tx_bytes": 1000, "rx_bytes": 2000, "retrans_pkts": 3, "rx_drops": 1, "lifespan": 12},
            # An older device without the SRD network counters.
            "rdmap32s27": {"tx_bytes": 500, "rx_bytes": 700},
        },
    )
    totals = c.read_efa_counters(root)
    assert totals is not None
    assert totals["tx_bytes"] == 1500 and totals["rx_bytes"] == 2700
    assert totals["retrans_pkts"] == 3 and totals["rx_drops"] == 1
    assert totals["impaired_remote_conn_events"] == 0
    assert "lifespan" not in totals


def test_no_efa_device_is_none_not_zero(tmp_path):
    assert c.read_efa_counters(tmp_path) is None


def test_increases_survive_a_counter_reset():
    assert c.increases({"tx_bytes": 100, "rx_bytes": 50}, {"tx_bytes": 160, "rx_bytes": 20}) == {
        "tx_bytes": 60,
        "rx_bytes": 20,
    }


def test_healthy_h100_kernel_log_has_no_xid_and_a_real_xid_line_counts():
    healthy = (FIXTURES / "dmesg-nvrm.txt").read_text()
    assert "NVRM:" in healthy
    assert c.count_xid_lines(healthy) == 0
    assert c.count_xid_lines(healthy + XID_79 + "\n" + XID_79 + "\n") == 2


def test_power_is_read_from_the_nvidia_smi_query_form():
    # The fixture is `--query-gpu=index,utilization.gpu,memory.used,power.draw,temperature.gpu`; the
    # collector asks for power.draw alone, so take that column.
    rows = (FIXTURES / "nvidia-smi-query-noheader.csv").read_text().splitlines()
    power_column = "\n".join(row.split(",")[3] for row in rows)
    assert c.total_power_watts(power_column) == pytest.approx(72.58)
    assert c.total_power_watts("72.5\n[N/A]\n100.25\n") == pytest.approx(172.75)
    assert c.total_power_watts("") is None


def test_the_agent_finds_every_configured_gpu_measurement_in_the_driver_xml():
    # The agent's nvidia_gpu input (telegraf nvidia_smi, schema_v12 parser) reads these elements of
    # `nvidia-smi -q -x`; power_draw is left to the collector because driver 580 no longer writes it.
    source = {"utilization_gpu": "utilization/gpu_util", "memory_used": "fb_memory_usage/used",
              "temperature_gpu": "temperature/gpu_temp"}  # fmt: skip
    (gpu,) = ET.parse(FIXTURES / "nvidia-smi-q.xml").getroot().findall("gpu")  # noqa: S314 (our own fixture)
    assert set(metrics.GPU_MEASUREMENTS) == set(source)
    for path in source.values():
        assert gpu.find(path) is not None, path
    assert gpu.find("gpu_power_readings/power_draw") is None and gpu.find("power_readings/power_draw") is None
    assert gpu.find("gpu_power_readings/instant_power_draw") is not None


def test_sample_sends_increases_with_the_fleet_tag_only(tmp_path, monkeypatch):
    logs = iter(["", XID_79])
    monkeypatch.setattr(c, "kernel_log", lambda: next(logs))
    monkeypatch.setattr(c, "gpu_power_query", lambda: "300.5\n299.5\n")
    root = efa_tree(tmp_path, {"rdmap0": {"tx_bytes": 10, "retrans_pkts": 1}})
    collector = c.Collector(fleet="llm", sysfs=root, gpu=True)
    efa_tree(tmp_path, {"rdmap0": {"tx_bytes": 70, "retrans_pkts": 4}})
    lines = collector.sample()
    assert "EfaTxBytes:60|c|#Fleet:llm" in lines
    assert "EfaRetransmittedPackets:3|c|#Fleet:llm" in lines
    assert "GpuXidErrors:1|c|#Fleet:llm" in lines
    assert "GpuPowerDrawWatts:600|g|#Fleet:llm" in lines
    assert "NodeHeartbeat:1|g|#Fleet:llm" in lines
    # One tag, Fleet; the agent adds InstanceId. Nothing per device, so the metric count stays bounded.
    assert all(line.count("#") == 1 and line.endswith("|#Fleet:llm") for line in lines)


def test_names_match_config_metrics():
    assert c.EFA_COUNTERS == metrics.EFA_COUNTER_METRICS
    assert (c.XID_ERRORS, c.GPU_POWER, c.NODE_HEARTBEAT, c.FLEET_DIMENSION) == (
        metrics.XID_ERRORS,
        metrics.GPU_POWER,
        metrics.NODE_HEARTBEAT,
        metrics.FLEET_DIMENSION,
    )


def test_collector_parses_as_python_3_9_and_imports_only_the_standard_library():
    # Amazon Linux 2023's system python3 is 3.9; nothing is pip-installed on the host.
    tree = ast.parse(COLLECTOR.read_text(), feature_version=(3, 9))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_collector_runs_standalone_and_sends_statsd_over_udp(tmp_path):
    efa_tree(tmp_path, {"rdmap0": {"tx_bytes": 5}})
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(10)
        port = server.getsockname()[1]
        argv = [sys.executable, str(COLLECTOR), "--fleet", "rl", "--sysfs", str(tmp_path)]
        argv += ["--statsd", f"127.0.0.1:{port}", "--interval", "0", "--samples", "1"]
        subprocess.run(argv, check=True, cwd=tmp_path, timeout=20)
        payload = server.recv(65536).decode().splitlines()
    assert "EfaTxBytes:0|c|#Fleet:rl" in payload and "NodeHeartbeat:1|g|#Fleet:rl" in payload
    assert not any("Xid" in line or "Power" in line for line in payload)


@pytest.mark.parametrize("gpu", [True, False])
def test_agent_publishes_in_our_namespace_with_fleet_and_instance_only(gpu):
    config = agent_config(fleet="rl", gpu=gpu)["metrics"]
    assert config["namespace"] == metrics.NAMESPACE
    assert config["append_dimensions"] == {"InstanceId": "${aws:InstanceId}"}
    assert config["aggregation_dimensions"] == [["Fleet", "InstanceId"]]
    collected = config["metrics_collected"]
    assert set(collected) == ({"statsd", "nvidia_gpu"} if gpu else {"statsd"})
    # Only the node roll-ups are published: every original series (per GPU, per StatsD line) dropped.
    efa = ["EfaTxBytes", "EfaRxBytes", "EfaRdmaReadBytes", "EfaRdmaWriteBytes", "EfaRetransmittedPackets"]
    efa += ["EfaRetransmitTimeouts", "EfaRxDrops", "EfaUnresponsiveRemoteEvents", "EfaImpairedRemoteConnections"]
    expected = [*efa, "NodeHeartbeat", *(["GpuXidErrors", "GpuPowerDrawWatts"] if gpu else [])]
    assert collected["statsd"]["drop_original_metrics"] == expected
    if gpu:
        nvidia = collected["nvidia_gpu"]
        assert nvidia["append_dimensions"] == {"Fleet": "rl"}
        assert nvidia["drop_original_metrics"] == [
            "nvidia_smi_utilization_gpu",
            "nvidia_smi_memory_used",
            "nvidia_smi_temperature_gpu",
        ]
        assert metrics.GPU_UTILIZATION in nvidia["drop_original_metrics"]


def test_user_data_commands_write_the_compacted_collector_and_start_it():
    commands = node_metrics_commands(fleet="trn", gpu=False)
    script = "\n".join(commands)
    # The files travel apart from the commands, packed with the node's other files by the launch template
    # (training_constructs/common/node_files.py; read back from the user data in tests/test_monitoring.py):
    # the repository's collector without its docstrings and comments (tests/test_node_recovery.py proves that
    # is the same program), and the agent configuration.
    files = dict(node_metrics_files(fleet="trn", gpu=False))
    assert set(files) == {f"{INSTALL_DIR}/collector.py", f"{INSTALL_DIR}/cloudwatch-agent.json"}
    unpacked = files[f"{INSTALL_DIR}/collector.py"].decode()
    assert unpacked == compact_python(COLLECTOR.read_text())
    assert "def follow_kernel_log(" in unpacked and "NODE_FAULT_XIDS = frozenset(" in unpacked
    assert json.loads(files[f"{INSTALL_DIR}/cloudwatch-agent.json"]) == agent_config(fleet="trn", gpu=False)
    assert "H4sI" not in script
    (exec_start,) = [line for line in script.splitlines() if line.startswith("ExecStart=")]
    assert "--fleet trn --statsd 127.0.0.1:8125" in exec_start and "--gpu" not in exec_start
    # Installed in the background, so the ECS agent registers the node meanwhile; failures reach the console.
    assert commands[-1].endswith("&") and "/dev/console" in commands[-1]


def test_an_xid_is_never_written_through_a_link_a_job_put_in_the_shared_folder(tmp_path: Path) -> None:
    # Every job container mounts the state folder read-write; the collector runs as root on the host.
    precious = tmp_path / "host-file"
    precious.write_text("host data\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / c.XID_FAULTS).symlink_to(precious)
    xid = "[ 100.5] NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen off the bus."
    assert c.record_node_faults(state, [xid], now=1000.0) == 1
    assert precious.read_text() == "host data\n"
    assert not (state / c.XID_FAULTS).is_symlink() and "79" in (state / c.XID_FAULTS).read_text()


def test_a_fifo_in_the_shared_folder_fails_at_once_instead_of_blocking_the_host(tmp_path: Path) -> None:
    import os
    import time

    os.mkfifo(tmp_path / c.XID_FAULTS)
    xid = "[ 100.5] NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen off the bus."
    started = time.monotonic()
    with pytest.raises(OSError):
        c.record_node_faults(tmp_path, [xid], now=1000.0)
    assert time.monotonic() - started < 5
