"""cfn-lint over every synthesized template: no errors, no warnings."""

import functools
import json

import pytest
from cfnlint.api import ManualArgs, lint

from tests.harness import VARIANTS, synth

# Regions with every instance family the catalog offers.
REGIONS = ["us-east-1", "us-west-2"]


@functools.cache
def findings(template_json: str) -> tuple[str, ...]:
    # Variants share most templates (the network stack is the same for every instance type);
    # identical templates are linted once.
    matches = lint(template_json, config=ManualArgs(regions=REGIONS))
    return tuple(f"{m.rule.id} {m.message} ({m.path})" for m in matches)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_templates_lint_clean(variant):
    for name, template in synth(variant).templates.items():
        assert findings(json.dumps(template, sort_keys=True)) == (), name
