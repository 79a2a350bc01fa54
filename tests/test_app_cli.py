"""The app as users run it: through app.py and through the pinned CDK CLI."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, scratch_dir

CDK = ROOT / "node_modules" / ".bin" / "cdk"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without AWS credentials or CDK context, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    env.update(extra)
    return env


# The messages themselves are tested in-process (tests/test_context.py); these runs prove that
# app.py turns a flat key's and a fleets field's error into one line and exit 2, before any synth.
ENDED_BLOCK = {
    "availabilityZone": "us-east-1b",
    "capacityReservationId": "cr-0a1b2c3d4e5f60718",
    "capacityReservationType": "capacity-block",
    "start": "2025-01-01T11:30Z",
    "end": "2025-01-08T11:30Z",
}
BAD_CONTEXTS = [
    ({"gpuNodes": "0"}, "error: context key gpuNodes='0': below 2; allowed: integer 2..1000"),
    (
        {"fleets": '{"rl": {"instanceType": "g6e.48xlarge",}}'},
        """error: context key fleets='{"rl": {"instanceType": "g6e.48xlarge",}}': malformed JSON""",
    ),
    # app.py reads the clock: a Capacity Block whose window is over is refused (issue 46).
    (
        {"fleets": json.dumps({"rl": {"instanceType": "p5.48xlarge", "fallback": [ENDED_BLOCK]}})},
        "error: context key fleets.rl.fallback[0].end='2025-01-08T11:30:00Z': the Capacity Block's window ended",
    ),
]


@functools.cache
def bad_context_runs() -> tuple[tuple[int, str, bool], ...]:
    """Run app.py once per bad context, all at once (each run spends most of its time starting
    the jsii kernel): (exit status, stderr, whether a cloud assembly was written)."""
    runs = []
    for context, _ in BAD_CONTEXTS:
        workdir = Path(scratch_dir("bad-context-"))
        env = clean_env(workdir, CDK_CONTEXT_JSON=json.dumps(context), CDK_OUTDIR=str(workdir / "out"))
        process = subprocess.Popen(
            [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        runs.append((process, workdir))
    results = []
    for process, workdir in runs:
        _, stderr = process.communicate(timeout=120)
        results.append((process.returncode, stderr, (workdir / "out" / "manifest.json").exists()))
    return tuple(results)


@pytest.mark.parametrize("case", range(len(BAD_CONTEXTS)), ids=[next(iter(c)) for c, _ in BAD_CONTEXTS])
def test_bad_context_is_one_line_on_stderr_without_traceback(case):
    returncode, stderr, wrote_assembly = bad_context_runs()[case]
    assert returncode == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(BAD_CONTEXTS[case][1])
    assert "Traceback" not in stderr
    assert not wrote_assembly


def test_main_builds_its_app_without_cdks_built_in_validation(monkeypatch):
    """CloudFormation's validation is about 2 s of every synth: main() leaves CDK's built-in instance
    out (templateValidation=true adds it back through build_app, tests/test_nag.py)."""
    import app as app_module

    made: list[dict[str, object]] = []

    class Made(Exception):
        pass

    def recording_app(**options: object) -> None:
        made.append(options)
        raise Made

    monkeypatch.setattr(app_module.cdk, "App", recording_app)
    with pytest.raises(Made):
        app_module.main()
    assert made == [{"builtin_cloud_formation_validation": False}]
