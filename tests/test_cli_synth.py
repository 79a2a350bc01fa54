"""The app as users run it: `cdk synth` through the pinned CDK CLI, without credentials."""

import json
import subprocess

import pytest

from tests.test_app_cli import CDK, ROOT, clean_env


@pytest.mark.skipif(not CDK.exists(), reason="CDK CLI not installed: run through `make test`")
def test_pinned_cli_synthesizes_without_credentials_or_node_banner(tmp_path):
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [str(CDK), "synth", "--quiet", "--output", str(out)],
        cwd=ROOT,
        env=clean_env(tmp_path, CDK_DISABLE_CLI_TELEMETRY="true"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "end-of-life" not in result.stdout + result.stderr
    assert "schema version mismatch" not in result.stderr.lower()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "missing" not in manifest  # no context lookups, so no AWS calls
    assert (out / "TrainingNetwork.template.json").exists()
