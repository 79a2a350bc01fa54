"""Fleet health on the job-alert topic: the boot-check alarm of every fleet, and the optional
healthCheckSchedule (a scheduled fleet check per fleet with its alarms), absent when unset."""

from __future__ import annotations

import json
import re

import pytest

from config import metrics
from config.context import ConfigError, read_settings
from config.settings import fleet_construct_id as construct_id
from tests.harness import THREE_FLEETS, VARIANTS, resources, synth
from training_constructs.health.boot_breaker import NODE_FAULTS_TO_TRIP, node_faults_to_trip
from training_constructs.health.boot_breaker_function import trip
from training_constructs.jobs.training_jobs import BENCHMARK_TIMEOUT_SECONDS

STACK = "TrainingJobs"


def alarms(template, metric):
    return [
        a["Properties"]
        for a in resources(template, "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == metric
    ]


def fleet_of(alarm):
    (dimension,) = alarm["Dimensions"]
    assert dimension["Name"] == metrics.FLEET_DIMENSION and alarm["Namespace"] == metrics.NAMESPACE
    return dimension["Value"]


def topic_ref(template):
    (topic,) = resources(template, "AWS::SNS::Topic")
    return {"Ref": topic}


def schedule_rules(template):
    return {
        k: r["Properties"]
        for k, r in resources(template, "AWS::Events::Rule").items()
        if "ScheduleExpression" in r["Properties"]
    }


def test_without_a_schedule_nothing_is_scheduled_and_no_verdict_alarm_exists():
    template = synth("default").templates[STACK]
    assert schedule_rules(template) == {}
    assert alarms(template, metrics.BENCHMARK_VERDICT) == []


@pytest.mark.parametrize("variant", ["default", "three-fleets"])
def test_every_fleet_alarms_when_a_node_fails_its_boot_check(variant):
    template = synth(variant).templates[STACK]
    # The [Fleet] series (any failure); the breaker's [Fleet, Fault] alarms are tested below.
    found = [a for a in alarms(template, metrics.BOOT_CHECK_FAILED) if len(a["Dimensions"]) == 1]
    expected = set(THREE_FLEETS) if variant == "three-fleets" else {"gpu", "trainium"}
    assert {fleet_of(a) for a in found} == expected and len(found) == len(expected)
    for alarm in found:
        assert alarm["AlarmActions"] == [topic_ref(template)]
        assert alarm["Statistic"] == "Maximum" and alarm["Threshold"] == 1
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"  # quiet while the fleet is at zero


def test_the_schedule_submits_each_fleets_benchmark_to_its_own_queue():
    template = synth("three-fleets").templates[STACK]
    rules = schedule_rules(template)
    assert len(rules) == len(THREE_FLEETS)
    for name in THREE_FLEETS:
        (rule,) = [r for k, r in rules.items() if k.startswith(f"{construct_id(name)}Health")]
        assert rule["ScheduleExpression"] == VARIANTS["three-fleets"]["healthCheckSchedule"]
        (target,) = rule["Targets"]
        assert target["Arn"] == {
            "Fn::GetAtt": [
                next(
                    k for k in resources(template, "AWS::Batch::JobQueue") if k.startswith(f"{construct_id(name)}Queue")
                ),
                "JobQueueArn",
            ]
        }
        (benchmark,) = [
            k
            for k in resources(template, "AWS::Batch::JobDefinition")
            if k.startswith(f"{construct_id(name)}BenchmarkJob")
        ]
        assert target["BatchParameters"]["JobDefinition"] == {"Ref": benchmark}
        assert target["BatchParameters"]["JobName"] == f"{name}-fleet-check"
        # EventBridge needs a role that may submit exactly that job.
        role = target["RoleArn"]["Fn::GetAtt"][0]
        (policy,) = [
            p for p in resources(template, "AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
        ]
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Action"] == "batch:SubmitJob"
        assert {"Ref": benchmark} in statement["Resource"]


def test_a_failing_verdict_and_a_missing_one_alarm_per_fleet():
    template = synth("three-fleets").templates[STACK]
    verdicts = alarms(template, metrics.BENCHMARK_VERDICT)
    assert sorted(fleet_of(a) for a in verdicts) == sorted([*THREE_FLEETS, *THREE_FLEETS])
    settings = read_settings(VARIANTS["three-fleets"])
    window = 86400 + settings.jobs.runnable_timeout_minutes * 60 + BENCHMARK_TIMEOUT_SECONDS
    for alarm in verdicts:
        assert alarm["AlarmActions"] == [topic_ref(template)] and alarm["Period"] == 3600
        if alarm["Statistic"] == "Minimum":
            # Failing is 0, degraded 0.5, healthy 1 (config/metrics.py).
            assert alarm["ComparisonOperator"] == "LessThanThreshold" and 0 < alarm["Threshold"] <= 0.5
            assert alarm["TreatMissingData"] == "notBreaching"
        else:
            assert alarm["Statistic"] == "SampleCount" and alarm["Threshold"] == 1
            assert alarm["TreatMissingData"] == "breaching"
            # A day between runs plus one run's wait and timeout: 25 hours without a verdict.
            assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == -(-window // 3600) == 25
            assert alarm["EvaluationPeriods"] * alarm["Period"] <= 7 * 86400


def test_alarms_may_use_the_encrypted_alert_topic():
    template = synth("default").templates[STACK]
    (key,) = resources(template, "AWS::KMS::Key").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    services = [s for s in statements if "Service" in s.get("Principal", {})]
    granted = [s for s in services if "cloudwatch.amazonaws.com" in json.dumps(s["Principal"]["Service"])]
    (statement,) = granted
    assert set(statement["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}


@pytest.mark.parametrize(
    ("expression", "interval"),
    [
        ("rate(1 hour)", 3600),
        ("rate(12 hours)", 43200),
        ("rate(6 days)", 6 * 86400),
        ("rate(90 minutes)", 5400),
        ("cron(0 3 * * ? *)", 86400),
        ("cron(0 * ? * * *)", 3600),
        ("cron(45 3,15 * * ? *)", 43200),
        ("cron(15 0/6 * * ? *)", 21600),
        ("cron(0 1,2,20 * * ? *)", 18 * 3600),
        ("cron(0 8-17 ? * * *)", 15 * 3600),
    ],
)
def test_schedule_expressions_that_are_accepted(expression, interval):
    schedule = read_settings({"healthCheckSchedule": expression}).jobs.health_check_schedule
    assert schedule.expression == expression and schedule.interval_seconds == interval


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("rate(1 hours)", "singular for 1"),
        ("rate(2 day)", "singular for 1"),
        ("rate(30 minutes)", "out of range"),
        ("rate(7 days)", "out of range"),
        ("every day", "not a rate(...) or six-field cron(...)"),
        ("cron(0 3 * * *)", "not a rate(...) or six-field cron(...)"),
        ("cron(0 3 ? * MON *)", "must run every day"),
        ("cron(0 3 1 * ? *)", "must run every day"),
        ("cron(0 3 * * ? *;)", "malformed cron field"),
        ("cron(0 3 * * * *)", "one of day-of-month and day-of-week must be ?"),
        ("cron(0 3 ? * ? *)", "one of day-of-month and day-of-week must be ?"),
    ],
)
def test_bad_schedules_name_the_key_and_what_is_allowed(expression, problem):
    with pytest.raises(ConfigError) as error:
        read_settings({"healthCheckSchedule": expression})
    message = str(error.value)
    assert message.startswith(f"context key healthCheckSchedule={expression!r}: ") and problem in message
    assert message.endswith("allowed: empty, rate(1 hour) to rate(6 days), or cron(M H * * ? *) with M one minute")
    assert len(message) <= 200 and "\n" not in message


@pytest.mark.parametrize(
    "expression", ["cron(* * * * ? *)", "cron(0/15 * * * ? *)", "cron(0,30 3 * * ? *)", "cron(10-20 3 * * ? *)"]
)
def test_a_schedule_that_fires_more_than_once_an_hour_is_refused_in_one_line(expression):
    # Each run submits a multi-node benchmark: every minute would launch the fleet 1,440 times a day.
    with pytest.raises(ConfigError) as error:
        read_settings({"healthCheckSchedule": expression})
    message = str(error.value)
    assert message.startswith(f"context key healthCheckSchedule={expression!r}: runs more than once an hour; ")
    assert "the minute must be one value (0-59)" in message
    assert len(message) <= 200 and "\n" not in message


def test_unset_and_empty_mean_no_schedule():
    assert read_settings({}).jobs.health_check_schedule is None
    assert read_settings({"healthCheckSchedule": ""}).jobs.health_check_schedule is None


def scheduler_schedules(template):
    return {k: r["Properties"] for k, r in resources(template, "AWS::Scheduler::Schedule").items()}


def test_on_fair_share_queues_the_check_is_submitted_with_a_share_identifier():
    """Issue 32: EventBridge's Batch target has no share identifier and Batch refuses a job without
    one on a fair-share queue, so the check goes through Scheduler's universal SubmitJob target."""
    template = synth("p5-four-nodes").templates[STACK]
    # No scheduled EventBridge rule for the check (Batch would refuse its job): the only scheduled rule
    # is the budget enforcement's (this variant has budgets), which invokes its function.
    rules = schedule_rules(template)
    others = {k: r for k, r in rules.items() if not k.startswith("TeamBudgetsEnforcement")}
    assert others == {} and len(rules) == 1
    schedules = scheduler_schedules(template)
    assert len(schedules) == 2  # the gpu and trainium fleets
    queues = resources(template, "AWS::Batch::JobQueue")
    for name in ("gpu", "trainium"):
        (schedule,) = [s for k, s in schedules.items() if k.startswith(f"{construct_id(name)}Health")]
        assert schedule["ScheduleExpression"] == VARIANTS["p5-four-nodes"]["healthCheckSchedule"]
        target = schedule["Target"]
        assert target["Arn"]["Fn::Join"][1][-1] == ":scheduler:::aws-sdk:batch:submitJob"
        # The Input is SubmitJob's request: render it with the tokens as their logical ids.
        parts = target["Input"]["Fn::Join"][1]
        rendered = "".join(
            p if isinstance(p, str) else json.dumps(p["Fn::GetAtt"][0] if "Fn::GetAtt" in p else p["Ref"])[1:-1]
            for p in parts
        )
        submit = json.loads(rendered)
        (queue,) = [k for k in queues if k.startswith(f"{construct_id(name)}Queue")]
        (benchmark,) = [
            k
            for k in resources(template, "AWS::Batch::JobDefinition")
            if k.startswith(f"{construct_id(name)}BenchmarkJob")
        ]
        assert queues[queue]["Properties"]["SchedulingPolicyArn"]  # a fair-share queue
        assert submit == {
            "JobName": f"{name}-fleet-check",
            "JobQueue": queue,
            "JobDefinition": benchmark,
            "ShareIdentifier": "fleetcheck",
        }
        # The scheduler's role may submit exactly that job to that queue, nothing else.
        role = target["RoleArn"]["Fn::GetAtt"][0]
        granted = [
            s
            for p in resources(template, "AWS::IAM::Policy").values()
            if {"Ref": role} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]
        ]
        assert all(s["Action"] == "batch:SubmitJob" for s in granted)
        assert any({"Fn::GetAtt": [queue, "JobQueueArn"]} in s["Resource"] and {"Ref": benchmark} in s["Resource"]
                   for s in granted)  # fmt: skip
        assert not any("*" in json.dumps(s["Resource"]) for s in granted)
        trust = resources(template, "AWS::IAM::Role")[role]["Properties"]["AssumeRolePolicyDocument"]
        assert trust["Statement"][0]["Principal"] == {"Service": "scheduler.amazonaws.com"}
    # The identifier is a valid Batch share identifier (255 letters and digits, API SubmitJob).
    from training_constructs.health.fleet_health import FLEET_CHECK_SHARE

    assert re.fullmatch(r"[A-Za-z0-9]{1,255}", FLEET_CHECK_SHARE)


def test_fifo_queues_keep_the_eventbridge_rule():
    assert scheduler_schedules(synth("three-fleets").templates[STACK]) == {}


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        # Issue 32: each synthesized, and EventBridge refused it at deploy or it never fired.
        ("cron(0 25 * * ? *)", "hour 25 outside 0-23"),
        ("cron(61 3 * * ? *)", "minute 61 outside 0-59"),
        ("cron(0 3 * * ? 1999)", "the year field must be *"),
        ("cron(0 3 * * ? 2199)", "the year field must be *"),  # a valid year that still ends the check
        ("cron(0 3 * * ? 1969)", "year 1969 outside 1970-2199"),
        ("cron(0 1-25 * * ? *)", "hour 25 outside 0-23"),
        ("cron(5,70 3 * * ? *)", "minute 70 outside 0-59"),
        ("cron(0/0 3 * * ? *)", "minute increment '0' is not 1-59"),
        ("cron(0/60 3 * * ? *)", "minute increment '60' is not 1-59"),
        ("cron(0 ? * * ? *)", "? only in the day fields, not the hour"),
        ("cron(0 3 ? * 8 *)", "day-of-week 8 outside 1-7"),
        ("cron(0 3 ? * FUN *)", "day-of-week 'FUN' is not 1-7 or SUN-SAT"),
        ("cron(0 3 32 * ? *)", "day-of-month 32 outside 1-31"),
        ("cron(0 3 * 13 ? *)", "month 13 outside 1-12"),
        ("cron(0 3-x * * ? *)", "hour 'x' is not 0-23"),
    ],
)
def test_cron_fields_are_checked_against_eventbridges_ranges(expression, problem):
    with pytest.raises(ConfigError) as error:
        read_settings({"healthCheckSchedule": expression})
    message = str(error.value)
    assert message.startswith(f"context key healthCheckSchedule={expression!r}: {problem}"), message


