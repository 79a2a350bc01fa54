"""Repository hygiene: lint, format, pins, documentation in step with the code."""

import json
import re
import subprocess
import sys

from config.context import KEYS
from tests.harness import ROOT


def test_ruff_lint_and_format():
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_cdk_cli_is_pinned_exactly():
    version = json.loads((ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]
    assert re.fullmatch(r"2\.\d+\.\d+", version), version
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/aws-cdk"]["version"] == version


def test_python_requirements_are_pinned():
    for name in (
        "requirements.txt",
        "requirements-dev.txt",
        "requirements-node.txt",
        "requirements-test.txt",
        "requirements-pcluster.txt",
    ):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-r"):
                assert "==" in line, f"{name}: {line}"


def test_no_package_shadows_the_constructs_library():
    assert not (ROOT / "constructs").exists()
    assert not (ROOT / "constructs.py").exists()


def readme_context_table() -> dict[str, str]:
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", readme, re.M)
    return dict(rows)


def test_every_context_key_is_in_the_readme_with_its_default():
    table = readme_context_table()
    assert set(KEYS) <= set(table), set(KEYS) - set(table)
    for key in KEYS.values():
        if key.default not in (None, ""):
            assert str(key.default).lower() in table[key.name].lower(), key.name
