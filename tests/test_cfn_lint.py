"""cfn-lint over every synthesized template of every checked variant (all but the structure-only
"all-types", whose shapes "layouts" carries: tests/test_shapes.py): no errors, no warnings."""

import functools
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests.harness import CHECKED_VARIANTS, synth


def template_json(variant: str, name: str) -> str:
    return json.dumps(synth(variant).templates[name], sort_keys=True)


@functools.cache
def all_findings() -> dict[str, tuple[str, ...]]:
    # Variants share most templates (the network stack is the same for every instance type), so
    # identical templates are linted once. Each goes to the pool as soon as its variant is
    # synthesized, so linting runs in another process while the next variant synthesizes.
    from tests.lint_worker import findings  # cfn-lint's import is a second of every worker's collection

    context = multiprocessing.get_context("spawn")
    futures = {}
    # Lint processes beside the one synthesizing: one on two cores (the suite's other xdist worker
    # has the other; a second would load cfn-lint's rules again, about 2.5 s, to compete), two where
    # there are more cores.
    workers = max(1, min(2, (os.cpu_count() or 2) - 1))
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        for variant in CHECKED_VARIANTS:
            for name in synth(variant).templates:
                text = template_json(variant, name)
                if text not in futures:
                    futures[text] = pool.submit(findings, text)
        return {text: future.result() for text, future in futures.items()}


# Longer than the default limit: the first case synthesizes every checked variant and lints every
# distinct template of them (in a second process), for all the cases after it.
@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", CHECKED_VARIANTS)
def test_templates_lint_clean(variant):
    for name in synth(variant).templates:
        assert all_findings()[template_json(variant, name)] == (), name


def test_lint_catches_a_broken_template():
    # The check itself works: an unknown property is an error.
    from tests.lint_worker import findings

    broken = {"Resources": {"Bucket": {"Type": "AWS::S3::Bucket", "Properties": {"NoSuchProperty": 1}}}}
    assert findings(json.dumps(broken))