@pytest.mark.parametrize(
    "expression", ["cron(0 23 * * ? *)", "cron(59 0 ? * * *)", "cron(0 0,23 * * ? *)", "cron(15 0/6 * * ? *)"]
)
def test_cron_fields_at_the_edges_of_their_ranges_are_accepted(expression):
    assert read_settings({"healthCheckSchedule": expression}).jobs.health_check_schedule.expression == expression


def test_the_field_rules_match_eventbridges_table():
    """EventBridge user guide, "Using cron and rate expressions to schedule rules": the six fields'
    ranges, written out here from the page rather than read from the module under test."""
    from config.schedule_rules import FIELDS, field_problem

    documented = [(0, 59), (0, 23), (1, 31), (1, 12), (1, 7), (1970, 2199)]
    for spec, (low, high) in zip(FIELDS, documented, strict=True):
        assert field_problem(spec, str(low)) is None and field_problem(spec, str(high)) is None
        assert field_problem(spec, str(low - 1)) and field_problem(spec, str(high + 1))
    assert field_problem(FIELDS[3], "JAN-DEC") is None and field_problem(FIELDS[4], "SUN-SAT") is None
    assert field_problem(FIELDS[2], "L") is None and field_problem(FIELDS[2], "15W") is None
    assert field_problem(FIELDS[4], "3#2") is None and field_problem(FIELDS[4], "6L") is None
    assert field_problem(FIELDS[4], "8#2") and field_problem(FIELDS[0], "L")


