"""cfn-lint over every synthesized template: no errors, no warnings."""

import json

import pytest
from cfnlint.api import ManualArgs, lint

from tests.harness import VARIANTS, synth

# Regions with every instance family the catalog offers.
REGIONS = ["us-east-1", "us-west-2"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_templates_lint_clean(variant):
    for name, template in synth(variant).templates.items():
        matches = lint(json.dumps(template), config=ManualArgs(regions=REGIONS))
        assert [f"{m.rule.id} {m.message} ({m.path})" for m in matches] == [], name
