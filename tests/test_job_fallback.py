"""A fleet's fallback placements in the jobs stack: a queue per placement on its own compute
environment, the capacity wait, the resubmitter's rule and permissions, the Placements output."""

import json
import re

import pytest

from config.context import ConfigError, read_settings
from tests.harness import resources, synth
from tests.test_jobs import CAPACITY, STACK, queue_ids
from training_constructs.jobs.capacity_fallback.routes import definition_families


def test_each_placement_has_a_queue_of_its_own_compute_environment_only():
    """One compute environment per queue: a job is placed in one placement or none, never across two."""
    template = synth("three-fleets").templates[STACK]
    compute = synth("three-fleets").templates["TrainingCompute"]
    # Compute environments are exported by GetAtt; other exports (the boot-check log groups) are Refs.
    exports = {
        o["Export"]["Name"]: o["Value"]["Fn::GetAtt"][0]
        for o in compute["Outputs"].values()
        if "Export" in o and "Fn::GetAtt" in o["Value"]
    }
    environments = []
    prefixes = ("Llm", "LlmFallback1", "LlmFallback2", "LlmFallback3")
    for queue_id, prefix in zip(queue_ids(template), prefixes, strict=True):
        (order,) = template["Resources"][queue_id]["Properties"]["ComputeEnvironmentOrder"]
        environment = exports[order["ComputeEnvironment"]["Fn::ImportValue"]]
        assert environment.startswith(prefix) and not environment[len(prefix) :].startswith("Fallback")
        environments.append(environment)
    assert len(set(environments)) == 4


def test_every_placement_but_the_last_waits_ten_minutes_for_capacity():
    template = synth("three-fleets").templates[STACK]
    limits = []
    for queue_id in queue_ids(template):
        actions = template["Resources"][queue_id]["Properties"]["JobStateTimeLimitActions"]
        limits.append({a["Reason"]: a["MaxTimeSeconds"] for a in actions})
    # 600 s is the least the API allows (API JobStateTimeLimitAction, maxTimeSeconds).
    assert [limit[CAPACITY] for limit in limits] == [600, 600, 600, 30 * 60]
    assert all(limit["MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"] == 30 * 60 for limit in limits)


ACCOUNT = "123456789012"


def resolve(value, values):
    """A CloudFormation value with the intrinsic functions the policy uses evaluated: pseudo
    parameters of us-west-2 and ACCOUNT, Ref and GetAtt of resources from `values`."""
    pseudo = {"AWS::Partition": "aws", "AWS::Region": "us-west-2", "AWS::AccountId": ACCOUNT}
    if isinstance(value, str):
        return value
    ((function, argument),) = value.items()
    if function == "Ref":
        return pseudo.get(argument) or values[argument]
    if function == "Fn::GetAtt":
        return values[argument[0]]
    if function == "Fn::Join":
        return argument[0].join(resolve(v, values) for v in argument[1])
    if function == "Fn::Split":
        return resolve(argument[1], values).split(argument[0])
    if function == "Fn::Select":
        chosen = resolve(argument[1], values)
        return chosen[argument[0]]
    raise ValueError(function)


def capacity_fallback(template):
    def one(resource_type, prefix):
        (found,) = [r for k, r in resources(template, resource_type).items() if k.startswith(prefix)]
        return found

    return (
        one("AWS::Lambda::Function", "CapacityFallback"),
        one("AWS::Events::Rule", "CapacityFallback"),
        one("AWS::IAM::Policy", "CapacityFallbackRole"),
    )


def test_only_fleets_with_fallback_get_the_resubmitter():
    assert not [k for k in synth("default").templates[STACK]["Resources"] if k.startswith("CapacityFallback")]
    template = synth("three-fleets").templates[STACK]
    function, _, _ = capacity_fallback(template)
    text = json.dumps(function["Properties"]["Environment"]["Variables"]["ROUTES"])
    # Every placement of llm and nothing of rl or trn.
    assert all(q in text for q in queue_ids(template))
    assert "RlQueue" not in text and "TrnQueue" not in text