# The boot-check circuit breaker (training_constructs/health/boot_breaker.py); its function's logic runs
# against moto in tests/test_boot_breaker.py.
def compute_export(template, fleet, attribute):
    """The jobs stack's import of one of `fleet`'s compute-stack values."""
    prefix = f"TrainingCompute:ExportsOutputFnGetAtt{construct_id(fleet)}"
    # The fleet's own compute path, not its fallback placements' (<Fleet>Fallback<n>...).
    imports = {
        v for v in _imports(template) if v.startswith(prefix) and attribute in v and "Fallback" not in v[len(prefix) :]
    }
    (name,) = imports
    return {"Fn::ImportValue": name}


def _imports(value):
    if isinstance(value, dict):
        if set(value) == {"Fn::ImportValue"}:
            yield value["Fn::ImportValue"]
        for item in value.values():
            yield from _imports(item)
    elif isinstance(value, list):
        for item in value:
            yield from _imports(item)


def breaker_alarms(template):
    return {
        k: a["Properties"]
        for k, a in resources(template, "AWS::CloudWatch::Alarm").items()
        if k.startswith("BootCircuitBreaker") and "Metrics" in a["Properties"]
    }


def breaker_metrics(alarm):
    """id -> MetricStat of the breaker alarm's metric-math inputs, and its expression."""
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    stats = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
    return stats, expression


