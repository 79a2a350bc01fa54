"""The rehearsal plays Batch's timing from the synthesized app: the fleet's stop timeout (the launch template's
ECS_CONTAINER_STOP_TIMEOUT), its queue's capacity wait (jobStateTimeLimitActions, recorded rather than
slept) and how many nodes it can hold; and DescribeJobs as the launcher's node watch sees it (a batch-lag
fault, earlier attempts' node jobs)."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_rehearsal import STUB, definition, run
from trainctl.rehearsal import fleet_facts, records, session, summary
from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.fleet_facts import FleetFacts, go_duration, read_facts, stop_timeout_setting
from trainctl.rehearsal.hosts import Host
from trainctl.rehearsal.nodes import NodeRun
from trainctl.rehearsal.session import Options, rehearse
from trainctl.submitting.taskfile import make_task


@functools.cache
def synthesized() -> Path:
    """The app synthesized with a capacity wait and a fleet size of its own (no checks: only read here)."""
    from tests.harness import synth_with

    app = synth_with({"runnableTimeoutMinutes": "25", "gpuMaxNodes": "3"}, validate=False, nag=False)
    return Path(app.assembly.directory)


def test_go_durations_as_the_ecs_agent_reads_them():
    assert [go_duration(t) for t in ("10m", "1m30s", "45s", "1h", "500ms")] == [600, 90, 45, 3600, 0.5]
    assert [go_duration(t) for t in ("", "ten", "10", "10 m")] == [None] * 4
    # ecs.config is KEY=VALUE lines: the last one written wins.
    text = "echo ECS_CONTAINER_STOP_TIMEOUT=2m >> c\necho ECS_CONTAINER_STOP_TIMEOUT=5m >> c\n"
    assert stop_timeout_setting(text) == "5m" and stop_timeout_setting("echo ECS_LOGLEVEL=info") is None


def test_the_synthesized_fleet_gives_its_stop_timeout_capacity_wait_and_size():
    from trainctl.rehearsal.definition import from_cloud_assembly
    from training_constructs.compute.efa_launch_template import CONTAINER_STOP_TIMEOUT

    folder = synthesized()
    _, job_definition = from_cloud_assembly(folder, "gpu", "training")
    facts = read_facts(folder, "gpu", job_definition)
    assert facts.stop_grace_seconds == go_duration(CONTAINER_STOP_TIMEOUT) != 30
    assert f"ECS_CONTAINER_STOP_TIMEOUT={CONTAINER_STOP_TIMEOUT}" in facts.stop_grace_from
    assert facts.capacity_wait_seconds == 25 * 60
    assert "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY" in facts.capacity_wait_from
    assert facts.max_nodes == 3


def assembly(tmp_path: Path, *, user_data: str, actions: list[dict[str, Any]], max_vcpus: int = 96) -> Path:
    """A minimal cloud assembly: a jobs stack whose fleet queue imports a compute stack's environment."""
    export = "TrainingCompute:ExportsOutputFnGetAttCeArn"
    jobs = {
        "Resources": {
            "Queue": {"Type": "AWS::Batch::JobQueue", "Properties": {
                "ComputeEnvironmentOrder": [{"ComputeEnvironment": {"Fn::ImportValue": export}, "Order": 1}],
                "JobStateTimeLimitActions": actions}},
        },
        "Outputs": {"GpuJobQueue": {"Value": {"Fn::GetAtt": ["Queue", "JobQueueArn"]}}},
    }  # fmt: skip
    compute = {
        "Resources": {
            "Ce": {"Type": "AWS::Batch::ComputeEnvironment", "Properties": {"ComputeResources": {
                "MaxvCpus": max_vcpus, "InstanceTypes": ["g6.12xlarge"],
                "LaunchTemplate": {"LaunchTemplateId": {"Ref": "Lt"}}}}},
            "Lt": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {
                "UserData": {"Fn::Base64": {"Fn::Join": ["", ["#!/bin/bash\n", {"Ref": "AWS::Region"}, user_data]]}}}}},
        },
        "Outputs": {"CeArn": {"Value": {"Fn::GetAtt": ["Ce", "ComputeEnvironmentArn"]}, "Export": {"Name": export}}},
    }  # fmt: skip
    (tmp_path / "TrainingJobs.template.json").write_text(json.dumps(jobs))
    (tmp_path / "TrainingCompute.template.json").write_text(json.dumps(compute))
    return tmp_path


