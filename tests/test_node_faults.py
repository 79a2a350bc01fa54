"""Node faults through the real launcher (container/distributed_run.sh) on one host: a child that fails
its preflight ends the main node within seconds with exit 75 naming it; a trainer that dies while the
host recorded a node-fault Xid exits 75 and leaves the take-out marker; the same crash without the Xid
stays exit 1 with no marker. Every address is loopback; the devices are fake directories."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.test_launcher import LAUNCHER, base_env, free_port, launch
from training_constructs.observability.node_metrics import collector as xid

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import node_fault  # noqa: E402

XID_79 = "[ 8812.000001] NVRM: Xid (PCI:0000:00:1e): 79, pid=4242, name=python, GPU has fallen off the bus."
XID_13 = "[ 8812.000001] NVRM: Xid (PCI:0000:00:1e): 13, pid=4242, name=python, Graphics Exception"


def test_a_child_that_fails_its_preflight_ends_the_main_node_within_60_s_with_75_naming_it(tmp_path):
    master, report = free_port(), free_port()
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_ID": "j#0", "MASTER_ADDR": "127.0.0.1"}
    nodes |= {"MASTER_PORT": str(master), "NODE_REPORT_PORT": str(report), "NPROC_PER_NODE": "1"}
    (tmp_path / "main").mkdir()
    (tmp_path / "child").mkdir()
    (tmp_path / "infiniband").mkdir()  # the child's fake device directory: no uverbs device
    started = time.monotonic()
    # The real torchrun on the main node: without the report it would wait RDZV_JOIN_TIMEOUT (1800 s).
    main = launch(base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="0", NODE_STATE_DIR=str(tmp_path / "main")), "t.py")
    child_env = base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="1", NODE_STATE_DIR=str(tmp_path / "child"))
    child_env |= {"EFA_DEVICES": "1", "EFA_DEVICE_DIR": str(tmp_path / "infiniband")}
    child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=120)
    try:
        _, main_err = main.communicate(timeout=120)
    finally:
        main.kill()
    elapsed = time.monotonic() - started
    assert child.returncode == 75, child.stderr
    assert main.returncode == 75, main_err
    assert elapsed < 60
    (line,) = [x for x in main_err.splitlines() if x.startswith("distributed_run.sh: node 1 (")]
    assert "expected 1 EFA devices (uverbs*)" in line and "found 0" in line
    assert "ending this job with exit 75" in line
    print(f"\nmain node exit 75 after {elapsed:.1f} s: {line}")
    # Only the faulty node asks its host to take it out.
    assert "expected 1 EFA devices" in (tmp_path / "child" / "take-out").read_text()
    assert not (tmp_path / "main" / "take-out").exists()


def test_a_child_failing_fast_while_the_main_node_is_still_in_its_slow_preflight_ends_it_with_75(tmp_path):
    """A warm host: the child fails its preflight in a second while the main node's own preflight still
    waits on a slow tool (here an nvidia-smi that would answer after the preflight's 60 s limit). The
    main node listens from its start, so it hears the child and ends at once, stopping its checks."""
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_ID": "j#0", "MASTER_ADDR": "127.0.0.1"}
    nodes |= {"MASTER_PORT": str(free_port()), "NODE_REPORT_PORT": str(free_port()), "NPROC_PER_NODE": "1"}
    for name in ("main", "child", "infiniband", "slow-bin"):
        (tmp_path / name).mkdir()
    slow_tool = tmp_path / "slow-bin" / "nvidia-smi"
    pid_file = tmp_path / "slow-tool.pid"
    slow_tool.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 300\n")
    slow_tool.chmod(0o755)
    main_env = base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="0", NODE_STATE_DIR=str(tmp_path / "main"))
    main_env |= {"EXPECTED_GPUS": "1", "PATH": f"{tmp_path / 'slow-bin'}:{main_env['PATH']}"}
    main = launch(main_env, "t.py")
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "the main node's preflight never reached its slow tool"
        started = time.monotonic()  # the child starts while the main node is inside its preflight
        child_env = base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="1", NODE_STATE_DIR=str(tmp_path / "child"))
        child_env |= {"EFA_DEVICES": "1", "EFA_DEVICE_DIR": str(tmp_path / "infiniband")}
        child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=120)
        _, main_err = main.communicate(timeout=120)
        elapsed = time.monotonic() - started
    finally:
        main.kill()
    assert child.returncode == 75, child.stderr
    assert main.returncode == 75, main_err
    assert elapsed < 60
    (line,) = [x for x in main_err.splitlines() if x.startswith("distributed_run.sh: node 1 (")]
    assert "expected 1 EFA devices (uverbs*)" in line and "ending this job with exit 75" in line
    assert "preflight failed on node 0" not in main_err  # the main node did not wait for its own verdict
    print(f"\nchild preflight failure -> main node exit 75 in {elapsed:.1f} s, its own preflight still running")
    # The main node's checks went with it: the slow tool is no longer running.
    slow = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(slow) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(slow)
    assert "expected 1 EFA devices" in (tmp_path / "child" / "take-out").read_text()
    assert not (tmp_path / "main" / "take-out").exists()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_child_reports_before_it_writes_its_take_out_marker(tmp_path):
    """The host stops taking tasks and powers off once the marker exists: the report must come first.
    The main node's listener here records whether the marker existed when the report arrived."""
    import threading

    port = free_port()
    launcher = subprocess.Popen(["sleep", "30"])
    out = tmp_path / "report"
    state = tmp_path / "child"
    state.mkdir()
    (tmp_path / "infiniband").mkdir()
    seen: list[bool] = []
    deliver = node_fault.deliver

    def delivered(*args: object, **kwargs: object) -> bool:
        seen.append((state / "take-out").exists())  # at the moment the report arrives
        return deliver(*args, **kwargs)  # type: ignore[arg-type]

    def listen() -> None:
        node_fault.listen(port, launcher.pid, out, "j", 0.1)

    listener = threading.Thread(target=listen)
    node_fault.deliver = delivered
    listener.start()
    try:
        nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_ID": "j#1", "MASTER_ADDR": "127.0.0.1"}
        nodes |= {"MASTER_PORT": str(free_port()), "NODE_REPORT_PORT": str(port), "NPROC_PER_NODE": "1"}
        child_env = base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="1", NODE_STATE_DIR=str(state))
        child_env |= {"EFA_DEVICES": "1", "EFA_DEVICE_DIR": str(tmp_path / "infiniband")}
        child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=60)
        listener.join(timeout=10)
    finally:
        node_fault.deliver = deliver
        launcher.kill()
    assert child.returncode == 75, child.stderr
    assert out.read_text().startswith("75 node 1 (")
    assert seen == [False]
    assert (state / "take-out").exists()


