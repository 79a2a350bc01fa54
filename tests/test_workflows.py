"""The GitHub Actions workflow: linted (actionlint, zizmor), pinned, least privilege, running the
README's test command; and the script that turns `cdk diff` into the pull-request comment."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
CI = WORKFLOWS / "ci.yml"
BIN = Path(sys.executable).parent


def workflow() -> dict:
    return yaml.safe_load(CI.read_text())


def steps(job: str) -> list[dict]:
    return workflow()["jobs"][job]["steps"]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN))
    assert found, f"{name} is installed by `make test` (requirements-test.txt)"
    return found


def test_actionlint_is_clean():
    # shellcheck from the venv checks the run: scripts too.
    env = {"PATH": f"{BIN}:/usr/bin:/bin"}
    result = subprocess.run(
        [tool("actionlint"), "-color=false"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_is_clean_even_pedantic():
    result = subprocess.run(
        [tool("zizmor"), "--offline", "--persona", "pedantic", "--no-progress", str(WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflow_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start") :]
    (command,) = re.findall(r"^(make test)\b", quick_start, re.M)[:1]
    assert command in [s.get("run") for s in steps("test")]
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("make ")]
    assert commands == [command, "make faults"]


def test_the_fault_catalog_runs_after_the_tests():
    runs = [s.get("run") for s in steps("test")]
    assert "make faults" in runs and runs.index("make faults") > runs.index("make test")


def test_workflow_runs_on_pull_requests_and_main():
    # PyYAML reads the key `on` as True.
    triggers = workflow()[True]
    assert "pull_request" in triggers and triggers["push"]["branches"] == ["main"]


def test_every_action_is_pinned_by_commit():
    uses = re.findall(r"uses:\s*(\S+)", CI.read_text())
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), ref


def test_permissions_are_least_per_job():
    w = workflow()
    assert w["permissions"] == {}
    for name, job in w["jobs"].items():
        assert "permissions" in job, name
    assert w["jobs"]["test"]["permissions"] == {"contents": "read"}
    assert w["jobs"]["diff"]["permissions"] == {"contents": "read", "id-token": "write", "pull-requests": "write"}
    for job in w["jobs"].values():
        for step in job["steps"]:
            if "actions/checkout" in step.get("uses", ""):
                assert step["with"]["persist-credentials"] is False


def test_synth_with_and_without_parallelcluster_and_upload():
    runs = [s.get("run", "") for s in steps("test")]
    assert any(r.startswith("make synth") and "parallelCluster=true" not in r for r in runs)
    assert any(r.startswith("make synth") and "-c parallelCluster=true" in r for r in runs)
    (upload,) = [s for s in steps("test") if "upload-artifact" in s.get("uses", "")]
    assert upload["with"]["path"] == "cdk.out/"


def test_caches_pip_and_npm_and_uses_node_22_or_newer():
    for job in ("test", "diff"):
        python = next(s for s in steps(job) if "setup-python" in s.get("uses", ""))
        node = next(s for s in steps(job) if "setup-node" in s.get("uses", ""))
        assert python["with"]["cache"] == "pip" and node["with"]["cache"] == "npm"
        assert int(node["with"]["node-version"]) >= 22


def test_diff_runs_only_with_a_role_and_is_explained_otherwise():
    jobs = workflow()["jobs"]
    assert "vars.CDK_DIFF_ROLE_ARN != ''" in jobs["diff"]["if"]
    assert "head.repo.full_name == github.repository" in jobs["diff"]["if"]
    assert "vars.CDK_DIFF_ROLE_ARN == ''" in jobs["diff-skipped"]["if"]
    assert "::notice" in jobs["diff-skipped"]["steps"][0]["run"]
    (credentials,) = [s for s in steps("diff") if "configure-aws-credentials" in s.get("uses", "")]
    assert credentials["with"]["role-to-assume"] == "${{ vars.CDK_DIFF_ROLE_ARN }}"
    assert not any(k in credentials["with"] for k in ("aws-access-key-id", "aws-secret-access-key"))
    # Template diff: read the deployed templates, no change set, so no deploy rights needed.
    assert any("--method template" in s.get("run", "") for s in steps("diff"))


def load_comment_script():
    spec = importlib.util.spec_from_file_location("cdk_diff_comment", ROOT / ".github/scripts/cdk_diff_comment.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cdk_diff_comment"] = module
    spec.loader.exec_module(module)
    return module


# Written in the shape `cdk diff --no-color` prints: a "Stack" header, "[op] Type path LogicalId impact".
DIFF = """\
Stack TrainingNetwork
There were no differences

Stack TrainingData
Resources
[~] AWS::S3::Bucket Data/Checkpoints DataCheckpoints74303317 replace
 └─ [~] BucketName (requires replacement)
[-] AWS::ECR::Repository TeamImages TeamImages3D2B8C4A orphan