CAPACITY = {"Action": "CANCEL", "State": "RUNNABLE", "Reason": "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"}


def test_facts_follow_the_chain_from_the_queue_to_its_launch_template(tmp_path):
    folder = assembly(tmp_path, user_data="echo ECS_CONTAINER_STOP_TIMEOUT=1m30s >> /etc/ecs/ecs.config\n",
                      actions=[{**CAPACITY, "MaxTimeSeconds": 1200}])  # fmt: skip
    # g6.12xlarge has 48 vCPUs (config/catalog.py); the job asks for fewer: a node still takes the instance.
    asked = {"nodeProperties": {"nodeRangeProperties": [{"container": {"resourceRequirements": [
        {"type": "VCPU", "value": "8"}]}}]}}  # fmt: skip
    facts = read_facts(folder, "gpu", asked)
    assert (facts.stop_grace_seconds, facts.capacity_wait_seconds, facts.max_nodes) == (90, 1200, 2)


def test_without_a_setting_ecs_default_stands_and_a_queue_without_a_capacity_limit_never_cancels(tmp_path):
    other = {**CAPACITY, "Reason": "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT", "MaxTimeSeconds": 900}
    facts = read_facts(assembly(tmp_path, user_data="echo hello\n", actions=[other]), "gpu", {})
    assert facts.stop_grace_seconds == 30 and facts.stop_grace_from.startswith("ECS's default")
    assert facts.capacity_wait_seconds is None
    deployed = fleet_facts.deployed_facts()
    assert (deployed.stop_grace_seconds, deployed.capacity_wait_seconds) == (30, 600)
    assert "deployed job definition" in deployed.stop_grace_from and deployed.max_nodes is None


def fast_facts(monkeypatch: pytest.MonkeyPatch, *, grace: float = 30, wait: float | None = 600) -> None:
    facts = FleetFacts(grace, "test grace", wait, "test queue")
    monkeypatch.setattr(session, "deployed_facts", lambda: facts)


def test_a_child_that_ignores_the_stop_signal_is_killed_after_the_fleets_stop_timeout(tmp_path, monkeypatch):
    fast_facts(monkeypatch, grace=3)
    report = run(tmp_path, STUB_SLEEP_0="1", STUB_SLEEP_1="60", STUB_IGNORE_TERM_1="1")
    (attempt,) = report["jobs"][0]["attempts"]
    main, child = attempt["nodes"]
    assert child["exit_code"] == 137 and 2.5 <= child["ended_s"] - main["ended_s"] <= 6
    assert any("SIGKILL after 3 s" in e["what"] for e in attempt["events"])
    assert report["stop_grace_s"] == 3 and report["stop_grace_from"] == "test grace"


def stub_definition(tmp_path: Path, **env: str) -> dict[str, Any]:
    """The test definition with the stand-in node as its own command and environment (what a job
    resubmitted from DescribeJobs' unmerged nodeProperties runs)."""
    registered = definition()
    container = registered["nodeProperties"]["nodeRangeProperties"][0]["container"]
    container["command"] = ["sh", str(STUB)]
    container["environment"] += [{"name": k, "value": v} for k, v in {"STUB_DIR": str(tmp_path), **env}.items()]
    return registered


def test_a_capacity_cancel_records_the_queues_wait_without_sleeping_it(tmp_path, monkeypatch):
    fast_facts(monkeypatch, wait=1500)
    started = time.monotonic()
    options = Options(faults=("lose-host:0@seconds:0.5", "capacity-cancel@seconds:0.5"), nodes=2, deadline_seconds=60,
                      definition=stub_definition(tmp_path, STUB_SLEEP_0="2"), definition_source="test")  # fmt: skip
    report = rehearse(make_task({"fleet": "gpu", "launcher": False}, where=""), assembly=tmp_path, options=options)
    assert time.monotonic() - started < 60
    first, second = report["jobs"]
    assert first["runnable_wait_s"] == 1500 and second["runnable_wait_s"] is None
    assert report["runnable_wait_s"] == 1500 and report["batch_seconds"] == round(report["seconds"] + 1500, 1)
    lines = summary.lines(report)
    assert any("waited RUNNABLE 1500 s before the queue cancelled it (test queue); not slept here" in line
               for line in lines)  # fmt: skip
    assert lines[-1].endswith(f"(on Batch {report['batch_seconds']} s with the RUNNABLE wait): as expected")