def alarm_fleet(alarm):
    stats, _ = breaker_metrics(alarm)
    (fleet,) = {d["Value"] for s in stats.values() for d in s["Metric"]["Dimensions"] if d["Name"] == "Fleet"}
    return fleet


def test_the_breakers_threshold_is_a_tenth_of_max_nodes_and_at_least_3():
    # docs/health.md: a tenth of the fleet's maxNodes, never fewer than 3.
    expected = {1: 3, 4: 3, 30: 3, 31: 4, 64: 7, 80: 8, 1000: 100}
    assert {n: node_faults_to_trip(n) for n in expected} == expected


def test_node_faults_and_take_outs_in_an_hour_trip_each_fleets_own_breaker():
    template = synth("three-fleets").templates[STACK]
    found = breaker_alarms(template)
    assert NODE_FAULTS_TO_TRIP == 3
    by_fleet = {}
    for key, alarm in found.items():
        fleet = alarm_fleet(alarm)
        by_fleet[fleet] = key
        stats, expression = breaker_metrics(alarm)
        # Boot-check node faults and host-confirmed take-outs of this fleet, summed over the same hour: only
        # what the hosts write (node_scripts/boot_check.py), never the launcher's job-printed NodesTakenOut.
        assert expression["Expression"] == "FILL(boot, 0) + FILL(confirmed, 0)" and expression["ReturnData"] is True
        assert {s["Metric"]["MetricName"] for s in stats.values()} == {
            metrics.BOOT_CHECK_FAILED,
            metrics.TAKE_OUT_CONFIRMED,
        }
        assert metrics.NODES_TAKEN_OUT not in json.dumps(alarm)
        boot, taken = stats["boot"], stats["confirmed"]
        assert boot["Metric"]["MetricName"] == metrics.BOOT_CHECK_FAILED
        assert {"Name": metrics.FAULT_DIMENSION, "Value": "node"} in boot["Metric"]["Dimensions"]
        assert taken["Metric"]["MetricName"] == metrics.TAKE_OUT_CONFIRMED
        assert taken["Metric"]["Dimensions"] == [{"Name": metrics.FLEET_DIMENSION, "Value": fleet}]
        for stat in (boot, taken):
            assert stat["Metric"]["Namespace"] == metrics.NAMESPACE
            assert stat["Stat"] == "Sum" and stat["Period"] == 3600
        assert alarm["EvaluationPeriods"] == 1
        threshold = 7 if fleet == "rl" else 3  # rl: maxNodes 64; the others 4
        assert alarm["Threshold"] == threshold and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmActions"] == [topic_ref(template)]
        # The alert says how to turn the fleet back on, with this fleet's compute environment.
        text = alarm["AlarmDescription"]["Fn::Join"][1]
        command = "aws batch update-compute-environment --compute-environment "
        fallback = len(THREE_FLEETS[fleet].get("fallback", []))
        also = f" (and the same for its {fallback} fallback placements: see the breaker's message)" if fallback else ""
        assert text[0].endswith(command) and text[1:] == [
            compute_export(template, fleet, "ComputeEnvironmentArn"),
            " --state ENABLED" + also,
        ]
    assert set(by_fleet) == set(THREE_FLEETS)


