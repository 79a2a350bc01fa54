"""The "all-types" variant is synthesized for its structure only; cdk-nag, CDK's validation and
cfn-lint see the "layouts" variant, one fleet per template shape (tests/harness.py). This proves the
trade: every EFA type's fleet has exactly the resources, property structure and outputs of its
shape's representative, so a finding on one would be a finding on the other."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aws_cdk as cdk
import pytest

from config.settings import fleet_construct_id
from tests.harness import CHECKED_VARIANTS, EFA_TYPES, SHAPE_TYPES, VARIANTS, fleet_name, shape_key, synth

FLEET_IDS = {t: fleet_construct_id(fleet_name(t)) for t in EFA_TYPES}


def _skeleton(value: Any) -> Any:
    """The structure of a value: keys and list lengths kept, every scalar replaced by its type."""
    if isinstance(value, dict):
        return {k: _skeleton(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_skeleton(v) for v in value]
    return type(value).__name__


# Constructs that make one child per fleet, named by the fleet id after their own (alarms, rules, the
# compute stack's exports): those resources belong to the fleet as much as its own.
PER_FLEET_PARENTS = ("", "Dashboard", "JobMetrics", "BootCircuitBreaker", "ExportsOutputFnGetAtt", "ExportsOutputRef")


def _owner(logical_id: str) -> str | None:
    """The fleet whose construct id starts `logical_id`, after a per-fleet parent's name (the longest
    id, as G6e48xlarge vs G6e4...)."""
    owners = [t for t, fid in FLEET_IDS.items() for parent in PER_FLEET_PARENTS if logical_id.startswith(parent + fid)]
    return max(owners, key=lambda t: len(FLEET_IDS[t]), default=None)


def _signatures(variant: str) -> dict[str, list[tuple[str, str, str]]]:
    signatures: dict[str, list[tuple[str, str, str]]] = {t: [] for t in EFA_TYPES}
    for stack, template in sorted(synth(variant).templates.items()):
        for section in ("Resources", "Outputs"):
            for logical_id, body in sorted(template.get(section, {}).items()):
                owner = _owner(logical_id)
                if owner is not None:
                    kind = body.get("Type", section)
                    signatures[owner].append((stack, kind, json.dumps(_skeleton(body), sort_keys=True)))
    # Logical ids end in a hash of the construct path, so their order differs between fleets.
    return {t: sorted(s) for t, s in signatures.items()}


def test_every_type_has_the_shape_of_its_representative():
    signatures = _signatures("all-types")
    representative = {shape_key(t): t for t in SHAPE_TYPES}
    for instance in EFA_TYPES:
        assert signatures[instance], instance  # the fleet's resources were found
        assert signatures[instance] == signatures[representative[shape_key(instance)]], instance


def test_the_representatives_are_checked():
    fleets = json.loads(VARIANTS["layouts"]["fleets"])
    assert sorted(spec["instanceType"] for spec in fleets.values()) == sorted(SHAPE_TYPES)
    assert "layouts" in CHECKED_VARIANTS and "all-types" not in CHECKED_VARIANTS
    # Every shape is represented once: fewer fleets than types, or the variant saves nothing.
    assert len({shape_key(t) for t in EFA_TYPES}) == len(SHAPE_TYPES) < len(EFA_TYPES)


def test_a_jsii_call_from_a_second_thread_fails_at_once_instead_of_hanging():
    # tests/conftest.py guards jsii's kernel: the same call works here and fails in another thread.
    minutes = cdk.Duration.minutes(2)
    assert minutes.to_seconds() == 120
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(minutes.to_seconds)
        with pytest.raises(RuntimeError, match="jsii called from thread"):
            future.result(timeout=30)
    assert minutes.to_seconds() == 120  # the kernel still answers the thread it serves
