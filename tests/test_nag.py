"""cdk-nag AwsSolutions: no unacknowledged finding in any checked variant (all but the structure-only
"all-types", whose shapes "layouts" carries: tests/test_shapes.py), and every acknowledgement has a reason."""

import pytest
from cdk_nag import AwsSolutionsChecks

from tests.harness import CHECKED_VARIANTS, synth


@pytest.mark.parametrize("variant", CHECKED_VARIANTS)
def test_no_unacknowledged_findings(variant):
    # synth() already fails on a finding (app.py wires the plugin); this states it explicitly.
    app = synth(variant).app
    report = AwsSolutionsChecks(app).validate_scope(app)
    assert [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations] == []