Stack TrainingJobs
Resources
[+] AWS::Batch::JobDefinition Gpu/TrainingJob GpuTrainingJob4CCAFCF3
[-] AWS::Logs::LogGroup Gpu/Logs GpuLogsB6EC144D destroy
[~] AWS::Batch::JobQueue Gpu/Queue GpuQueueAC298B72 may be replaced

\u2728  Number of stacks with differences: 2
"""


def test_comment_lists_replacements_and_deletions_dangerous_ones_marked_first():
    script = load_comment_script()
    comment = script.render(script.parse(DIFF))
    assert comment.startswith(script.MARKER + "\n")
    risks = [(r.stack, r.resource_type, r.impact, bool(r.danger)) for r in script.risks(script.parse(DIFF))]
    assert risks == [
        ("TrainingData", "AWS::S3::Bucket", "replace", True),
        ("TrainingData", "AWS::ECR::Repository", "orphan", True),
        ("TrainingJobs", "AWS::Logs::LogGroup", "destroy", True),
        # A job queue that may be replaced: jobs in it would be lost, and its ARN changes.
        ("TrainingJobs", "AWS::Batch::JobQueue", "may be replaced", True),
    ]
    assert "[!CAUTION]" in comment and "**4 of 4 replaced or removed resource(s) fail or lose data" in comment
    table = comment.split("2 of 3 stack(s) differ")[0]
    assert (
        "| ⛔ | TrainingJobs | `Gpu/Queue GpuQueueAC298B72` | `AWS::Batch::JobQueue` | **may be replaced** |" in table
    )
    # The added job definition is neither replaced nor removed: in the diff, not in the table.
    assert "GpuTrainingJob4CCAFCF3" not in table
    assert "<summary><b>TrainingData</b></summary>" in comment and "TrainingNetwork</b>" not in comment


def test_harmless_replacements_are_listed_unmarked_and_the_table_stays_short():
    script = load_comment_script()
    line = "[~] AWS::Batch::JobDefinition Gpu/Job GpuJob0123 replace"
    comment = script.render(script.parse("Stack TrainingJobs\nResources\n" + "\n".join([line] * 50) + "\n"))
    assert "[!NOTE]\n> 50 resource(s) replaced or removed; none holds data" in comment and "⛔" not in comment
    table = comment.split("1 of 1 stack(s) differ")[0]
    assert table.count("GpuJob0123") == script.MAX_ROWS
    assert "| | | 10 more in the diffs below |" in table


def test_comment_without_differences_is_quiet():
    script = load_comment_script()
    comment = script.render(script.parse("Stack TrainingNetwork\nThere were no differences\n"))
    assert "CAUTION" not in comment and "No differences in 1 stack(s)" in comment


def large_diff(sizes: dict[str, int]) -> str:
    """A `cdk diff` of stacks whose bodies have about these many characters each."""
    out = []
    for stack, size in sizes.items():
        out += [f"Stack {stack}", "Resources"]
        line = f"[~] AWS::Batch::JobDefinition {stack}/Job {stack}Job0123 replace"
        out += [line] * (size // (len(line) + 1))
    return "\n".join(out) + "\n"


def test_six_large_stacks_fit_in_one_comment_largest_cut_first():
    script = load_comment_script()
    sizes = {
        "TrainingNetwork": 2_000,
        "TrainingCompute": 90_000,
        "TrainingRegistry": 1_000,
        "TrainingData": 4_000,
        "TrainingJobs": 150_000,
        "TrainingParallelCluster": 40_000,
    }
    comment = script.render(script.parse(large_diff(sizes)))
    assert len(comment) <= 65_536  # GitHub's limit for a comment
    sections = dict(re.findall(r"<summary><b>(\w+)</b></summary>\n\n```\n(.*?)\n```", comment, re.S))
    assert set(sections) == set(sizes)
    # The small diffs are whole; the three largest are cut, each saying so, and listed in the note.
    for stack in ("TrainingNetwork", "TrainingRegistry", "TrainingData"):
        assert "characters cut here" not in sections[stack]
        assert len(sections[stack]) >= sizes[stack] - 100
    for stack in ("TrainingCompute", "TrainingJobs", "TrainingParallelCluster"):
        assert "characters cut here" in sections[stack]
    assert "Diffs of TrainingCompute, TrainingJobs, TrainingParallelCluster are cut" in comment
    # The biggest loses the most; none of the cut ones keeps more than another.
    kept = {s: len(sections[s]) for s in ("TrainingCompute", "TrainingJobs", "TrainingParallelCluster")}
    assert max(kept.values()) - min(kept.values()) < 200


def test_budget_keeps_everything_when_it_fits():
    script = load_comment_script()
    assert script.budget({"a": 10, "b": 20}, 10_000) == {"a": 10, "b": 20}


@pytest.mark.parametrize("argv", [[], ["a", "b"]])
def test_comment_script_usage(argv):
    assert load_comment_script().main(argv) == 2