def test_each_breaker_rule_disables_exactly_its_own_fleet():
    template = synth("three-fleets").templates[STACK]
    alarm_of = {alarm_fleet(a): k for k, a in breaker_alarms(template).items()}
    rules = {
        k: r["Properties"]
        for k, r in resources(template, "AWS::Events::Rule").items()
        if r["Properties"].get("EventPattern", {}).get("source") == ["aws.cloudwatch"]
    }
    assert len(rules) == len(THREE_FLEETS)
    (function,) = [k for k in resources(template, "AWS::Lambda::Function") if k.startswith("BootCircuitBreaker")]
    for fleet, alarm in alarm_of.items():
        (rule,) = [r for r in rules.values() if r["EventPattern"]["resources"] == [{"Fn::GetAtt": [alarm, "Arn"]}]]
        # CloudWatch user guide, "Alarm events and EventBridge": detail-type, and the new state.
        assert rule["EventPattern"]["detail-type"] == ["CloudWatch Alarm State Change"]
        assert rule["EventPattern"]["detail"] == {"state": {"value": ["ALARM"]}}
        (target,) = rule["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [function, "Arn"]}
        # The input with each import written as its export name: this fleet's own compute environment,
        # then one per fallback placement (their nodes log to the same group), and its log group.
        parts = target["Input"]["Fn::Join"][1]
        given = json.loads("".join(p if isinstance(p, str) else p.get("Fn::ImportValue") or p["Ref"] for p in parts))
        own, *fallback = given["computeEnvironments"]
        assert {"Fn::ImportValue": own} == compute_export(template, fleet, "ComputeEnvironmentArn")
        assert len(fallback) == len(THREE_FLEETS[fleet].get("fallback", []))
        assert all(f"{construct_id(fleet)}Fallback" in arn for arn in fallback)
        assert given["fleet"] == fleet and f"{construct_id(fleet)}BootCheckLogs" in given["logGroup"]
        # Its own threshold; no job log group: the function reads the hosts' lines only.
        assert given["nodeFaultsToTrip"] == (7 if fleet == "rl" else 3)
        assert set(given) == {"fleet", "computeEnvironments", "logGroup", "nodeFaultsToTrip"}


def job_log_group(template, fleet):
    (key,) = [
        k
        for k in resources(template, "AWS::Logs::LogGroup")
        if k.startswith(f"{construct_id(fleet)}LogGroup") or k.startswith(f"{construct_id(fleet)}Logs")
    ]
    return key


LOGS_WRITES = {"logs:PutLogEvents", "logs:CreateLogStream", "logs:*", "*"}


def test_no_job_role_may_write_a_boot_check_log_group():
    """Where the breaker's evidence lives: a job container's credentials (its job role; the instance role is out
    of reach, ECS_AWSVPC_BLOCK_IMDS) write only the job log groups, never a boot-check group nor any "*"."""
    template = synth("three-fleets").templates[STACK]
    roles = [
        k
        for k, r in resources(template, "AWS::IAM::Role").items()
        if "ecs-tasks.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    assert roles
    writes = 0
    for policy in resources(template, "AWS::IAM::Policy").values():
        if not any({"Ref": role} in policy["Properties"].get("Roles", []) for role in roles):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if statement["Effect"] != "Allow" or not LOGS_WRITES & set(actions):
                continue
            targets = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            assert "*" not in targets and "BootCheckLogs" not in json.dumps(targets)
            assert targets == [{"Fn::GetAtt": [job_log_group(template, f), "Arn"]} for f in sorted(THREE_FLEETS)]
            writes += 1
    assert writes == 1  # ECS Exec's session logs (tests/test_job_queues.py)
    for role in roles:
        assert "ManagedPolicyArns" not in resources(template, "AWS::IAM::Role")[role]["Properties"]


def test_the_breaker_function_may_disable_only_the_fleets_compute_environments():
    template = synth("three-fleets").templates[STACK]
    (function,) = [
        f for k, f in resources(template, "AWS::Lambda::Function").items() if k.startswith("BootCircuitBreaker")
    ]
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [
        p for p in resources(template, "AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
    ]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    by_action = {}
    for statement in statements:
        assert statement["Effect"] == "Allow" and "*" not in json.dumps(statement["Resource"])
        for action in [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]:
            by_action[action] = statement["Resource"]
    assert [a for a in by_action if a.startswith("batch:")] == ["batch:UpdateComputeEnvironment"]
    # Every placement's compute environment of every fleet (llm's fallback placements included).
    environments = [
        {"Fn::ImportValue": name}
        for name in sorted(set(_imports(template)))
        if name.startswith("TrainingCompute:ExportsOutputFnGetAtt") and "ComputeEnvironmentArn" in name
    ]
    assert len(environments) == len(THREE_FLEETS) + sum(len(f.get("fallback", [])) for f in THREE_FLEETS.values())
    assert sorted(map(json.dumps, by_action["batch:UpdateComputeEnvironment"])) == sorted(map(json.dumps, environments))
    # Each fleet's boot-check log group (the hosts' lines), no other: never a job log group.
    read = by_action["logs:FilterLogEvents"]
    assert len(read) == len(THREE_FLEETS) and all("BootCheckLogs" in json.dumps(r) for r in read)
    assert not [f for f in THREE_FLEETS if {"Fn::GetAtt": [job_log_group(template, f), "Arn"]} in read]
    assert by_action["sns:Publish"] == topic_ref(template)
    assert set(by_action) == {
        "batch:UpdateComputeEnvironment",
        "logs:FilterLogEvents",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "sns:Publish",
        "kms:Decrypt",
        "kms:GenerateDataKey*",
    }
    env = function["Properties"]["Environment"]["Variables"]
    assert env["LOOKBACK_SECONDS"] == "7200" and "NODE_FAULTS_TO_TRIP" not in env  # per fleet: the rule's input
    # Time to wait out an update that refuses the change (trip.UPDATE_DEADLINE_SECONDS, then the message).
    assert function["Properties"]["Timeout"] == 900 > trip.UPDATE_DEADLINE_SECONDS + 60
    # EventBridge may invoke it, from the breaker rules only.
    permissions = [p["Properties"] for p in resources(template, "AWS::Lambda::Permission").values()]
    sources = [
        p["SourceArn"] for p in permissions if p["FunctionName"] == {"Fn::GetAtt": [function_key(template), "Arn"]}
    ]
    assert len(sources) == len(THREE_FLEETS) and all(p["Principal"] == "events.amazonaws.com" for p in permissions)


def function_key(template):
    (key,) = [k for k in resources(template, "AWS::Lambda::Function") if k.startswith("BootCircuitBreaker")]
    return key


@pytest.mark.parametrize(
    ("variant", "prefixes"),
    [
        ("default", ("BootCircuitBreaker", "ResumedJobAlerts")),
        # three-fleets' llm fleet has a Capacity Block fallback: its expiry function too.
        ("three-fleets", ("BootCircuitBreaker", "CapacityFallback", "ResumedJobAlerts", "CapacityBlockExpiry")),
    ],
)
def test_the_breaker_the_resubmitter_and_the_resumed_job_alert_page_when_they_fail(variant, prefixes):
    """Each acts on AWS's events with nobody watching: a failed invocation of any (Lambda's Errors
    metric of that function) alarms to the job-alert topic; only a deployment with fallback placements
    has the resubmitter, and only one with a Capacity Block placement the block expiry."""
    template = synth(variant).templates[STACK]
    functions = [k for k in resources(template, "AWS::Lambda::Function") if k.startswith(prefixes)]
    errors = alarms(template, "Errors")
    assert len(functions) == len(prefixes) == len(errors)
    watched = []
    for alarm in errors:
        assert alarm["Namespace"] == "AWS/Lambda" and alarm["Statistic"] == "Sum" and alarm["Period"] == 300
        assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["AlarmActions"] == [topic_ref(template)] and alarm["TreatMissingData"] == "notBreaching"
        ((dimension),) = alarm["Dimensions"]
        assert dimension["Name"] == "FunctionName"
        watched.append(dimension["Value"]["Ref"])
        assert "until it works again" in alarm["AlarmDescription"]
    assert sorted(watched) == sorted(functions)