def test_the_resubmitter_may_submit_only_to_the_fleets_queues_and_job_definitions():
    template = synth("three-fleets").templates[STACK]
    _, _, policy = capacity_fallback(template)
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (submit,) = [s for s in statements if s["Action"] == "batch:SubmitJob"]
    definitions = [k for k in resources(template, "AWS::Batch::JobDefinition") if k.startswith("Llm")]
    assert len(definitions) == 2  # the training job and the benchmark
    # Deployed: Ref of a job definition is its ARN with the revision (CloudFormation, AWS::Batch::JobDefinition).
    prefix = f"arn:aws:batch:us-west-2:{ACCOUNT}:job-definition/"
    values = {d: f"{prefix}{d}-a1b2c3d4e5f6:3" for d in definitions} | {q: f"queue/{q}" for q in queue_ids(template)}
    granted = [resolve(r, values) for r in submit["Resource"]]
    # Every revision of each definition's family and of its trainctl family (issue 46), and the queues.
    families = [a for d in definitions for a in definition_families(prefix, f"{d}-a1b2c3d4e5f6")]
    assert sorted(granted) == sorted([f"queue/{q}" for q in queue_ids(template)] + families)
    assert all(a.endswith(("-a1b2c3d4e5f6:*", "-a1b2c3d4e5f6-trainctl:*")) for a in families)
    (describe,) = [s for s in statements if s["Action"] == "batch:DescribeJobs"]
    assert describe["Resource"] == "*"  # DescribeJobs has no resource-level permissions
    (tag,) = [s for s in statements if s["Action"] == "batch:TagResource"]
    assert ":job/*" in json.dumps(tag["Resource"])


def _sample_event(queue, **detail):
    return {
        "version": "0",
        "id": "7a5c4f2e-0000-0000-0000-000000000000",
        "detail-type": "Batch Job State Change",
        "source": "aws.batch",
        "account": "123456789012",
        "time": "2026-11-24T21:00:00Z",
        "region": "us-west-2",
        "resources": [],
        "detail": {
            "jobQueue": queue,
            "jobId": "4c9fa98c-175c-461e-a8f8-4ce4e5ab0462",
            "status": "FAILED",
            "statusReason": f"Canceled by JobStateTimeLimit action due to reason: {CAPACITY}",
            **detail,
        },
    }


def test_the_rule_matches_capacity_cancels_of_the_placements_and_nothing_else():
    """The synthesized pattern, each queue's ARN in place of its GetAtt, through moto's EventBridge
    matcher (an implementation of EventBridge's pattern semantics: prefix, anything-but, wildcard)."""
    from moto.events.models import EventPattern

    template = synth("three-fleets").templates[STACK]
    _, rule, _ = capacity_fallback(template)
    arn = {q: f"arn:aws:batch:us-west-2:123456789012:job-queue/{q}" for q in queue_ids(template)}
    text = json.dumps(rule["Properties"]["EventPattern"])
    text = re.sub(r'\{"Fn::GetAtt": \["([A-Za-z0-9]+)", "JobQueueArn"\]\}', lambda m: json.dumps(arn[m[1]]), text)
    matcher = EventPattern.load(text)
    first, *_, last = arn.values()
    assert matcher.matches_event(_sample_event(first)) and matcher.matches_event(_sample_event(last))
    resource_reason = "Canceled by JobStateTimeLimit action due to reason: MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"
    for event in (
        _sample_event("arn:aws:batch:us-west-2:123456789012:job-queue/RlQueue"),
        _sample_event(first, statusReason="Essential container in task exited"),
        _sample_event(first, statusReason=resource_reason),
        _sample_event(first, status="RUNNABLE", statusReason=f"{CAPACITY} - Service cannot fulfill the capacity"),
        # A node of a multi-node job (<id>#<n>): the job itself is the one to resubmit.
        _sample_event(first, jobId="4c9fa98c-175c-461e-a8f8-4ce4e5ab0462#1"),
    ):
        assert not matcher.matches_event(event), event["detail"]


def test_placements_output_lists_each_placement_and_its_queue_in_order():
    template = synth("three-fleets").templates[STACK]
    separator, items = template["Outputs"]["LlmPlacements"]["Value"]["Fn::Join"]
    assert separator == ";"
    parts = [item["Fn::Join"][1] for item in items]
    assert [p[0] for p in parts] == [
        "us-west-2b p5e.48xlarge|",
        "us-west-2c p5e.48xlarge|",
        "us-west-2b p5.48xlarge|",
        "us-west-2a p5e.48xlarge cr-0a1b2c3d4e5f60718 (capacity-block 2026-12-01T11:30Z..2026-12-08T11:30Z)|",
    ]
    assert [p[1]["Fn::GetAtt"][0] for p in parts] == queue_ids(template)
    assert "RlPlacements" not in template["Outputs"]


def test_a_different_shape_fallback_is_refused_in_one_line():
    llm = {"instanceType": "p5e.48xlarge", "fallback": [{"instanceType": "p5en.48xlarge"}]}
    with pytest.raises(ConfigError) as refused:
        read_settings({"fleets": json.dumps({"llm": llm})})
    message = str(refused.value)
    assert "\n" not in message and len(message) <= 220
    assert message.startswith("context key fleets.llm.fallback[0].instanceType='p5en.48xlarge': not the shape of")
    assert message.endswith("p5.48xlarge, p5e.48xlarge")
