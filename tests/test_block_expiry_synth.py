"""The Capacity Block expiry in the jobs stack: one rule per block placement (a fleet's own, a fallback one) on
EC2's expiration warning for that reservation only, whose input names that placement's queue, and a function
that may list jobs and terminate them; a fleet without a block gets nothing."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.harness import resources, synth
from tests.test_jobs import STACK, queue_ids

QUEUE_ARN = "arn:aws:batch:us-west-2:123456789012:job-queue/{}"


def expiry(template: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    rules = [r for k, r in resources(template, "AWS::Events::Rule").items() if k.startswith("CapacityBlockExpiry")]
    return tuple(rules)


def rendered_input(rule: dict[str, Any], detail: dict[str, Any], resources_: list[str]) -> dict[str, Any]:
    """What EventBridge would pass the function: the input template with each queue's ARN in place of its
    GetAtt and the event's detail and resources put in."""
    (target,) = rule["Properties"]["Targets"]
    transformer = target["InputTransformer"]
    assert transformer["InputPathsMap"] == {"detail": "$.detail", "resources": "$.resources"}
    template = transformer["InputTemplate"]
    if isinstance(template, dict):
        separator, parts = template["Fn::Join"]
        template = separator.join(p if isinstance(p, str) else QUEUE_ARN.format(p["Fn::GetAtt"][0]) for p in parts)
    text = template.replace("<detail>", json.dumps(detail)).replace("<resources>", json.dumps(resources_))
    return dict(json.loads(text))


def warning(reservation: str) -> dict[str, Any]:
    """EC2's expiration warning as the EC2 user guide's example shows it ("Monitor Capacity Blocks using
    EventBridge"), with the fields EventBridge adds to every event."""
    return {
        "version": "0",
        "id": "1b6f0c2e-0000-0000-0000-000000000000",
        "detail-type": "Capacity Block Expiration Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-12-08T10:50:00Z",
        "region": "us-west-2",
        "resources": [f"arn:aws:ec2:us-west-2:123456789012:capacity-reservation/{reservation}"],
        "detail": {"capacity-reservation-id": reservation, "end-date": "2026-12-08T11:30:00Z"},
    }


def test_a_fallback_block_gets_one_rule_for_its_reservation_stopping_its_own_queue():
    from moto.events.models import EventPattern

    template = synth("three-fleets").templates[STACK]
    (rule,) = expiry(template)
    matcher = EventPattern.load(json.dumps(rule["Properties"]["EventPattern"]))
    assert matcher.matches_event(warning("cr-0a1b2c3d4e5f60718"))
    assert not matcher.matches_event(warning("cr-0fedcba9876543210"))
    assert not matcher.matches_event({**warning("cr-0a1b2c3d4e5f60718"), "detail-type": "Capacity Block Delivered"})
    assert not matcher.matches_event({**warning("cr-0a1b2c3d4e5f60718"), "source": "aws.batch"})
    event = warning("cr-0a1b2c3d4e5f60718")
    given = rendered_input(rule, event["detail"], event["resources"])
    # The block is the llm fleet's third fallback (tests/harness.py LLM_FALLBACK): its queue, none other.
    block_queue = queue_ids(template)[3]
    assert given["queue"] == QUEUE_ARN.format(block_queue)
    assert (given["reservation"], given["fleet"], given["placement"]) == ("cr-0a1b2c3d4e5f60718", "llm", "3")
    assert given["end"] == "2026-12-08T11:30:00Z" and given["detail"] == event["detail"]


def test_a_fleets_own_block_gets_one_rule_and_an_odcr_fleet_none():
    """The reservations variant: the trainium fleet's own placement is a block, the gpu fleet's an ODCR."""
    template = synth("reservations").templates[STACK]
    (rule,) = expiry(template)
    assert rule["Properties"]["EventPattern"]["detail"] == {"capacity-reservation-id": ["cr-0fedcba9876543210"]}
    queues = [k for k in resources(template, "AWS::Batch::JobQueue") if k.startswith("Trainium")]
    (trainium_queue,) = queues
    event = warning("cr-0fedcba9876543210")
    given = rendered_input(rule, event["detail"], event["resources"])
    assert given["queue"] == QUEUE_ARN.format(trainium_queue) and given["placement"] == "0"
    # A flat fleet's own block has no window in its context: the event's end-date says when.
    assert given["end"] == ""


def test_no_block_no_expiry():
    template = synth("default").templates[STACK]
    assert not [k for k in template["Resources"] if k.startswith("CapacityBlockExpiry")]


def test_the_function_may_list_jobs_and_terminate_jobs_only_and_alarms_when_it_fails():
    template = synth("three-fleets").templates[STACK]
    (policy,) = [r for k, r in resources(template, "AWS::IAM::Policy").items() if k.startswith("CapacityBlockExpiry")]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    by_action = {json.dumps(s["Action"]): s["Resource"] for s in statements}
    assert by_action['"batch:ListJobs"'] == "*"
    terminate = json.dumps(by_action['"batch:TerminateJob"'])
    assert re.search(r":batch:.*:job/\*", terminate)
    batch_actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert {a for a in batch_actions if a.startswith("batch:")} == {"batch:ListJobs", "batch:TerminateJob"}
    (function,) = [
        r for k, r in resources(template, "AWS::Lambda::Function").items() if k.startswith("CapacityBlockExpiry")
    ]
    assert function["Properties"]["Runtime"] == "python3.14"
    assert function["Properties"]["Handler"] == "stop_jobs.handler"
    alarms = [
        a for a in resources(template, "AWS::CloudWatch::Alarm").values() if "CapacityBlockExpiry" in json.dumps(a)
    ]
    assert len(alarms) == 1 and alarms[0]["Properties"]["MetricName"] == "Errors"


def test_the_resubmitters_rule_takes_the_jobs_the_expiry_stopped():
    """The capacity fallback's rule, through moto's EventBridge matcher: a job of the block's queue that ended
    FAILED with the expiry's reason reaches the resubmitter, as a capacity cancel does; other stops do not."""
    from moto.events.models import EventPattern

    from config.job_events import TRAINCTL_CANCEL_REASON
    from tests.test_job_fallback import _sample_event, capacity_fallback
    from training_constructs.jobs.capacity_block_expiry.stop_jobs import reason_for

    template = synth("three-fleets").templates[STACK]
    _, rule, _ = capacity_fallback(template)
    block_queue = QUEUE_ARN.format(queue_ids(template)[3])
    text = json.dumps(rule["Properties"]["EventPattern"])
    text = re.sub(
        r'\{"Fn::GetAtt": \["([A-Za-z0-9]+)", "JobQueueArn"\]\}', lambda m: json.dumps(QUEUE_ARN.format(m[1])), text
    )
    matcher = EventPattern.load(text)
    assert matcher.matches_event(_sample_event(block_queue, statusReason=reason_for("cr-0a1b2c3d4e5f60718", "x")))
    assert not matcher.matches_event(_sample_event(block_queue, statusReason=TRAINCTL_CANCEL_REASON))
