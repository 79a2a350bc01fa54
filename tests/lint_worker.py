"""cfn-lint in a worker process. Kept apart from the harness so that spawned workers import only
cfn-lint, not aws-cdk-lib and its Node.js kernel."""

from cfnlint.api import ManualArgs, lint

# Regions with every instance family the catalog offers.
REGIONS = ["us-east-1", "us-west-2"]


def findings(template_json: str) -> tuple[str, ...]:
    matches = lint(template_json, config=ManualArgs(regions=REGIONS))
    return tuple(f"{m.rule.id} {m.message} ({m.path})" for m in matches)
