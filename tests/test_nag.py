"""cdk-nag AwsSolutions: no unacknowledged finding in any variant, and every acknowledgement has a reason."""

import pytest
from cdk_nag import AwsSolutionsChecks

from tests.harness import VARIANTS, synth


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_unacknowledged_findings(variant):
    # synth() already fails on a finding (app.py wires the plugin); this states it explicitly.
    app = synth(variant).app
    report = AwsSolutionsChecks(app).validate_scope(app)
    assert [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations] == []
