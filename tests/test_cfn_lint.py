"""cfn-lint over every synthesized template of every variant: no errors, no warnings."""

import functools
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests.harness import VARIANTS, synth
from tests.lint_worker import findings


def template_json(variant: str, name: str) -> str:
    return json.dumps(synth(variant).templates[name], sort_keys=True)


@functools.cache
def all_findings() -> dict[str, tuple[str, ...]]:
    # Variants share most templates (the network stack is the same for every instance type), so
    # identical templates are linted once; the rest are spread over the machine's cores.
    unique = sorted({template_json(v, name) for v in VARIANTS for name in synth(v).templates})
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context) as pool:
        return dict(zip(unique, pool.map(findings, unique), strict=True))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_templates_lint_clean(variant):
    for name in synth(variant).templates:
        assert all_findings()[template_json(variant, name)] == (), name


def test_lint_catches_a_broken_template():
    # The check itself works: an unknown property is an error.
    broken = {"Resources": {"Bucket": {"Type": "AWS::S3::Bucket", "Properties": {"NoSuchProperty": 1}}}}
    assert findings(json.dumps(broken))
