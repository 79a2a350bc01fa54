"""`trainctl rehearse` follows AWS Batch's multi-node rules (../shared/BATCH_MNP.md), one test per rule,
on stand-in nodes (tests/fixtures/rehearsal_node.sh) that record what they were given: no torch here. The
whole-job runs with the real launcher and the reference script are the fault catalog's (`make faults`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT
from trainctl.errors import TrainctlError
from trainctl.rehearsal import batch_rules, container_paths, hosts
from trainctl.rehearsal.definition import RetryRule, job_spec
from trainctl.rehearsal.faults import fault_node, parse_fault
from trainctl.rehearsal.nodes import container_processes
from trainctl.rehearsal.session import Options, rehearse
from trainctl.submitting.taskfile import make_task

STUB = ROOT / "tests" / "fixtures" / "rehearsal_node.sh"
# The job definitions' rules (training_constructs/jobs/multi_node_job.py RETRY_RULES, in the API's shape;
# test_rehearsal_reads_the_synthesized_job_definition in tests/test_jobs.py reads the real ones).
RULES = [
    {"action": "RETRY", "onStatusReason": "Host EC2*"},
    {"action": "RETRY", "onReason": "AGENT"},
    {"action": "RETRY", "onStatusReason": "Task failed to start"},
    {"action": "RETRY", "onExitCode": "75"},
    {"action": "EXIT", "onReason": "*"},
]


def definition(*, nodes: int = 2, main: int = 0, rules: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "nodeProperties": {
            "numNodes": nodes,
            "mainNode": main,
            "nodeRangeProperties": [
                {
                    "targetNodes": "0:",
                    "container": {"command": ["false"], "environment": [{"name": "EFA_DEVICES", "value": "1"}]},
                }
            ],
        },
        "retryStrategy": {"attempts": 3, "evaluateOnExit": RULES if rules is None else rules},
    }


def run(tmp_path: Path, *, nodes: int = 2, main: int = 0, rules: list[dict[str, str]] | None = None,
        faults: tuple[str, ...] = (), expect: str = "succeeded", **env: str) -> dict[str, Any]:  # fmt: skip
    """A rehearsal of the stand-in node; its records land in tmp_path/records."""
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    task = make_task(
        {"fleet": "gpu", "command": ["sh", str(STUB)], "launcher": False, "env": {"STUB_DIR": str(records), **env}},
        where="test: ",
    )
    options = Options(
        faults=faults,
        nodes=nodes,
        expect=expect,
        deadline_seconds=60,
        definition=definition(nodes=nodes, main=main, rules=rules),
        definition_source="test definition",
    )
    return rehearse(task, assembly=tmp_path / "no-cdk-out", options=options)


def record(tmp_path: Path, node: int, attempt: int = 1, what: str = "env") -> str:
    return (tmp_path / "records" / f"node-{node}-attempt-{attempt}.{what}").read_text()


def env_of(tmp_path: Path, node: int, attempt: int = 1) -> dict[str, str]:
    lines = record(tmp_path, node, attempt).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_every_node_gets_batchs_variables_and_only_children_the_main_address(tmp_path):
    report = run(tmp_path, nodes=3, main=1, STUB_SLEEP_1="2")
    job_id = report["jobs"][0]["job_id"]
    addresses = {n: record(tmp_path, n, what="address").split()[0] for n in range(3)}
    # Each node its own loopback address, never 127.0.0.1 ("localhost" would pass by accident).
    assert len(set(addresses.values())) == 3 and "127.0.0.1" not in addresses.values()
    for node in range(3):
        env = env_of(tmp_path, node)
        assert env["AWS_BATCH_JOB_ID"] == f"{job_id}#{node}"
        assert (env["AWS_BATCH_JOB_NUM_NODES"], env["AWS_BATCH_JOB_NODE_INDEX"]) == ("3", str(node))
        assert (env["AWS_BATCH_JOB_MAIN_NODE_INDEX"], env["AWS_BATCH_JOB_ATTEMPT"]) == ("1", "1")
        assert env["AWS_BATCH_CE_NAME"] and env["AWS_BATCH_JQ_NAME"]
        if node == 1:
            assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" not in env
        else:
            assert env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] == addresses[1]
        # No credential of the user's reaches a node; the local endpoint does.
        assert env["AWS_ACCESS_KEY_ID"] == "rehearsal" and env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")


def test_the_main_node_starts_first_and_the_children_after_it_runs(tmp_path):
    run(tmp_path, nodes=3, main=2, STUB_SLEEP_2="2")
    starts = {n: float(record(tmp_path, n, what="start")) for n in range(3)}
    assert starts[2] < starts[0] and starts[2] < starts[1]


def test_the_main_nodes_exit_ends_the_job_and_stops_the_children(tmp_path):
    report = run(tmp_path, STUB_SLEEP_0="1.5", STUB_SLEEP_1="30")
    assert report["ending"] == "SUCCEEDED"
    child = report["jobs"][0]["attempts"][0]["nodes"][1]
    # docker stop: SIGTERM to the container's first process, which the stand-in answers with 143.
    assert record(tmp_path, 1, what="term").strip() == "TERM"
    assert child["exit_code"] == 143 and child["ended_s"] < 10


def test_a_childs_failure_alone_ends_nothing(tmp_path):
    report = run(tmp_path, STUB_EXIT_1="3", STUB_SLEEP_0="2")
    (attempt,) = report["jobs"][0]["attempts"]
    assert report["ending"] == "SUCCEEDED" and attempt["exit_code"] == 0
    child = attempt["nodes"][1]
    assert child["exit_code"] == 3 and child["ended_s"] < attempt["nodes"][0]["ended_s"]


def test_a_retry_restarts_every_node_with_the_next_attempt_number(tmp_path):
    report = run(tmp_path, STUB_EXIT_0_1="75", STUB_SLEEP_0="1.5")
    attempts = report["jobs"][0]["attempts"]
    assert [a["exit_code"] for a in attempts] == [75, 0]
    assert attempts[0]["retry"].startswith("retried: evaluateOnExit entry 4")
    assert env_of(tmp_path, 1, attempt=2)["AWS_BATCH_JOB_ATTEMPT"] == "2"
    assert env_of(tmp_path, 1, attempt=2)["AWS_BATCH_JOB_ID"] == env_of(tmp_path, 1)["AWS_BATCH_JOB_ID"]


def test_the_main_nodes_exit_decides_the_retry_by_the_first_matching_rule(tmp_path):
    report = run(tmp_path, STUB_EXIT_0="1", expect="failed")
    (attempt,) = report["jobs"][0]["attempts"]
    assert attempt["retry"] == "not retried: evaluateOnExit entry 5 (EXIT on '*')"
    assert report["as_expected"] and report["ending"] == "FAILED"


def test_an_exit_no_rule_matches_is_retried_until_the_attempts_run_out(tmp_path):
    report = run(tmp_path, rules=[{"action": "EXIT", "onExitCode": "2"}], STUB_EXIT_0="1", expect="failed")
    attempts = report["jobs"][0]["attempts"]
    assert len(attempts) == 3
    assert attempts[0]["retry"] == "retried: no evaluateOnExit entry matched (Batch retries)"
    assert attempts[2]["retry"] == "not retried: attempts exhausted (3 of 3)"


@pytest.mark.parametrize(
    ("exit_code", "reason", "status_reason", "retried"),
    [
        (None, "", "Host EC2 (instance i-0abc) terminated.", True),
        (137, "", "Essential container in task exited", False),
        (75, "", "Essential container in task exited", True),
        (None, "CannotPullContainerError: pull access denied", "Task failed to start", True),
        (None, "OutOfMemoryError: Container killed due to memory usage", "Essential container in task exited", False),
        (1, "", "", False),
    ],
)
def test_evaluate_on_exit_globs(exit_code, reason, status_reason, retried):
    rules = tuple(
        RetryRule(r["action"], r.get("onStatusReason"), r.get("onReason"), r.get("onExitCode")) for r in RULES
    )
    decision, _ = batch_rules.retry_decision(rules, exit_code=exit_code, reason=reason, status_reason=status_reason)
    assert decision is retried


def test_a_glob_matches_exactly_or_by_its_start():
    rule = (RetryRule("EXIT", on_status_reason="Host EC2"),)
    assert batch_rules.retry_decision(rule, exit_code=None, reason="", status_reason="Host EC2 x")[0] is True
    assert batch_rules.retry_decision(rule, exit_code=None, reason="", status_reason="Host EC2")[0] is False


def test_a_retry_lands_on_the_warm_hosts_unless_one_was_taken_out(tmp_path):
    # Node 1 asks its host to take it out (the launcher's marker) and the main node exits 75: retried.
    report = run(tmp_path, nodes=3, STUB_EXIT_0_1="75", STUB_TAKE_OUT_1_1="1", STUB_SLEEP_0="1.5")
    first, second = (a["nodes"] for a in report["jobs"][0]["attempts"])
    assert first[0]["host"] == second[0]["host"] and first[2]["host"] == second[2]["host"]
    assert second[1]["host"] not in {n["host"] for n in first}
    taken = [h for h in report["hosts"] if h["taken_out"]]
    assert [h["host"] for h in taken] == [first[1]["host"]] and taken[0]["taken_out"] == "stub: node fault"


def test_a_lost_host_has_no_exit_code_and_a_host_reason(tmp_path):
    report = run(tmp_path, faults=("lose-host:0@seconds:0.5",), STUB_SLEEP_0="2", STUB_SLEEP_1="20")
    first = report["jobs"][0]["attempts"][0]
    assert first["exit_code"] is None and first["status_reason"].startswith("Host EC2 (instance i-")
    assert first["retry"].startswith("retried: evaluateOnExit entry 1")


def test_a_child_that_never_starts_is_failed_with_batchs_reason(tmp_path):
    report = run(tmp_path, faults=("never-start:1@start",), STUB_SLEEP_0="1")
    child = report["jobs"][0]["attempts"][0]["nodes"][1]
    assert child["started_s"] is None and child["reason"].startswith("CannotPullContainerError:")
    assert child["status_reason"] == "Task failed to start"
    assert not (tmp_path / "records" / "node-1-attempt-1.env").exists()


def test_describe_jobs_answers_for_the_node_jobs(tmp_path):
    # The stand-in main node asks the local endpoint about its child, as the launcher's watcher would.
    script = tmp_path / "ask.py"
    script.write_text(
        "import boto3, json, os, time\n"
        "job = os.environ['AWS_BATCH_JOB_ID'].split('#')[0]\n"
        "time.sleep(1.5)\n"
        "found = boto3.client('batch').describe_jobs(jobs=[job + '#1', job + '#0', 'other#1'])['jobs']\n"
        "open(os.environ['STUB_DIR'] + '/describe.json', 'w').write(json.dumps(found))\n"
    )
    records = tmp_path / "records"
    records.mkdir()
    task = make_task({"fleet": "gpu", "command": [sys.executable, str(script)], "launcher": False,
                      "env": {"STUB_DIR": str(records)}}, where="")  # fmt: skip
    options = Options(nodes=2, deadline_seconds=30, definition=definition(), definition_source="test",
                      faults=("kill-child@seconds:0.5",))  # fmt: skip
    report = rehearse(task, assembly=tmp_path, options=options)
    job_id = report["jobs"][0]["job_id"]
    found = {j["jobId"]: j for j in json.loads((records / "describe.json").read_text())}
    assert set(found) == {f"{job_id}#0", f"{job_id}#1"}
    assert found[f"{job_id}#1"]["status"] == "FAILED" and found[f"{job_id}#1"]["container"]["exitCode"] == 137
    assert found[f"{job_id}#0"]["status"] == "RUNNING"
    assert found[f"{job_id}#1"]["nodeDetails"] == {"nodeIndex": 1, "isMainNode": False}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("kill child", "write KIND[:NODE][=VALUE][@TRIGGER]"),
        ("melt-node@start", "unknown fault 'melt-node'"),
        ("s3-slowdown:1=5", "s3-slowdown hits no single node"),
        ("kill-child=3", "kill-child takes no =VALUE"),
        ("kill-child@checkpoint", "@checkpoint needs a number"),
        ("kill-child@attempt:0", "@attempt counts from 1"),
        ("never-start:1@seconds:5", "never-start names an attempt"),
        ("capacity-cancel", "capacity-cancel acts on the job's next retry"),
        ("xid:1=0", "an Xid is a whole number from 1"),
    ],
)
def test_a_bad_fault_is_one_line_naming_it(spec, words):
    with pytest.raises(TrainctlError) as raised:
        parse_fault(spec)
    assert words in raised.value.message and spec in raised.value.message
    assert len(raised.value.message) <= 200 and "\n" not in raised.value.message


def test_a_fault_on_a_node_the_job_lacks_is_refused():
    with pytest.raises(TrainctlError, match="the job has nodes 0 to 1"):
        fault_node(parse_fault("lose-host:5"), nodes=2, main=0)
    with pytest.raises(TrainctlError, match="node 0 is the main node; use kill-main"):
        fault_node(parse_fault("kill-child:0"), nodes=2, main=0)
    assert fault_node(parse_fault("kill-child"), nodes=3, main=0) == 1


def test_a_missing_synth_says_to_run_make_synth(tmp_path):
    task = make_task({"fleet": "gpu"}, where="")
    with pytest.raises(TrainctlError, match=r"no synthesized app at .*: run `make synth` first"):
        rehearse(task, assembly=tmp_path, options=Options())


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (Options(nodes=17), "--nodes 17: a rehearsal runs 1 to 16 nodes"),
        (Options(expect="maybe"), "--expect 'maybe': give succeeded or failed"),
        (Options(procs=0), "--procs 0: give 1 to 8"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(tmp_path, options, words):
    with pytest.raises(TrainctlError) as raised:
        rehearse(make_task({"fleet": "gpu"}, where=""), assembly=tmp_path, options=options)
    assert words in raised.value.message


def test_a_definition_that_is_not_multi_node_is_refused():
    with pytest.raises(TrainctlError, match="not a multi-node parallel job definition"):
        job_spec({"containerProperties": {}}, fleet="gpu", source="x", task=make_task({"fleet": "gpu"}, where=""),
                 name="n")  # fmt: skip


def test_the_take_out_grace_is_the_hosts():
    from training_constructs.health import node_recovery

    assert node_recovery.TAKE_OUT_GRACE_SECONDS == hosts.TAKE_OUT_GRACE_SECONDS


# It waits for a rehearsal's two nodes to start (the CLI, a local S3 server): what it asserts is what
# Ctrl-C leaves behind, not how fast they start, which on a machine running another suite beside it took
# more than the 30 s it used to wait.
@pytest.mark.timeout(150)
def test_ctrl_c_leaves_nothing_running(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    task_file = tmp_path / "task.yaml"
    task_file.write_text(
        json.dumps(
            {
                "fleet": "gpu",
                "nodes": 2,
                "command": ["sh", str(STUB)],
                "launcher": False,
                "env": {"STUB_DIR": str(records), "STUB_SLEEP_0": "60", "STUB_SLEEP_1": "60"},
            }
        )
    )
    app_dir = tmp_path / "cdk.out"
    app_dir.mkdir()
    template = {"Resources": {"Job": {"Type": "AWS::Batch::JobDefinition", "Properties": {
        "NodeProperties": {"NumNodes": 2, "MainNode": 0, "NodeRangeProperties": [{"TargetNodes": "0:", "Container": {
            "Command": ["false"]}}]}}}},
        "Outputs": {key: {"Value": {"Ref": "Job"}} for key in (
            "GpuTrainingJobDefinition", "GpuBenchmarkJobDefinition", "GpuJobQueue", "GpuLogGroup")}}  # fmt: skip
    (app_dir / "TrainingJobs.template.json").write_text(json.dumps(template))
    # SIGINT as a terminal's foreground process has it: a suite started from a background job of a
    # non-interactive shell (CI, `make test &`) inherits it ignored, and Python then installs no
    # KeyboardInterrupt handler, so the Ctrl-C below would never arrive (the rehearsal went on sleeping).
    cli = subprocess.Popen(
        [sys.executable, "-m", "trainctl", "rehearse", str(task_file), "--app", str(app_dir)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 100
    while not (records / "node-1-attempt-1.env").exists() and time.monotonic() < deadline and cli.poll() is None:
        time.sleep(0.1)
    tokens = {line.split("=", 1)[1] for n in (0, 1) for line in record(tmp_path, n).splitlines()
              if line.startswith("REHEARSAL_CONTAINER=")}  # fmt: skip
    assert len(tokens) == 2 and all(container_processes(t) for t in tokens)
    cli.send_signal(signal.SIGINT)
    try:
        _, err = cli.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        # Where it is stuck, for the failure's message: its stacks, then it is killed.
        spy = Path(sys.executable).parent / "py-spy"
        stacks = subprocess.run([str(spy), "dump", "--pid", str(cli.pid)], capture_output=True, text=True, timeout=30)
        cli.kill()
        raise AssertionError(f"Ctrl-C did not end the rehearsal within 30 s:\n{stacks.stdout}{stacks.stderr}") from None
    assert cli.returncode == 130 and "every node was stopped" in err
    assert not any(container_processes(t) for t in tokens)
    assert os.listdir(records)  # the stand-ins ran


@pytest.mark.skipif(container_paths.unavailable() is not None, reason="this machine makes no mount namespaces")
def test_every_node_has_its_own_folder_at_the_containers_checkpoint_path(tmp_path):
    """Scripts that write to the documented default /tmp/checkpoints (or ${CHECKPOINT_DIR}) write to their
    node's folder, as in a container, though the nodes share this machine's /tmp."""
    container = container_paths.CONTAINER_CHECKPOINT_DIR
    # The launcher's default on Batch, where the job sets no CHECKPOINT_DIR.
    assert f'DEFAULT_DIR = "{container}"' in (ROOT / "container/launcher/restore_phase.py").read_text()
    run(tmp_path, STUB_SLEEP_0="3", STUB_SLEEP_1="1")
    for node in (0, 1):
        assert env_of(tmp_path, node)["CHECKPOINT_DIR"] == container
        # Written at the start by each node, listed at its end: node 0 listed after node 1 wrote.
        assert record(tmp_path, node, what="checkpoints").split() == [f"written-by-{node}"]
    assert not list(Path(container).glob("written-by-*"))  # nothing reached this machine's /tmp


def test_where_namespaces_are_refused_each_node_gets_another_folder_and_the_report_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(container_paths, "unavailable", lambda: "unshare --mount failed: Operation not permitted")
    report = run(tmp_path, STUB_SLEEP_0="2")
    folders = {env_of(tmp_path, node)["CHECKPOINT_DIR"] for node in (0, 1)}
    assert len(folders) == 2 and container_paths.CONTAINER_CHECKPOINT_DIR not in folders
    assert report["not_rehearsed"]["checkpoint path"] == (
        f"each node's own folder, not {container_paths.CONTAINER_CHECKPOINT_DIR} (unshare --mount failed: "
        "Operation not permitted)"
    )
