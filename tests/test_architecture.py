"""The home page's architecture diagram (tools/architecture.py): current with the suite's shared synth of the
default context (its source, and the SVG drawn from it), and drawing the stacks, each fleet's parts and what uses
what."""

from __future__ import annotations

import re

from tests.docs_text import page
from tests.harness import synth
from tools import architecture


def diagram(variant: str) -> str:
    result = synth(variant)
    return architecture.mermaid(result.app, result.templates)


def test_the_home_page_holds_the_current_diagram():
    # The committed Mermaid source is what the synth gives, the committed SVG was drawn from that source (its
    # stamp: no browser needed to check), and the home page shows it.
    result = synth("default")
    source = architecture.mermaid(result.app, result.templates) + "\n"
    assert architecture.SOURCE.read_text() == source, "run `make docs-gen`"
    assert architecture.drawn_from(source), "run `make docs-gen` (it redraws the SVG: needs Chromium)"
    assert architecture.current_block(page("index.md")) == architecture.block(result.app), "run `make docs-gen`"
    assert "](assets/architecture.svg)" in architecture.block(result.app)


def test_every_stack_is_a_box_holding_its_parts():
    text = diagram("default")
    boxes = re.findall(r"^  subgraph (\w+)$", text, re.M)
    assert set(boxes) == {
        "TrainingNetwork",
        "TrainingCompute",
        "TrainingRegistry",
        "TrainingData",
        "TrainingJobs",
        "TrainingMonitoring",
    }
    # Each default fleet's compute: its compute environment, EFA launch template and placement group.
    for fleet in ("Gpu", "Trainium"):
        compute = re.search(rf'^    TrainingCompute_{fleet}\["(.*)"\]$', text, re.M)
        assert compute, fleet
        assert all(part in compute[1] for part in ("compute environment", "EFA launch template", "placement group"))
        queue = re.search(rf'^    TrainingJobs_{fleet}\["(.*)"\]$', text, re.M)
        assert queue and "job queue" in queue[1] and "job definitions" in queue[1], fleet
    assert re.search(r'^    TrainingData_Data\[".*buckets.*"\]$', text, re.M)


def test_arrows_follow_what_each_part_uses_across_stacks():
    edges = set(re.findall(r"^  (\w+) --> (\w+)$", diagram("default"), re.M))
    for fleet, other in (("Gpu", "Trainium"), ("Trainium", "Gpu")):
        assert (f"TrainingCompute_{fleet}", "TrainingNetwork_Network") in edges  # subnets, security groups
        assert (f"TrainingJobs_{fleet}", f"TrainingCompute_{fleet}") in edges  # the queue's compute environment
        assert (f"TrainingJobs_{fleet}", f"TrainingCompute_{other}") not in edges  # never another fleet's
        assert ("TrainingJobs_BootCircuitBreaker", f"TrainingCompute_{fleet}") in edges
    assert ("TrainingJobs_JobRole", "TrainingData_Data") in edges
    assert ("TrainingMonitoring_Dashboard", "TrainingJobs_JobAlerts") in edges
    assert all(source.split("_")[0] != target.split("_")[0] for source, target in edges)  # between stacks only


def test_named_fleets_each_get_their_parts():
    text = diagram("three-fleets")
    edges = set(re.findall(r"^  (\w+) --> (\w+)$", text, re.M))
    for fleet in ("Rl", "Llm", "Trn"):
        assert (f"TrainingJobs_{fleet}", f"TrainingCompute_{fleet}") in edges
        assert (f"TrainingCompute_{fleet}", "TrainingNetwork_Network") in edges
    assert "TrainingCompute_Gpu" not in text
