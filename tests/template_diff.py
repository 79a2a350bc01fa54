"""Template pairs diffed by the CDK CLI's own diff engine (tests/cdk_diff.js), many pairs in one Node
process: what `cdk diff --template <old> --no-change-set` prints and whether it replaces, without a
CLI start-up per stack. Plain paths in, plain JSON out: nothing here calls into jsii, so it may run
beside a synth in another process, never in another thread of one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

DIFF_SCRIPT = Path(__file__).resolve().parent / "cdk_diff.js"


def diff_templates(pairs: list[dict[str, str | None]]) -> dict[str, dict[str, Any]]:
    """pairs: [{"id", "stack", "old": template path or None, "new": template path}] ->
    {id: {"text": the formatted diff, "changes": [{logicalId, type, impact, op}]}}."""
    result = subprocess.run(
        ["node", str(DIFF_SCRIPT)], input=json.dumps(pairs), capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(result.stdout)
