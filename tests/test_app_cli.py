"""The app as users run it: through app.py and through the pinned CDK CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

CDK = ROOT / "node_modules" / ".bin" / "cdk"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without AWS credentials or CDK context, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    env.update(extra)
    return env


def run_app(tmp_path: Path, context: dict) -> subprocess.CompletedProcess:
    env = clean_env(tmp_path, CDK_CONTEXT_JSON=json.dumps(context), CDK_OUTDIR=str(tmp_path / "out"))
    return subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"gpuNodes": "0"}, "error: context key gpuNodes='0': out of range 2..1000; allowed: integer 2..1000"),
        ({"gpuNode": "4"}, "error: unknown context key 'gpuNode': did you mean gpuNodes?"),
        ({"trainiumInstanceType": "p5.48xlarge"}, "error: context key trainiumInstanceType='p5.48xlarge'"),
    ],
)
def test_bad_context_is_one_line_on_stderr_without_traceback(tmp_path, context, expected):
    result = run_app(tmp_path, context)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


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
