"""Repository hygiene: lint, format, pins, documentation pages in step with the code."""

import ast
import json
import re
import subprocess
import sys

from tests.docs_text import page, section
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
        "requirements-cli.txt",
        "requirements-dev.txt",
        "requirements-node.txt",
        "requirements-test.txt",
        "requirements-pcluster.txt",
        "requirements-docs.txt",
        "requirements-rehearsal.txt",
    ):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-r"):
                assert "==" in line, f"{name}: {line}"


def test_no_package_shadows_the_constructs_library():
    assert not (ROOT / "constructs").exists()
    assert not (ROOT / "constructs.py").exists()


def imported_modules(path) -> dict[str, int]:
    """Every module a file imports, at any depth (lazy imports in functions too) -> its first line."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            found.setdefault(name, node.lineno)
    return found


def test_config_imports_no_boto3():
    # config/ holds typed settings only: code that calls AWS lives in trainctl/, budget_ledger/'s callers and
    # the constructs' Lambda functions. Lazy imports count too (the scan sees instance_types.py's botocore).
    found = {path.relative_to(ROOT).as_posix(): imported_modules(path) for path in (ROOT / "config").rglob("*.py")}
    assert "botocore.loaders" in found["config/instance_types.py"]
    boto3 = [
        f"{path}:{line} imports {name}"
        for path, modules in sorted(found.items())
        for name, line in modules.items()
        if name == "boto3" or name.startswith("boto3.")
    ]
    assert boto3 == []


def docs_json(heredoc: str) -> dict:
    """The JSON the pull-request page writes with `cat > NAME <<'JSON'`."""
    (text,) = re.findall(rf"cat > {re.escape(heredoc)} <<'JSON'\n(.*?)\nJSON\n", page("pull-requests.md"), re.S)
    return json.loads(text)


def test_docs_diff_role_reads_templates_and_nothing_else():
    policy = docs_json("diff-policy.json")
    actions = {a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    # No role to assume (the bootstrap lookup role reads the whole account), no data, no writes.
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    assert "sts:AssumeRole" not in actions and not any(a.startswith("s3:") for a in actions)
    assert actions <= {
        "cloudformation:DescribeStacks",
        "cloudformation:GetTemplate",
        "cloudformation:ListStacks",
        "cloudformation:ListStackResources",
    }
    assert "lookup-role" not in json.dumps(policy)


def test_docs_diff_role_trusts_only_this_repositorys_pull_requests():
    (statement,) = docs_json("trust.json")["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"].endswith(":oidc-provider/token.actions.githubusercontent.com")
    condition = statement["Condition"]
    assert condition["StringEquals"] == {"token.actions.githubusercontent.com:aud": "sts.amazonaws.com"}
    assert condition["StringLike"] == {"token.actions.githubusercontent.com:sub": "repo:ORG/REPO:pull_request"}
    # The approval-gated alternative is documented with the subject GitHub gives environment jobs.
    pull_requests = page("pull-requests.md")
    assert '"repo:ORG/REPO:environment:cdk-diff"' in pull_requests and "environment: cdk-diff" in pull_requests


def test_docs_warn_about_default_security_group_auto_remediation():
    design = page("design.md")
    warning = design[design.index("**Security Hub control EC2.2**") :][:1500]
    assert "auto-remediat" in warning and "exempt" in warning


def make_dry_run(*args: str) -> str:
    result = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if "cdk deploy" in x]
    return line


def test_make_deploy_can_skip_the_approval_prompt():
    assert make_dry_run("deploy", "APPROVAL=never", "ARGS=-c gpuNodes=4").endswith(
        "cdk deploy --all -c templateValidation=true --require-approval never -c gpuNodes=4"
    )
    # Without APPROVAL the CLI's own default (ask before broadening permissions) stays.
    assert "--require-approval" not in make_dry_run("deploy")


def test_make_deploy_validates_the_templates_and_a_later_value_can_turn_it_off():
    # The CLI takes the last -c of a key, so the user's ARGS come after the default.
    line = make_dry_run("deploy", "ARGS=-c templateValidation=false")
    assert line.index("-c templateValidation=true") < line.index("-c templateValidation=false")


def test_docs_say_a_failed_subnet_delete_does_not_roll_back():
    """CloudFormation deletes a moved fleet's old subnet in the cleanup phase; a failed delete there
    leaves the stack UPDATE_COMPLETE and the subnet and its block orphaned (CloudFormation User Guide,
    Troubleshooting, "Resource removed from stack but not deleted")."""
    changing = section("Changing a deployed fleet")
    (row,) = [line for line in changing.splitlines() if line.startswith("| a fleet's AZ")]
    assert "rolls back" not in row.replace("nothing rolls back", "")
    assert "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS" in row and "`UPDATE_COMPLETE`" in row
    assert "#moving-a-fleet-to-another-az" in row
    moving = section("Moving a fleet to another AZ")
    assert moving.index("**Drain**") < moving.index("**Deploy**") < moving.index("**Check**")
    for command in ("ec2 describe-subnets", "ec2 delete-subnet", "ec2 disassociate-vpc-cidr-block"):
        assert f"aws {command}" in moving, command


def test_docs_explain_upgrading_a_deployment_that_named_an_az():
    upgrading = section("Upgrading an existing deployment")
    assert "`availabilityZone` set" in upgrading and "a fleet's `availabilityZone` set" in upgrading
    # The old release cannot unset the key either: it moves the same subnets on the same CIDRs.
    assert "Unsetting `availabilityZone` on the old release first does not help" in upgrading
    assert "npx cdk destroy TrainingNetwork" in upgrading and "What is lost" in upgrading
    assert "buckets" in upgrading and "ECR" in upgrading and "retained" in upgrading
