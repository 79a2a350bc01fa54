"""cfn-lint in a worker process. Kept apart from the harness so that spawned workers import only
cfn-lint, not aws-cdk-lib and its Node.js kernel."""

import functools

from cfnlint.config import ConfigMixIn
from cfnlint.decode import decode_str
from cfnlint.runner import Runner

# Regions with every instance family the catalog offers.
REGIONS = ["us-east-1", "us-west-2"]


@functools.cache
def _runner() -> Runner:
    # Loading the rules costs about half a second; one runner serves every template of the process,
    # as the cfn-lint command does for many files.
    return Runner(ConfigMixIn(regions=REGIONS))


def findings(template_json: str) -> tuple[str, ...]:
    template, errors = decode_str(template_json)
    matches = errors or list(_runner().validate_template(template))
    return tuple(f"{m.rule.id} {m.message} ({m.path})" for m in matches)