def test_a_childs_bad_input_ends_the_main_node_with_2_not_a_retry(tmp_path):
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_ID": "j#0", "MASTER_ADDR": "127.0.0.1"}
    nodes |= {"MASTER_PORT": str(free_port()), "NODE_REPORT_PORT": str(free_port()), "NPROC_PER_NODE": "1"}
    (tmp_path / "main").mkdir()
    (tmp_path / "child").mkdir()
    main = launch(base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="0", NODE_STATE_DIR=str(tmp_path / "main")), "t.py")
    child_env = base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="1", NODE_STATE_DIR=str(tmp_path / "child"))
    child_env["CHECKPOINT_URI"] = "not-an-s3-uri"
    child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=120)
    try:
        _, main_err = main.communicate(timeout=120)
    finally:
        main.kill()
    assert child.returncode == 2, child.stderr
    # The same input on every attempt: exit 2 is not retried (the job definitions retry 75 only).
    assert main.returncode == 2, main_err
    assert "ending this job with exit 2 (not retried)" in main_err
    assert not (tmp_path / "child" / "take-out").exists()


def xid_during_training(tmp_path: Path, state: Path, *kernel_lines: str) -> str:
    """Shell lines for a stand-in trainer that appends what the host's Xid watcher would write when the
    kernel logs `kernel_lines` now, during training (before it, the preflight would catch them)."""
    scratch = tmp_path / "watcher"
    scratch.mkdir(exist_ok=True)
    xid.record_node_faults(scratch, kernel_lines)  # the watcher's own lines; their stamps become "now"
    pending = scratch / "xid-faults"
    pending.touch()
    return f'sed "s/^[0-9.]*/$(date +%s)/" {pending} >> {state / "xid-faults"}\n'


