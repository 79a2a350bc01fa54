"""The rehearsal's newer faults (stall-rank, batch-lag, cancel, budget-stop, never-start and preflight-fail on
the main node) on the stand-in node, and what it refuses before anything runs because it could not happen
on AWS: more nodes than the fleet holds, a fault for another kind of fleet, a --keep that is no usable
folder."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from budget_ledger.ledger import BATCH_REASON_PREFIX
from config.job_events import TRAINCTL_CANCEL_REASON
from tests.test_rehearsal import definition, record, run
from trainctl.errors import TrainctlError
from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.faults import fault_node, parse_fault
from trainctl.rehearsal.fleet_facts import FleetFacts
from trainctl.rehearsal.session import Options, check_fleet, rehearse
from trainctl.submitting.taskfile import make_task


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("batch-lag:1", "batch-lag hits no single node"),
        ("cancel=3", "cancel takes no =VALUE"),
        ("budget-stop:0", "budget-stop hits no single node"),
        ("stall-rank=2", "stall-rank takes no =VALUE"),
        ("batch-lag=soon", "write KIND[:NODE][=VALUE][@TRIGGER]"),
    ],
)
def test_a_bad_spec_of_a_new_fault_is_one_line_naming_it(spec, words):
    with pytest.raises(TrainctlError) as raised:
        parse_fault(spec)
    assert words in raised.value.message and "\n" not in raised.value.message


def test_the_new_faults_defaults():
    lag = parse_fault("batch-lag")
    assert (lag.value, lag.trigger, fault_node(lag, nodes=2, main=0)) == (45.0, "start", None)
    assert parse_fault("batch-lag=10@checkpoint:1").value == 10.0
    assert fault_node(parse_fault("stall-rank"), nodes=3, main=0) == 1
    assert fault_node(parse_fault("never-start:0"), nodes=2, main=0) == 0
    assert fault_node(parse_fault("cancel@seconds:5"), nodes=2, main=0) is None


def terminated(tmp_path: Path, fault: str) -> dict[str, Any]:
    report = run(tmp_path, faults=(fault,), expect="failed", STUB_SLEEP_0="30", STUB_SLEEP_1="30")
    assert report["ending"] == "FAILED" and report["as_expected"]
    (attempt,) = report["jobs"][0]["attempts"]
    # docker stop: every node got SIGTERM, which the stand-in answers with 143, well before its 30 s.
    assert [n["exit_code"] for n in attempt["nodes"]] == [143, 143] and attempt["ended_s"] < 15
    assert record(tmp_path, 0, what="term").strip() == record(tmp_path, 1, what="term").strip() == "TERM"
    assert attempt["retry"].startswith("not retried")
    return report


def test_a_cancel_stops_every_node_and_ends_the_job_failed_with_trainctls_reason(tmp_path):
    report = terminated(tmp_path, "cancel@seconds:1")
    job = report["jobs"][0]
    assert job["status_reason"] == TRAINCTL_CANCEL_REASON
    assert job["attempts"][0]["status_reason"] == TRAINCTL_CANCEL_REASON


def test_a_budget_stop_ends_the_job_with_the_budget_enforcements_reason(tmp_path):
    report = terminated(tmp_path, "budget-stop@seconds:1")
    reason = report["jobs"][0]["status_reason"]
    assert reason.startswith(f"{BATCH_REASON_PREFIX} team rehearsal reached ") and reason.endswith("checkpoints kept")


def test_a_main_node_that_never_starts_starts_no_child_and_the_definitions_rules_retry_it(tmp_path):
    report = run(tmp_path, faults=("never-start:0@start",), STUB_SLEEP_0="1")
    first, second = report["jobs"][0]["attempts"]
    main, child = first["nodes"]
    assert main["started_s"] is None and main["reason"].startswith("CannotPullContainerError:")
    assert main["status_reason"] == "Task failed to start" and child["started_s"] is None
    # The test definition's third rule (the job definitions' own): RETRY on "Task failed to start".
    assert first["retry"].startswith("retried: evaluateOnExit entry 3")
    assert not (tmp_path / "records" / "node-1-attempt-1.env").exists()
    assert report["ending"] == "SUCCEEDED" and [n["exit_code"] for n in second["nodes"]] == [0, 0]


def test_the_main_nodes_host_loses_a_device_before_it_starts(tmp_path):
    # Each node lists its host's EFA devices (the test definition expects one).
    script = tmp_path / "devices.sh"
    script.write_text(
        'ls "$EFA_DEVICE_DIR" > "$STUB_DIR/node-$AWS_BATCH_JOB_NODE_INDEX.devices"\n'
        '[ "$AWS_BATCH_JOB_NODE_INDEX" = 0 ] && sleep 2\nexit 0\n'
    )
    (tmp_path / "records").mkdir()
    task = make_task({"fleet": "gpu", "command": ["sh", str(script)], "launcher": False,
                      "env": {"STUB_DIR": str(tmp_path / "records")}}, where="")  # fmt: skip
    options = Options(nodes=2, deadline_seconds=30, definition=definition(), definition_source="test",
                      faults=("preflight-fail:0",))  # fmt: skip
    report = rehearse(task, assembly=tmp_path, options=options)
    listed = {n: (tmp_path / "records" / f"node-{n}.devices").read_text().split() for n in (0, 1)}
    assert listed == {0: [], 1: ["uverbs0"]}
    assert any("of node 0 lost EFA device uverbs0" in e["what"] for e in report["fault_events"])


def test_stall_rank_creates_the_nodes_stall_file_which_the_script_reads(tmp_path):
    # The stand-in waits for its stall file (REHEARSAL_STALL_FILE), and records it and what is in it.
    script = tmp_path / "stall.py"
    script.write_text(
        "import os, time\n"
        "path = os.environ['REHEARSAL_STALL_FILE']\n"
        "deadline = time.monotonic() + (6 if os.environ['AWS_BATCH_JOB_NODE_INDEX'] == '0' else 20)\n"
        "while not os.path.exists(path) and time.monotonic() < deadline: time.sleep(0.1)\n"
        "seen = open(path).read() if os.path.exists(path) else 'none'\n"
        "index = os.environ['AWS_BATCH_JOB_NODE_INDEX']\n"
        "open(os.environ['STUB_DIR'] + '/node-' + index + '.stall', 'w').write(path + ' ' + seen)\n"
    )
    (tmp_path / "records").mkdir()
    task = make_task({"fleet": "gpu", "command": [sys.executable, str(script)], "launcher": False,
                      "env": {"STUB_DIR": str(tmp_path / "records")}}, where="")  # fmt: skip
    options = Options(nodes=2, deadline_seconds=40, definition=definition(), definition_source="test",
                      faults=("stall-rank@seconds:1",))  # fmt: skip
    rehearse(task, assembly=tmp_path, options=options)
    paths = {n: (tmp_path / "records" / f"node-{n}.stall").read_text().split() for n in (0, 1)}
    # Node 1 (the first child) found its file naming local rank 0; node 0 never got one; each its own path.
    assert paths[1][1] == "0" and paths[0][1] == "none" and paths[0][0] != paths[1][0]


# ----------------------------------------------------------------------------------------------- refusals
def spec_with(**environment: str) -> JobSpec:
    return JobSpec(fleet="gpu", definition="d", nodes=2, main_node=0, command=("x",), environment=environment,
                   attempts=3, retry_rules=(), timeout_seconds=None, name="n")  # fmt: skip


FACTS = FleetFacts(600, "test", 3600, "test queue", max_nodes=4, max_nodes_from="maxvCpus 192, 48 vCPUs a node")
GPU = {"EFA_DEVICES": "1", "EXPECTED_GPUS": "4"}
TRAINIUM = {"EFA_DEVICES": "8", "EXPECTED_NEURON_DEVICES": "16"}


def refusal(spec: JobSpec, faults: tuple[str, ...] = (), facts: FleetFacts = FACTS) -> str:
    with pytest.raises(TrainctlError) as raised:
        check_fleet(spec, [parse_fault(f) for f in faults], facts, named="--nodes")
    assert "\n" not in raised.value.message
    return raised.value.message


def test_more_nodes_than_the_fleet_holds_are_refused():
    message = refusal(dataclasses.replace(spec_with(**GPU), nodes=5))
    assert message.startswith("--nodes 5: fleet gpu holds at most 4 nodes (maxvCpus 192, 48 vCPUs a node)")
    check_fleet(dataclasses.replace(spec_with(**GPU), nodes=4), [], FACTS, named="--nodes")


@pytest.mark.parametrize(
    ("environment", "fault", "words"),
    [
        (TRAINIUM, "xid:1", "expects no GPUs (EXPECTED_GPUS)"),
        (GPU, "neuron-tool-fail:1", "expects no Neuron devices (EXPECTED_NEURON_DEVICES)"),
        ({}, "preflight-fail:0", "expects no devices"),
        ({}, "slow-preflight", "expects no devices"),
    ],
)
def test_a_fault_for_another_kind_of_fleet_is_refused(environment, fault, words):
    message = refusal(spec_with(**environment), (fault,))
    assert message.startswith(f"--fault {fault!r}: fleet gpu's job definition") and words in message
    # The same fault on the fleet it is for is taken.
    right = GPU if fault == "xid:1" else TRAINIUM
    check_fleet(spec_with(**right), [parse_fault(fault)], FACTS, named="--nodes")


def test_a_capacity_cancel_on_a_queue_that_never_cancels_is_refused():
    never = dataclasses.replace(FACTS, capacity_wait_seconds=None, capacity_wait_from="q has no CANCEL")
    assert "never cancels for capacity (q has no CANCEL)" in refusal(spec_with(**GPU), ("capacity-cancel@seconds:1",),
                                                                     never)  # fmt: skip


def test_the_synthesized_gpu_fleet_refuses_five_nodes_and_a_neuron_fault(tmp_path):
    from tests.test_rehearsal_timing import synthesized

    task = make_task({"fleet": "gpu", "command": ["true"], "launcher": False}, where="")
    with pytest.raises(TrainctlError, match=r"--nodes 5: fleet gpu holds at most 3 nodes"):
        rehearse(task, assembly=synthesized(), options=Options(nodes=5))
    with pytest.raises(TrainctlError, match="neuron-tool-fail is for Trainium fleets"):
        rehearse(task, assembly=synthesized(), options=Options(nodes=2, faults=("neuron-tool-fail:1",)))


@pytest.mark.parametrize(
    ("keep", "words"),
    [
        ("file", "a file, not a folder"),
        ("file/below", "cannot create it"),
        ("/proc/rehearsal", "/proc holds the kernel's files"),
        ("/sys/x", "/sys holds the kernel's files"),
        ("full", "not empty"),
    ],
)
def test_a_keep_that_is_no_usable_folder_is_one_line_before_anything_runs(tmp_path, keep, words):
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.log").write_text("x")
    target = Path(keep) if keep.startswith("/") else tmp_path / keep
    with pytest.raises(TrainctlError) as raised:
        rehearse(make_task({"fleet": "gpu"}, where=""), assembly=tmp_path, options=Options(keep=target))
    assert raised.value.message.startswith(f"--keep {target}: ") and words in raised.value.message