# ----------------------------------------------------------------------------------------------- DescribeJobs
def node(tmp_path: Path, index: int, *, started: float | None, ended: float | None, code: int | None) -> NodeRun:
    host = Host(tmp_path / f"h{index}", index, f"127.0.0.{index + 2}", fleet_hosts_devices())
    run = NodeRun(index=index, host=host, folder=tmp_path, log_path=tmp_path / "log", is_main=index == 0)
    run.process = object() if started is not None else None  # type: ignore[assignment]
    run.started, run.ended, run.exit_code = started, ended, code
    run.status_reason = "Essential container in task exited" if ended is not None else ""
    return run


def fleet_hosts_devices() -> Any:
    from trainctl.rehearsal.hosts import Devices

    return Devices()


def job_of(attempts: list[records.Attempt]) -> records.JobRun:
    spec = JobSpec(fleet="gpu", definition="d", nodes=2, main_node=0, command=("x",), environment={}, attempts=3,
                   retry_rules=(), timeout_seconds=None, name="n")  # fmt: skip
    return records.JobRun(job_id="job", spec=spec, placement=0, attempts=attempts)


def test_with_a_lag_a_nodes_end_shows_only_that_long_after_it_happened(tmp_path):
    now = time.monotonic()
    child = node(tmp_path, 1, started=now - 100, ended=now - 10, code=137)
    job = job_of([])
    lagged = records.node_description(job, child, now=now, lag=(now - 50, 45.0))
    assert lagged["status"] == "RUNNING" and "startedAt" in lagged
    assert "stoppedAt" not in lagged and "statusReason" not in lagged
    # Its task ENI's address (the listener takes its lines from it), and no exit code or reason yet.
    assert lagged["container"] == {"networkInterfaces": [{"privateIpv4Address": records.LOOPBACK_SOURCE}]}
    shown = records.node_description(job, child, now=now + 36, lag=(now - 50, 45.0))
    assert (shown["status"], shown["container"]["exitCode"]) == ("FAILED", 137) and "stoppedAt" in shown
    # A node that ended before the lag began shows as it is; so does every node without a lag.
    assert records.node_description(job, child, now=now, lag=(now - 5, 45.0))["status"] == "FAILED"
    assert records.node_description(job, child, now=now)["status"] == "FAILED"


def test_until_a_node_starts_in_this_attempt_describe_shows_its_previous_attempts_end(tmp_path):
    now = time.monotonic()
    before = records.Attempt(number=1, started=now - 60, nodes=[
        node(tmp_path, 0, started=now - 60, ended=now - 30, code=75),
        node(tmp_path, 1, started=now - 59, ended=now - 31, code=137)])  # fmt: skip
    waiting = node(tmp_path, 1, started=None, ended=None, code=None)
    current = records.Attempt(number=2, started=now - 5, nodes=[node(tmp_path, 0, started=now - 5, ended=None,
                                                                       code=None), waiting])  # fmt: skip
    job = job_of([before])
    shown = records.node_job(job, current, 1, now=now)
    assert (shown["jobId"], shown["status"], shown["container"]["exitCode"]) == ("job#1", "FAILED", 137)
    assert shown["startedAt"] == records.epoch_milliseconds(now - 59) < records.epoch_milliseconds(now - 5)
    assert shown["stoppedAt"] == records.epoch_milliseconds(now - 31)
    waiting.process, waiting.started = object(), now  # type: ignore[assignment]
    assert records.node_job(job, current, 1, now=now)["status"] == "RUNNING"
    # The first attempt's nodes have nothing earlier: PENDING until they start.
    assert records.node_job(job_of([]), current, 1, now=now)["status"] == "RUNNING"