def crash(tmp_path: Path, *kernel_lines: str, settle: str = "5") -> subprocess.CompletedProcess[str]:
    """A one-node Batch run whose trainer raises (exit 1), after the host's Xid watcher saw `kernel_lines`."""
    state = tmp_path / "state"
    state.mkdir()
    trainer = tmp_path / "python.sh"
    trainer.write_text(
        "#!/bin/sh\n" + xid_during_training(tmp_path, state, *kernel_lines)
        + "echo 'RuntimeError: CUDA error: unspecified launch failure' >&2\nexit 1\n"
    )  # fmt: skip
    trainer.chmod(0o755)
    env = base_env(PYTHON=str(trainer), NODE_STATE_DIR=str(state), AWS_BATCH_JOB_NUM_NODES="1")
    env |= {"AWS_BATCH_JOB_NODE_INDEX": "0", "MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "1"}
    env["XID_SETTLE_SECONDS"] = settle
    return subprocess.run([str(LAUNCHER), "t.py"], env=env, capture_output=True, text=True, timeout=60)


def test_a_crash_with_a_node_fault_xid_exits_75_and_asks_for_take_out(tmp_path):
    result = crash(tmp_path, "[ 1.0] usb 1-1: new device", XID_79)
    assert result.returncode == 75, result.stderr
    assert "hardware fault: NVIDIA Xid needing a GPU reset or a new node" in result.stderr
    marker = (tmp_path / "state" / "take-out").read_text()
    assert "GPU has fallen off the bus" in marker
    assert '"NodesTakenOut":1' in result.stdout


def test_the_same_crash_without_the_xid_stays_1_with_no_marker(tmp_path):
    # Xid 13 is the application's own fault (NVIDIA: restart the application).
    # No settle wait: the record is there before the crash (the wait itself is node_fault.judge's).
    result = crash(tmp_path, XID_13, settle="0")
    assert result.returncode == 1, result.stderr
    assert "hardware fault" not in result.stderr
    assert not (tmp_path / "state" / "take-out").exists()


def test_an_xid_read_again_after_a_collector_restart_keeps_its_kernel_time():
    # dmesg --follow replays the ring buffer: the line's own time ([8812.000001] s after boot), not
    # the time it was read, decides whether it happened during this run.
    assert xid.line_time(XID_79, boot=1_000_000.0) == 1_000_000.0 + 8812.000001
    assert xid.line_time("no timestamp here", boot=1_000_000.0) is None


def test_an_xid_from_before_this_run_does_not_count(tmp_path):
    state = tmp_path
    xid.record_node_faults(state, [XID_79], now=1000.0)
    assert node_fault.xid_faults(state, since=2000.0) == []
    assert node_fault.xid_faults(state, since=1000.0) == [f"79 {XID_79}"]


def test_the_xid_list_is_the_catalog_reset_or_reboot_codes():
    # NVIDIA's Xid catalog: reset the GPU or reboot for these; 13, 31, 43, 45 and 94 restart the application.
    assert {48, 64, 74, 79, 95, 119, 120, 140, 154} == xid.NODE_FAULT_XIDS
    assert not {13, 31, 43, 45, 94} & xid.NODE_FAULT_XIDS
    assert xid.xid_code(XID_79) == 79 and xid.xid_code("NVRM: loading driver") is None


def test_missing_devices_after_the_crash_are_a_hardware_fault(tmp_path):
    (tmp_path / "infiniband").mkdir()
    environ = {"NODE_STATE_DIR": str(tmp_path), "EFA_DEVICES": "2", "EFA_DEVICE_DIR": str(tmp_path / "infiniband")}
    fault = node_fault.judge(environ, since=0, settle=0)
    assert fault is not None and "expected 2 EFA devices (uverbs*)" in fault and "found 0" in fault
    assert node_fault.judge({"NODE_STATE_DIR": str(tmp_path)}, since=0, settle=0) is None


def test_metric_names_match_config():
    from config import metrics

    assert node_fault.NODES_TAKEN_OUT == metrics.NODES_TAKEN_OUT
    assert (node_fault.NAMESPACE, node_fault.FLEET_DIMENSION) == (metrics.NAMESPACE, metrics.FLEET_DIMENSION)
    assert node_fault.FLEET_ENV == metrics.FLEET_ENV


def test_a_childs_hardware_fault_during_training_ends_the_main_node_with_75(tmp_path):
    master, report = free_port(), free_port()
    nodes = {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_ID": "j#0", "MASTER_ADDR": "127.0.0.1"}
    nodes |= {"MASTER_PORT": str(master), "NODE_REPORT_PORT": str(report), "NPROC_PER_NODE": "1"}
    (tmp_path / "main").mkdir()
    (tmp_path / "child").mkdir()
    record = xid_during_training(tmp_path, tmp_path / "child", XID_79)
    for name, body in (("main", "exec sleep 60"), ("child", f"sleep 1\n{record}exit 1")):
        trainer = tmp_path / f"{name}.sh"
        trainer.write_text(f"#!/bin/sh\n{body}\n")
        trainer.chmod(0o755)
    started = time.monotonic()
    main = launch(base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="0", PYTHON=str(tmp_path / "main.sh"),
                           NODE_STATE_DIR=str(tmp_path / "main")), "t.py")  # fmt: skip
    child_env = base_env(**nodes, AWS_BATCH_JOB_NODE_INDEX="1", PYTHON=str(tmp_path / "child.sh"))
    child_env["NODE_STATE_DIR"] = str(tmp_path / "child")
    child = subprocess.run([str(LAUNCHER), "t.py"], env=child_env, capture_output=True, text=True, timeout=60)
    try:
        _, main_err = main.communicate(timeout=60)
    finally:
        main.kill()
    assert child.returncode == 75, child.stderr
    assert main.returncode == 75, main_err
    assert time.monotonic() - started < 30  # the main trainer alone would have run 60 s
    (line,) = [x for x in main_err.splitlines() if x.startswith("distributed_run.sh: node 1 (")]
    assert "hardware fault: NVIDIA Xid needing a GPU reset or a new node" in line and "79" in line
    assert "GPU has fallen off the bus" in (tmp_path / "child" / "take-out").read_text()
    assert not (tmp_path / "main" / "take-out").exists()


def ending(node: int, code: int, line: str) -> dict[str, object]:
    return {"node": node, "code": code, "line": line, "rank": None, "when": "", "error": ""}


def test_the_listener_takes_only_its_own_jobs_report(tmp_path):
    import threading

    port = free_port()
    launcher = subprocess.Popen(["sleep", "30"])  # stands in for the launcher, which SIGUSR1 stops here
    out = tmp_path / "report"
    listener = threading.Thread(target=node_fault.listen, args=(port, launcher.pid, out, "job-a", 0.1))
    listener.start()
    try:
        assert node_fault.report("127.0.0.1", port, "job-b", ending(1, 75, "node 1 (h): from another job"), 10)
        assert node_fault.report("127.0.0.1", port, "job-a", ending(1, 75, "node 1 (h): expected 4 GPUs, found 3"), 10)
        listener.join(timeout=10)
        assert out.read_text() == "75 node 1 (h): expected 4 GPUs, found 3\n"
        assert launcher.wait(timeout=10) == -10  # SIGUSR1
    finally:
        launcher.kill()


def test_the_listener_keeps_each_childs_word_and_stops_training_only_for_a_failure(tmp_path):
    import json
    import threading

    port = free_port()
    launcher = subprocess.Popen(["sleep", "30"])
    out, children = tmp_path / "report", tmp_path / "children"
    args = (port, launcher.pid, out, "job-a", 0.1, None, children)
    listener = threading.Thread(target=node_fault.listen, args=args)
    listener.start()
    try:
        assert node_fault.send("127.0.0.1", port, "alive job-a 2", within=10)
        assert node_fault.send("127.0.0.1", port, "alive job-b 3", within=10)
        assert node_fault.report("127.0.0.1", port, "job-a", ending(2, 0, "node 2 (h): its trainer succeeded"), 10)
        deadline = time.monotonic() + 10
        while not (children / "node-2").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (children / "node-2.alive").exists() and not (children / "node-3.alive").exists()
        assert json.loads((children / "node-2").read_text())["code"] == 0
        assert not out.exists() and launcher.poll() is None  # a child's success stops nothing
        failing = {**ending(1, 1, "node 1 (h): rank 3 failed: ValueError: bad (exit 1)"), "rank": 3}
        assert node_fault.report("127.0.0.1", port, "job-a", failing, 10)
        listener.join(timeout=10)
        assert out.read_text() == "1 node 1 (h): rank 3 failed: ValueError: bad (exit 1)\n"
        assert json.loads((children / "node-1").read_text())["rank"] == 3
        assert launcher.wait(timeout=10) == -10
    finally:
        launcher.kill()


def uptime_file(tmp_path: Path, seconds: float) -> str:
    path = tmp_path / "uptime"
    path.write_text(f"{seconds:.2f} 1000.00\n")
    return str(path)


def test_the_preflight_fails_a_node_whose_host_recorded_a_reset_xid_since_boot(tmp_path):
    # The host booted an hour ago; an Xid 79 10 minutes ago (a job that Batch stopped, say) is this boot's.
    now = time.time()
    xid.record_node_faults(tmp_path, [XID_79], now=now - 600)
    environ = {"NODE_STATE_DIR": str(tmp_path), "PROC_UPTIME": uptime_file(tmp_path, 3600)}
    preflight = node_fault._preflight()
    (found,) = preflight.failures(environ)
    assert found.startswith("no NVIDIA Xid needing a GPU reset since boot, found 1: 79 ")
    assert "GPU has fallen off the bus" in found
    # The same record from before this boot (an instance reused after a reboot) does not count.
    assert preflight.failures({**environ, "PROC_UPTIME": uptime_file(tmp_path, 60)}) == []


def test_a_reset_xid_since_boot_fails_the_launchers_preflight_with_75_and_a_take_out(tmp_path):
    xid.record_node_faults(tmp_path, [XID_79], now=time.time() - 600)
    env = base_env(NODE_STATE_DIR=str(tmp_path), PROC_UPTIME=uptime_file(tmp_path, 3600))
    env |= {"AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_NODE_INDEX": "0", "MASTER_ADDR": "127.0.0.1"}
    done = subprocess.run([str(LAUNCHER), "t.py"], env=env | {"NPROC_PER_NODE": "1"}, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 75, done.stderr
    assert "no NVIDIA Xid needing a GPU reset since boot, found 1" in done.stderr
    assert "GPU has fallen off the bus" in (tmp_path / "take-out").read_text()


def stopped_node(tmp_path: Path, xid_during_training: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A node whose trainer runs until Batch stops it (SIGTERM, as when the main node ended); the host's
    watcher records an Xid 79 during training or not."""
    state = tmp_path / "state"
    state.mkdir()
    started = tmp_path / "started"
    trainer = tmp_path / "trainer.sh"
    trainer.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
    trainer.chmod(0o755)
    env = base_env(PYTHON=str(trainer), NODE_STATE_DIR=str(state), PROC_UPTIME=uptime_file(tmp_path, 3600))
    env |= {"AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_NODE_INDEX": "0", "MASTER_ADDR": "127.0.0.1"}
    node = launch(env | {"NPROC_PER_NODE": "1"}, "t.py")
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists()
        if xid_during_training:
            xid.record_node_faults(state, [XID_79])
        node.terminate()
        out, err = node.communicate(timeout=30)
    finally:
        node.kill()
    return subprocess.CompletedProcess(node.args, node.returncode, out, err), state


def test_a_stopped_node_with_a_reset_xid_asks_its_host_to_take_it_out(tmp_path):
    result, state = stopped_node(tmp_path, xid_during_training=True)
    assert result.returncode == 143, result.stderr  # a stop keeps its status
    assert "stopped with a hardware fault recorded: NVIDIA Xid needing a GPU reset" in result.stderr
    assert "GPU has fallen off the bus" in (state / "take-out").read_text()


def test_a_stopped_healthy_node_stays(tmp_path):
    result, state = stopped_node(tmp_path, xid_during_training=False)
    assert result.returncode == 143, result.stderr
    assert "hardware fault" not in result.stderr
    assert not (state / "take-out").exists()
