"""cdk-nag AwsSolutions: no unacknowledged finding in any checked variant (all but the structure-only
"all-types", whose shapes "layouts" carries: tests/test_shapes.py), and every acknowledgement has a reason.
CloudFormation's own validation: off unless templateValidation=true, and then an error fails synth."""

import aws_cdk as cdk
import pytest
from cdk_nag import AwsSolutionsChecks

from app import build_app
from config.context import read_settings
from tests.harness import CHECKED_VARIANTS, FEATURE_FLAGS, scratch_dir, synth


@pytest.mark.parametrize("variant", CHECKED_VARIANTS)
def test_no_unacknowledged_findings(variant):
    # synth() already fails on a finding (app.py wires the plugin); this states it explicitly.
    app = synth(variant).app
    report = AwsSolutionsChecks(app).validate_scope(app)
    assert [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations] == []


@pytest.mark.parametrize("variant", CHECKED_VARIANTS)
def test_every_checked_variant_is_synthesized_with_cloudformation_validation(variant):
    # So an error in any of their templates has already failed synth (the test below).
    assert read_settings(synth(variant).app.node.get_all_context()).template_validation


@pytest.mark.parametrize("validate", [False, True])
def test_template_validation_is_off_unless_asked_and_then_an_error_fails_synth(validate):
    """An App as main() makes it (CDK's built-in validation off: tests/test_app_cli.py), one broken
    resource added after build_app: synth writes it, unless templateValidation=true, which adds
    CloudFormation's validation back and, with cdk.json's validateAgainstDefaultRules, fails on it."""
    context = {**FEATURE_FLAGS, "trainiumInstanceType": "none"}
    if validate:
        context["templateValidation"] = "true"
    app = cdk.App(context=context, outdir=scratch_dir("cdkout-"), builtin_cloud_formation_validation=False)
    build_app(app, read_settings(app.node.get_all_context()), cdk.Environment(), nag=False)
    cdk.CfnResource(
        app.node.find_child("TrainingData"), "Broken", type="AWS::S3::Bucket", properties={"NoSuchProperty": 1}
    )
    if not validate:
        assert app.synth().get_stack_by_name("TrainingData").template["Resources"]["Broken"]
        return
    with pytest.raises(RuntimeError, match="NoSuchProperty"):
        app.synth()