def test_the_node_watch_sees_a_childs_end_only_after_the_lag_while_the_job_does_not_wait(tmp_path):
    # The stand-in main node asks the local endpoint about its child twice, as the launcher's watch would.
    script = tmp_path / "ask.py"
    script.write_text(
        "import boto3, json, os, time\n"
        "job = os.environ['AWS_BATCH_JOB_ID'].split('#')[0]\n"
        "if os.environ['AWS_BATCH_JOB_NODE_INDEX'] == '1': time.sleep(30)\n"
        "seen = []\n"
        "for pause in (1.5, 3.5):\n"
        "    time.sleep(pause)\n"
        "    seen.append(boto3.client('batch').describe_jobs(jobs=[job + '#1'])['jobs'][0]['status'])\n"
        "open(os.environ['STUB_DIR'] + '/seen.json', 'w').write(json.dumps(seen))\n"
    )
    records_dir = tmp_path / "records"
    records_dir.mkdir()
    task = make_task({"fleet": "gpu", "command": [sys.executable, str(script)], "launcher": False,
                      "env": {"STUB_DIR": str(records_dir)}}, where="")  # fmt: skip
    options = Options(nodes=2, deadline_seconds=40, definition=definition(), definition_source="test",
                      faults=("batch-lag=3", "kill-child@seconds:0.5"))  # fmt: skip
    report = rehearse(task, assembly=tmp_path, options=options)
    assert json.loads((records_dir / "seen.json").read_text()) == ["RUNNING", "FAILED"]
    child = report["jobs"][0]["attempts"][0]["nodes"][1]
    # The rehearsal's own record of the child's end does not lag.
    assert child["exit_code"] == 137 and child["ended_s"] < 3


# ----------------------------------------------------------------------------------------------- the fallback
def test_the_fallback_is_fed_describe_jobs_unmerged_unless_asked():
    from types import SimpleNamespace

    from tests.harness import ROOT
    from trainctl.rehearsal import app_code
    from trainctl.rehearsal.definition import NodeSettings

    spec = JobSpec(fleet="gpu", definition="d", nodes=3, main_node=0, command=("task",), environment={"A": "1",
                   "B": "2"}, attempts=3, retry_rules=(), timeout_seconds=None, name="n",
                   registered=NodeSettings(2, ("registered",), {"A": "1"}),
                   overrides=NodeSettings(3, ("task",), {"B": "2"}))  # fmt: skip
    job = SimpleNamespace(job_id="job-1", spec=spec, placement=0)
    for merged, (nodes, command, names) in ((False, (2, ["registered"], {"A"})), (True, (3, ["task"], {"A", "B"}))):
        request = app_code.resubmission(ROOT, job, merged=merged)
        (node_range,) = request["nodeOverrides"]["nodePropertyOverrides"]
        sent = {e["name"] for e in node_range["containerOverrides"]["environment"]}
        assert request["nodeOverrides"]["numNodes"] == nodes and node_range["containerOverrides"]["command"] == command
        assert sent == names | {"CHECKPOINT_LINEAGE"}
        # The successor is the definition it names, as registered, with the request's overrides.
        successor = app_code.spec_from_request(spec, request)
        assert (successor.nodes, list(successor.command)) == (nodes, command)
        assert successor.environment["CHECKPOINT_LINEAGE"] == "job-1"


def test_a_rehearsed_job_is_registered_as_trainctl_registers_it():
    from trainctl.rehearsal.definition import NodeSettings, as_trainctl_registers

    registered = as_trainctl_registers(definition(), NodeSettings(3, ("sh", "x"), {"B": "2"}))
    assert (registered.nodes, registered.command) == (3, ("sh", "x"))
    assert registered.environment == {"EFA_DEVICES": "1", "B": "2"}
    assert as_trainctl_registers(definition(), NodeSettings()) == NodeSettings(2, ("false",), {"EFA_DEVICES": "1"})


@pytest.mark.parametrize("merged", [False, True])
def test_a_resubmitted_job_runs_the_tasks_command_whichever_way_describe_jobs_shows_it(tmp_path, monkeypatch, merged):
    fast_facts(monkeypatch)
    options = Options(faults=("lose-host:0@seconds:0.5", "capacity-cancel@seconds:0.5"), nodes=2, deadline_seconds=60,
                      definition=definition(), definition_source="test", describe_merged=merged)  # fmt: skip
    task = make_task({"fleet": "gpu", "command": ["sh", str(STUB)], "launcher": False,
                      "env": {"STUB_DIR": str(tmp_path), "STUB_SLEEP_0": "2"}}, where="")  # fmt: skip
    report = rehearse(task, assembly=tmp_path, options=options)
    first, second = report["jobs"]
    # The definition's own command is `false`: the successor ran the task's stand-in, with its environment.
    assert second["resubmitted_from"] == first["job_id"] and report["ending"] == "SUCCEEDED"
    assert [n["exit_code"] for n in second["attempts"][0]["nodes"]] == [0, 0]
    assert (tmp_path / "node-1-attempt-1.env").read_text().count(f"AWS_BATCH_JOB_ID={second['job_id']}#1") == 1
