"""Observability in the templates: job metrics from Batch events, node metrics in user data, Container
Insights, one dashboard naming every fleet, alarms that reach the job-alert topic."""

from __future__ import annotations

import email
import json

import pytest

from config.metrics import FLEET_DIMENSION, GPU_UTILIZATION, JOB_STATE_METRICS, NAMESPACE, XID_ERRORS
from tests.harness import THREE_FLEETS, node_files, resources, synth
from tests.test_compute import render
from training_constructs.common.node_files import compact_python
from training_constructs.observability.node_metrics import COLLECTOR

JOBS, COMPUTE, MONITORING = "TrainingJobs", "TrainingCompute", "TrainingMonitoring"
GPU_FLEETS = {"rl", "llm"}  # three-fleets: g6e and p5e; "trn" is Trainium


def flatten(value) -> str:
    """A CloudFormation string (maybe Fn::Join), with every token shown as <token>."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(flatten(part) for part in value["Fn::Join"][1])
    return "<token>"


def job_event_rules(template, resumed: bool = False):
    return {
        k: r["Properties"]
        for k, r in resources(template, "AWS::Events::Rule").items()
        if "JobMetrics" in k and ("ResumedRule" in k) is resumed
    }


def transform(target, event) -> dict:
    """What EventBridge hands the log group: the template with each <variable> replaced by the value at
    its path; a variable outside quotes becomes JSON (EventBridge user guide, input transformation)."""

    def value(path):
        node = event
        for key in path.removeprefix("$.").split("."):
            node = node[key]
        return node

    transformer = target["InputTransformer"]
    text = transformer["InputTemplate"]
    for name, path in transformer["InputPathsMap"].items():
        text = text.replace(f":<{name}>", ":" + json.dumps(value(path)))
        text = text.replace(f"<{name}>", str(value(path)))
    return json.loads(text)


# A Batch job state change event, shaped as in the Batch user guide's "Job state change events".
EVENT = {
    "version": "0",
    "id": "c8f9c4b5-76e5-d76a-f980-7011e206042b",
    "detail-type": "Batch Job State Change",
    "source": "aws.batch",
    "time": "2026-11-23T10:00:00Z",
    "detail": {
        "jobName": "llama-7b-run_3",
        "jobId": "4c7599ae-0a82-49aa-ba5a-4727fcce14a8",
        "jobQueue": "arn:aws:batch:us-west-2:123456789012:job-queue/queue",
        "status": "RUNNING",
        "createdAt": 1795432800000,
        "attempts": [],
    },
}


def test_every_fleet_has_a_rule_on_its_own_queue_into_the_job_events_log_group():
    template = synth("three-fleets").templates[JOBS]
    rules = job_event_rules(template)
    queues = set(resources(template, "AWS::Batch::JobQueue"))
    (group_id,) = [k for k in resources(template, "AWS::Logs::LogGroup") if k.startswith("JobMetrics")]
    seen_queues, seen_fleets = set(), set()
    for rule in rules.values():
        pattern = rule["EventPattern"]
        assert pattern["source"] == ["aws.batch"] and pattern["detail-type"] == ["Batch Job State Change"]
        assert pattern["detail"]["status"] == list(JOB_STATE_METRICS)
        # Jobs, not the nodes of a multi-node job (<job id>#<node index>).
        assert pattern["detail"]["jobId"] == [{"anything-but": {"wildcard": "*#*"}}]
        # A fleet's own queue, then its fallback placements' (llm has three).
        own, *fallback = [q["Fn::GetAtt"][0] for q in pattern["detail"]["jobQueue"]]
        assert all(q.startswith(own[: own.index("Queue")] + "Fallback") for q in fallback)
        seen_queues |= {own, *fallback}
        (target,) = rule["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [group_id, "Arn"]}
        line = json.loads(transform(target, EVENT)["message"])
        seen_fleets.add(line["fleet"])
        assert line["status"] == "RUNNING" and line["createdAt"] == EVENT["detail"]["createdAt"]
        assert line["jobId"] == EVENT["detail"]["jobId"] and line["jobName"] == EVENT["detail"]["jobName"]
    assert seen_queues == queues and seen_fleets == set(THREE_FLEETS)
    # EventBridge may write to the group through its resource policy; no Lambda-backed custom resource.
    (policy,) = resources(template, "AWS::Logs::ResourcePolicy").values()
    assert "events.amazonaws.com" in json.dumps(policy) and group_id in json.dumps(policy)
    # The functions in this stack: the boot-check circuit breaker's (tests/test_fleet_health.py), the
    # capacity fallback's resubmitter (llm's placements), the Capacity Block expiry's (llm's block) and the
    # resumed-job alert's; none for the metrics.
    functions = resources(template, "AWS::Lambda::Function")
    owners = ("BootCircuitBreaker", "CapacityFallback", "CapacityBlockExpiry", "ResumedJobAlerts")
    assert [k for k in functions if not k.startswith(owners)] == []
    assert not [k for k, r in template["Resources"].items() if r["Type"].startswith("Custom::")]


def test_metric_filters_count_each_state_per_fleet():
    template = synth("three-fleets").templates[JOBS]
    # The capacity fallback's own filters are tested in tests/test_job_fallback.py.
    filters = [
        f["Properties"]
        for k, f in resources(template, "AWS::Logs::MetricFilter").items()
        if not k.startswith("CapacityFallback")
    ]
    by_metric = {}
    for metric_filter in filters:
        (transformation,) = metric_filter["MetricTransformations"]
        assert transformation["MetricNamespace"] == NAMESPACE and transformation["MetricValue"] == "1"
        assert transformation["Dimensions"] == [{"Key": FLEET_DIMENSION, "Value": "$.fleet"}]
        by_metric[transformation["MetricName"]] = metric_filter["FilterPattern"]
    expected = {name: f'{{ $.status = "{status}" }}' for status, name in JOB_STATE_METRICS.items()}
    assert by_metric == {**expected, "JobsResumed": '{ $.status = "RESUMED" }'}


def user_data(template, fleet_id) -> str:
    """The one shell script of the MIME document EC2 receives."""
    (lt,) = [
        r["Properties"]["LaunchTemplateData"]
        for k, r in resources(template, "AWS::EC2::LaunchTemplate").items()
        if k.startswith(f"{fleet_id}LaunchTemplate")
    ]
    document = render(lt["UserData"]["Fn::Base64"])
    message = email.message_from_string(document)
    (script,) = [p.get_payload(decode=True).decode() for p in message.walk() if not p.is_multipart()]
    return script


def agent_json(script: str) -> dict:
    """The agent configuration the user data writes, packed with the collector (common/node_files.py)."""
    return json.loads(node_files(script)["/opt/training-node-metrics/cloudwatch-agent.json"])


@pytest.mark.parametrize("fleet", sorted(THREE_FLEETS))
def test_user_data_sets_up_the_agent_and_collector_for_the_fleet(fleet):
    script = user_data(synth("three-fleets").templates[COMPUTE], fleet.capitalize())
    config = agent_json(script)["metrics"]
    assert config["namespace"] == NAMESPACE
    gpu = fleet in GPU_FLEETS
    # nvidia_gpu on GPU fleets and nowhere else; the collector on every (EFA) fleet.
    assert ("nvidia_gpu" in config["metrics_collected"]) is gpu
    if gpu:
        assert config["metrics_collected"]["nvidia_gpu"]["append_dimensions"] == {FLEET_DIMENSION: fleet}
    (exec_start,) = [line for line in script.splitlines() if line.startswith("ExecStart=/usr/bin/python3")]
    assert f"--fleet {fleet}" in exec_start and ("--gpu" in exec_start) is gpu
    assert "systemctl enable --now training-node-metrics.service" in script
    # The node runs the collector in the repository, compacted and packed to fit EC2's 16 KB.
    collector = node_files(script)["/opt/training-node-metrics/collector.py"]
    assert collector.decode() == compact_python(COLLECTOR.read_text())


def test_instance_roles_may_publish_metrics_only_in_our_namespace():
    template = synth("three-fleets").templates[COMPUTE]
    statements = [
        s
        for p in resources(template, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    # Beside each fleet's boot-check log writes (tests/test_compute.py), one metrics statement per fleet.
    statements = [s for s in statements if "cloudwatch:" in json.dumps(s["Action"])]
    assert len(statements) == len(THREE_FLEETS)
    for statement in statements:
        assert statement["Action"] == "cloudwatch:PutMetricData"
        assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": NAMESPACE}}


@pytest.mark.parametrize("variant", ["default", "three-fleets"])
def test_container_insights_on_every_compute_environment(variant):
    environments = resources(synth(variant).templates[COMPUTE], "AWS::Batch::ComputeEnvironment").values()
    assert environments
    for environment in environments:
        assert environment["Properties"]["EcsSettings"] == {"ContainerInsights": "enabled"}


def dashboard(variant):
    template = synth(variant).templates[MONITORING]
    (board,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    return template, json.loads(flatten(board["Properties"]["DashboardBody"]).replace("<token>", "TOKEN"))


def titles(body) -> list[str]:
    return [w["properties"].get("title") or w["properties"].get("markdown", "") for w in body["widgets"]]


def test_the_top_row_shows_node_faults_against_the_circuit_breaker():
    from training_constructs.health.boot_breaker import NODE_FAULTS_TO_TRIP

    _, body = dashboard("default")
    (widget,) = [w for w in body["widgets"] if "node faults" in w["properties"].get("title", "")]
    (metric,) = widget["properties"]["metrics"]
    # Exactly the [Fleet, Fault] series with Fault=node, summed per hour like the breaker's alarm.
    assert metric[0]["expression"] == (
        "SEARCH('{TrainingPlatform,Fault,Fleet} MetricName=\"BootCheckFailed\" Fault=\"node\"', 'Sum', 3600)"
    )
    assert widget["properties"]["annotations"]["horizontal"][0]["value"] == NODE_FAULTS_TO_TRIP == 3
    (failures,) = [w for w in body["widgets"] if w["properties"].get("title") == "Boot-check failures, every fleet"]
    # The [Fleet] series only: each node's line counts once, not once per dimension set.
    assert failures["properties"]["metrics"][0][0]["expression"].startswith("SEARCH('{TrainingPlatform,Fleet} ")


def test_one_dashboard_with_a_row_of_widgets_for_every_fleet():
    template, body = dashboard("three-fleets")
    names = titles(body)
    for fleet in THREE_FLEETS:
        mine = [t for t in names if t.startswith(f"{fleet}:")]
        assert len(mine) >= 6, (fleet, mine)
        assert any("jobs entering each state" in t for t in mine)
        assert any("time from submission to start" in t for t in mine)
        assert any("nodes running" in t for t in mine)
        assert any("EFA retransmits" in t for t in mine)
        assert any("benchmark verdict" in t for t in mine)
    text = json.dumps(body)
    for fleet in GPU_FLEETS:
        assert f'MetricName=\\"{GPU_UTILIZATION}\\" Fleet=\\"{fleet}\\"' in text
    assert 'Fleet=\\"trn\\"' in text and f'MetricName=\\"{GPU_UTILIZATION}\\" Fleet=\\"trn\\"' not in text
    assert any("Boot-check failures" in t for t in names) and any("Job alerts" in t for t in names)
    # Nodes against the fleet's maxNodes.
    (nodes,) = [w for w in body["widgets"] if w["properties"].get("title") == "rl: nodes running"]
    assert nodes["properties"]["annotations"]["horizontal"][0]["value"] == THREE_FLEETS["rl"]["maxNodes"]
    url = flatten(template["Outputs"]["DashboardUrl"]["Value"])
    assert url.startswith("https://") and "#dashboards/dashboard/" in url


def alarms(variant):
    template = synth(variant).templates[MONITORING]
    return {k: a["Properties"] for k, a in resources(template, "AWS::CloudWatch::Alarm").items()}


def test_alarms_of_every_fleet_go_to_the_job_alert_topic_and_say_what_to_do():
    found = alarms("three-fleets")
    jobs_topic = list(resources(synth("three-fleets").templates[JOBS], "AWS::SNS::Topic"))
    assert len(jobs_topic) == 1
    for fleet in THREE_FLEETS:
        kinds = {
            k.split("Alarm")[0].removeprefix(f"Dashboard{fleet.capitalize()}")
            for k in found
            if k.startswith(f"Dashboard{fleet.capitalize()}")
        }
        expected = {"Runnable", "EfaRetransmit", "TakenOut"} | ({"Xid"} if fleet in GPU_FLEETS else set())
        # A fleet with fallback placements also alarms when every placement is short.
        expected |= {"Capacity"} if "fallback" in THREE_FLEETS[fleet] else set()
        assert kinds == expected, fleet
        # Boot-check failures alarm once per fleet, from the jobs stack (fleet_health.py), not twice.
        jobs_alarms = resources(synth("three-fleets").templates[JOBS], "AWS::CloudWatch::Alarm")
        assert len([k for k in jobs_alarms if k.startswith(fleet.capitalize()) and "BootCheck" in k]) == 1
    for alarm in found.values():
        (action,) = alarm["AlarmActions"]
        assert "Fn::ImportValue" in action and "JobAlertsTopic" in json.dumps(action)
        assert alarm["TreatMissingData"] == "notBreaching"
        assert len(alarm["AlarmDescription"]) > 80


@pytest.mark.parametrize(("variant", "half_seconds", "fleets"), [("default", 1800, 2), ("three-fleets", 900, 3)])
def test_runnable_alarm_fires_at_half_the_queue_limit(variant, half_seconds, fleets):
    found = [a for k, a in alarms(variant).items() if "RunnableAlarm" in k]
    assert len(found) == fleets
    for runnable in found:
        metrics = {m["Id"]: m for m in runnable["Metrics"]}
        names = {metrics[i]["MetricStat"]["Metric"]["MetricName"] for i in ("runnable", "started")}
        assert names == {"JobsRunnable", "JobsStarting"}
        assert all(metrics[i]["MetricStat"]["Period"] == half_seconds for i in ("runnable", "started"))


def test_nodes_taking_themselves_out_alarm_at_the_breakers_count_per_hour():
    for fleet in THREE_FLEETS:
        (alarm,) = [
            a for k, a in alarms("three-fleets").items() if k.startswith(f"Dashboard{fleet.capitalize()}TakenOut")
        ]
        assert alarm["MetricName"] == "NodesTakenOut" and alarm["Statistic"] == "Sum" and alarm["Period"] == 3600
        assert alarm["Dimensions"] == [{"Name": "Fleet", "Value": fleet}]
        assert alarm["Threshold"] == 3 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert "--state DISABLED" in alarm["AlarmDescription"]
        # Job-reported: it only alerts; the breaker counts the host-confirmed take-outs instead.
        assert "counts only the take-outs the host confirmed (TakeOutConfirmed" in alarm["AlarmDescription"]


def test_fault_alarms_sum_the_fleets_nodes_with_metrics_insights():
    found = alarms("three-fleets")
    (xid,) = [a for k, a in found.items() if k.startswith("DashboardLlmXidAlarm")]
    (query,) = xid["Metrics"]
    expected = f"SELECT SUM({XID_ERRORS}) FROM \"{NAMESPACE}\" WHERE {FLEET_DIMENSION} = 'llm'"  # noqa: S608
    assert query["Expression"] == expected
    assert xid["Threshold"] == 1 and xid["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_nothing_runs_on_a_schedule_so_nothing_emits_at_zero_nodes():
    # Job metrics come only from job state changes, node metrics only from nodes: no scheduled rule,
    # and no function but one that only an alarm entering ALARM runs (the boot-check circuit breaker,
    # which needs failing nodes) or a job resumed after an attempt that ran (the resumed-job alert), in
    # the stacks that carry the metrics that could emit (or bill) while every fleet is at zero.
    for name in (JOBS, COMPUTE, MONITORING):
        template = synth("default").templates[name]
        rules = resources(template, "AWS::Events::Rule").values()
        for rule in rules:
            assert "ScheduleExpression" not in rule["Properties"], name
        for function in resources(template, "AWS::Lambda::Function"):
            callers = [
                r["Properties"]
                for r in rules
                if {"Fn::GetAtt": [function, "Arn"]} in [t["Arn"] for t in r["Properties"]["Targets"]]
            ]
            assert callers, (name, function)
            for rule in callers:
                pattern = rule["EventPattern"]
                if pattern["detail-type"] == ["Batch Job State Change"]:
                    # An attempt that started: the job had nodes.
                    assert pattern["detail"]["attempts"] == {"startedAt": [{"exists": True}]}, (name, function)
                    continue
                assert pattern["detail-type"] == ["CloudWatch Alarm State Change"], (name, function)
                assert pattern["detail"] == {"state": {"value": ["ALARM"]}}


# The same job, RUNNABLE again after its first attempt ended with the main node's exit 75.
RESUMED_EVENT = {
    **EVENT,
    "detail": {
        **EVENT["detail"],
        "status": "RUNNABLE",
        "attempts": [
            {
                "container": {"exitCode": 75, "logStreamName": "training/default/abc"},
                "startedAt": 1795432900000,
                "stoppedAt": 1795433000000,
                "statusReason": "Essential container in task exited",
            }
        ],
    },
}


def matches(pattern, event) -> bool:
    """The subset of EventBridge matching these patterns use: value lists, exists, anything-but wildcard,
    and fields inside an array of objects matching on any element."""

    def match(p, value) -> bool:
        if isinstance(p, dict):
            items = value if isinstance(value, list) else [value]
            return any(isinstance(v, dict) and all(k in v and match(p[k], v[k]) for k in p) for v in items)
        for option in p:
            if isinstance(option, dict) and "exists" in option:
                return option["exists"]
            if isinstance(option, dict) and "anything-but" in option:
                prefix = option["anything-but"]["wildcard"].split("*")[1]
                return prefix not in value
            if option == value or (isinstance(value, list) and option in value):
                return True
        return False

    return all(k in event and match(v, event[k]) for k, v in pattern.items())


def test_every_fleet_counts_its_resumed_jobs_and_only_retries():
    template = synth("three-fleets").templates[JOBS]
    rules = job_event_rules(template, resumed=True)
    assert len(rules) == len(THREE_FLEETS)
    fleets = set()
    for rule in rules.values():
        pattern = rule["EventPattern"]
        queue = pattern["detail"]["jobQueue"]
        concrete = {**pattern, "detail": {**pattern["detail"], "jobQueue": [EVENT["detail"]["jobQueue"]]}}
        assert matches(concrete, RESUMED_EVENT)
        # The first placement (no attempt yet), another state, or one node of the job: not a resume.
        assert not matches(concrete, {**EVENT, "detail": {**EVENT["detail"], "status": "RUNNABLE"}})
        assert not matches(concrete, {**RESUMED_EVENT, "detail": {**RESUMED_EVENT["detail"], "status": "RUNNING"}})
        node = {**RESUMED_EVENT, "detail": {**RESUMED_EVENT["detail"], "jobId": "4c75#1"}}
        assert not matches(concrete, node)
        # The fleet's own queue, then its fallback placements' (a job resumed on any of them counts).
        own, *fallback = [q["Fn::GetAtt"][0] for q in queue]
        assert all(q.startswith(own[: own.index("Queue")] + "Fallback") for q in fallback)
        (target,) = rule["Targets"]
        line = json.loads(transform(target, RESUMED_EVENT)["message"])
        assert line["status"] == "RESUMED"
        fleets.add(line["fleet"])
    assert fleets == set(THREE_FLEETS)


def test_a_resumed_job_alerts_through_its_own_rule_and_function_naming_the_latest_attempt():
    """An input transformer can quote only a fixed attempt (it quoted the first); the function picks the
    latest (tests/test_resumed_alert.py runs it)."""
    template = synth("three-fleets").templates[JOBS]
    rules = resources(template, "AWS::Events::Rule")
    (rule,) = [r["Properties"] for k, r in rules.items() if k.startswith("ResumedJobAlerts")]
    (failed,) = [r["Properties"] for k, r in rules.items() if k.startswith("JobAlerts")]
    topic = failed["Targets"][0]["Arn"]  # the job-alert topic
    (target,) = rule["Targets"]
    assert "InputTransformer" not in target and "Input" not in target  # the whole event, all attempts
    (function_id,) = [k for k in resources(template, "AWS::Lambda::Function") if k.startswith("ResumedJobAlerts")]
    assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}
    function = template["Resources"][function_id]["Properties"]
    assert function["Handler"] == "announce.handler" and function["Environment"]["Variables"] == {
        "ALERT_TOPIC_ARN": topic
    }
    # Its role publishes to that topic only, and writes its own log group only.
    role = function["Role"]["Fn::GetAtt"][0]
    (policy,) = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for p in resources(template, "AWS::IAM::Policy").values()
        if {"Ref": role} in p["Properties"]["Roles"]
    ]
    publish = [s for s in policy if s["Action"] == "sns:Publish"]
    assert [s["Resource"] for s in publish] == [topic]
    assert all("sns:" not in json.dumps(s["Action"]) for s in policy if s not in publish)
    # Every placement's queue, exactly the queues whose failures alert (llm has three fallback placements).
    assert rule["EventPattern"]["detail"]["jobQueue"] == failed["EventPattern"]["detail"]["jobQueue"]
    assert len(rule["EventPattern"]["detail"]["jobQueue"]) == len(THREE_FLEETS) + 3
    # Its failures page, like every small function's.
    alarms = resources(template, "AWS::CloudWatch::Alarm").values()
    errors = [
        a
        for a in alarms
        if {"Name": "FunctionName", "Value": {"Ref": function_id}} in a["Properties"].get("Dimensions", [])
    ]
    assert len(errors) == 1 and errors[0]["Properties"]["AlarmActions"] == [topic]


def test_the_fleet_row_graphs_nodes_taken_out_and_jobs_resumed():
    template = synth("three-fleets").templates[MONITORING]
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = flatten(dashboard["Properties"]["DashboardBody"])
    for fleet in THREE_FLEETS:
        assert body.count(f'"NodesTakenOut","Fleet","{fleet}"') == 1
        assert body.count(f'"TakeOutConfirmed","Fleet","{fleet}"') == 1
        assert body.count(f'"JobsResumed","Fleet","{fleet}"') == 1
    # What the jobs printed is labelled as theirs; the breaker counts the host's series.
    assert body.count('"label":"nodes taken out (job-reported)"') == len(THREE_FLEETS)
    assert body.count('"label":"take-outs the host confirmed"') == len(THREE_FLEETS)


def test_the_capacity_alarm_fires_when_every_placement_of_a_fleet_was_short():
    """llm has four placements: the alarm takes the fewest capacity cancels of any of them over one pass
    of the chain (10 minutes on each of three placements, then the 30-minute RUNNABLE limit)."""
    (alarm,) = [a for k, a in alarms("three-fleets").items() if k.startswith("DashboardLlmCapacityAlarm")]
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert expression["Expression"] == "MIN([FILL(p0, 0), FILL(p1, 0), FILL(p2, 0), FILL(p3, 0)])"
    stats = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert sorted(stats) == ["p0", "p1", "p2", "p3"]
    for number, stat in enumerate(stats[f"p{n}"] for n in range(4)):
        assert stat["Metric"]["MetricName"] == "CapacityCancels" and stat["Stat"] == "Sum"
        assert {d["Name"]: d["Value"] for d in stat["Metric"]["Dimensions"]} == {
            "Fleet": "llm",
            "Placement": str(number),
        }
        assert stat["Period"] == (3 * 10 + 30) * 60
    assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching" and len(alarm["AlarmActions"]) == 1
    assert not [k for k in alarms("three-fleets") if "CapacityAlarm" in k and not k.startswith("DashboardLlm")]
