"""imageBuild=cloud: the CodeBuild project, its least-privilege role, the wait for each build, the
content tag in the job definitions, and what the next deploy does when container/ changes."""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from config.context import ConfigError, read_settings
from config.settings import ImageSettings
from stacks.registry_stack import RegistryStack
from tests.harness import FEATURE_FLAGS, ROOT, VARIANTS, resources, scratch_dir, synth, synth_with
from tests.template_diff import diff_templates
from tests.test_app_cli import CDK
from training_constructs.common.retention import retention_days
from training_constructs.images import cloud_image_build as build
from training_constructs.images.image_versions import load_versions

VARIANT = "reservations"  # imageBuild=cloud, ngcSecret=ngc-api-key
STACK = "TrainingRegistry"
HASH = re.compile(r"[0-9a-f]{64}")


def template(stack: str = STACK) -> dict[str, Any]:
    return synth(VARIANT).templates[stack]


def only(template_: dict[str, Any], resource_type: str) -> dict[str, Any]:
    (resource,) = resources(template_, resource_type).values()
    return resource


def content_tag_hash() -> str:
    registry = synth(VARIANT).app.node.find_child(STACK)
    return registry.cloud_build.content_hash


def statements(template_: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    found = []
    for policy in resources(template_, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            found += policy["Properties"]["PolicyDocument"]["Statement"]
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_cloud_mode_stages_no_docker_image_in_any_asset_manifest():
    directory = Path(synth(VARIANT).assembly.directory)
    manifests = sorted(directory.glob("*.assets.json"))
    assert manifests
    for manifest in manifests:
        assert json.loads(manifest.read_text()).get("dockerImages", {}) == {}, manifest.name
    # The source goes up as a file asset (a zip of container/), which CodeBuild reads.
    registry_files = json.loads((directory / f"{STACK}.assets.json").read_text())["files"]
    assert any(f["source"].get("packaging") == "zip" and f["source"]["path"].startswith("asset.")
               for f in registry_files.values())  # fmt: skip


def test_build_project_is_privileged_large_enough_time_limited_and_logs_to_a_retained_group():
    t = template()
    project = only(t, "AWS::CodeBuild::Project")["Properties"]
    env = project["Environment"]
    # CodeBuild API ProjectEnvironment.computeType: 2XLARGE has 824 GB SSD, images up to 100 GB.
    assert env["ComputeType"] == "BUILD_GENERAL1_2XLARGE"
    assert env["PrivilegedMode"] is True and env["Type"] == "LINUX_CONTAINER"
    assert project["TimeoutInMinutes"] == build.BUILD_TIMEOUT_MINUTES <= 480
    assert project["QueuedTimeoutInMinutes"] == build.QUEUED_TIMEOUT_MINUTES <= 480
    assert project["Source"]["Type"] == "S3"
    group_id = project["LogsConfig"]["CloudWatchLogs"]["GroupName"]["Ref"]
    group = t["Resources"][group_id]
    assert group["Properties"]["RetentionInDays"] == 30
    assert group["DeletionPolicy"] == "Retain"
    spec = json.loads(project["Source"]["BuildSpec"])
    assert spec["phases"]["build"]["commands"][0].startswith("bash -c ")
    assert "docker build " in spec["phases"]["build"]["commands"][0]


def test_build_role_pushes_to_one_repository_reads_one_secret_and_the_source_object():
    t = template()
    project = only(t, "AWS::CodeBuild::Project")["Properties"]
    role_id = project["ServiceRole"]["Fn::GetAtt"][0]
    repo_id = next(iter(resources(t, "AWS::ECR::Repository")))
    repo_arn = {"Fn::GetAtt": [repo_id, "Arn"]}
    by_action: dict[str, list[Any]] = {}
    for statement in statements(t, role_id):
        assert statement["Effect"] == "Allow"
        for action in as_list(statement["Action"]):
            by_action.setdefault(action, []).extend(as_list(statement["Resource"]))
    for action in ("ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload",
                   "ecr:BatchGetImage", "ecr:DescribeImages"):  # fmt: skip
        assert by_action[action] == [repo_arn], action
    # The one action ECR cannot scope (API reference, GetAuthorizationToken).
    assert [a for a, r in by_action.items() if "*" in r] == ["ecr:GetAuthorizationToken"]
    (secret,) = by_action["secretsmanager:GetSecretValue"]
    # One secret by name; Secrets Manager appends six random characters to its ARN.
    assert json.dumps(secret).endswith('":secret:ngc-api-key-??????"]]}')
    source_key = project["Source"]["Location"]["Fn::Join"][1][-1].lstrip("/")
    objects = [json.dumps(r) for r in by_action["s3:GetObject*"]]
    assert any(source_key in o for o in objects) and not any(o.endswith('/*"]]}') for o in objects)
    services = {a.split(":")[0] for a in by_action}
    assert services == {"ecr", "secretsmanager", "s3", "logs", "codebuild"}
    assert {a for a in by_action if a.startswith("codebuild:")} <= {
        "codebuild:CreateReportGroup", "codebuild:CreateReport", "codebuild:UpdateReport",
        "codebuild:BatchPutTestCases", "codebuild:BatchPutCodeCoverages",
    }  # fmt: skip
    assert not [a for a in by_action if a.endswith(":*") or a == "*"]


# Docker Hub's hosts, and an image reference with no registry host (a Docker Hub short name).
DOCKER_HUB = re.compile(r"docker\.io|registry\.hub\.docker\.com|(?<![\w./-])(moby|library|docker)/[\w.-]+")
# A registry host: a dotted name (or one with a port) followed by a path, as in an image reference.
REGISTRY_HOST = re.compile(r"(?<![\w.$/-])((?:[a-z0-9-]+\.)+[a-z]{2,}(?::\d+)?)/[\w.-]+")


def test_the_cloud_build_pulls_no_builder_image_from_any_registry():
    """Issue 46: BuildKit came from an ECR Public namespace (`vend`) that belongs to neither Docker nor
    AWS. Now CodeBuild's managed image builds with its own Docker (BuildKit inside dockerd): the build's
    sources name no registry but the team repository (a variable) and nvcr.io (the NGC login for the
    Isaac Sim base that container/gpu/Dockerfile names), and no Docker Hub image at all."""
    project = only(template(), "AWS::CodeBuild::Project")["Properties"]
    variables = {v["Name"]: v["Value"] for v in project["Environment"]["EnvironmentVariables"]}
    buildspec = project["Source"]["BuildSpec"]
    script = build.BUILD_SCRIPT.read_text()
    construct_source = Path(build.__file__).read_text()
    # The buildspec runs the script; neither names a Docker Hub image.
    assert json.loads(buildspec)["phases"]["build"]["commands"] == [f"bash -c {shlex.quote(script)}"]
    assert not DOCKER_HUB.search(buildspec) and not DOCKER_HUB.search(script)
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    for text in (code, construct_source, json.dumps(variables)):
        assert {m for m in REGISTRY_HOST.findall(text) if not m.endswith("amazonaws.com")} <= {"nvcr.io"}, text
        assert "public.ecr.aws" not in text and "@sha256:" not in text
    # No builder of its own: no docker-container driver, no image pulled or run by the script itself.
    for command in ("buildx create", "--driver", "docker pull", "docker run"):
        assert command not in code, command
    assert "BUILDKIT_IMAGE" not in variables and not hasattr(build, "BUILDKIT_IMAGE")
    # The build environment is CodeBuild's own managed image (aws/codebuild/...), in privileged mode.
    assert project["Environment"]["Image"] == "aws/codebuild/standard:7.0"
    assert project["Environment"]["PrivilegedMode"] is True
    # The Dockerfiles' base images come from NGC and ECR Public, never Docker Hub.
    for dockerfile in sorted((ROOT / "container").glob("*/Dockerfile")):
        for base in re.findall(r"^ARG \w+_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE):
            assert base.split("/")[0] in ("nvcr.io", "public.ecr.aws"), (dockerfile, base)
        assert not re.search(r"^#\s*syntax=", dockerfile.read_text(), re.MULTILINE)  # no frontend image pulled


def test_image_build_keys_refuse_what_they_cannot_use():
    assert read_settings({}).images == ImageSettings(build="local", ngc_secret=None)
    with pytest.raises(ConfigError, match=r"^context key ngcSecret='ngc': only the cloud build .*imageBuild=cloud"):
        read_settings({"ngcSecret": "ngc"})
    with pytest.raises(ConfigError, match=r"^context key imageBuild='docker': not a known option; allowed: local"):
        read_settings({"imageBuild": "docker"})
    with pytest.raises(ConfigError, match=r"^context key ngcSecret='my key': malformed"):
        read_settings({"imageBuild": "cloud", "ngcSecret": "my key"})


def test_each_image_has_a_wait_condition_new_for_its_content_tag_within_cloudformations_limit():
    t = template()
    digest = content_tag_hash()
    conditions = resources(t, "AWS::CloudFormation::WaitCondition")
    assert sorted(conditions) == [f"IsaaclabImageBuilt{digest}", f"TrainiumImageBuilt{digest}"]
    for logical_id, condition in conditions.items():
        timeout = int(condition["Properties"]["Timeout"])
        # AWS::CloudFormation::WaitCondition Timeout: at most 43200 s; must outlast queue + build.
        assert (build.BUILD_TIMEOUT_MINUTES + build.QUEUED_TIMEOUT_MINUTES) * 60 < timeout <= build.MAX_WAIT_SECONDS
        handle_id = condition["Properties"]["Handle"]["Ref"]
        assert t["Resources"][handle_id]["Type"] == "AWS::CloudFormation::WaitConditionHandle"
        assert digest in handle_id
        (starter_id,) = condition["DependsOn"]
        starter = t["Resources"][starter_id]
        assert starter["Type"] == "Custom::AWS" and digest in starter_id
        create = json.dumps(starter["Properties"]["Create"])
        assert '\\"action\\":\\"startBuild\\"' in create and json.dumps({"Ref": handle_id}) in create
        name = logical_id.removesuffix(f"ImageBuilt{digest}").lower()
        assert f"{name}-{digest}" in create
        # The pins of container/versions.toml reach the build as for the local one.
        pins = " ".join(f"{key}={value}" for key, value in load_versions().build_args(name).items())
        assert pins and f'\\"name\\":\\"BUILD_ARGS\\",\\"value\\":\\"{pins}\\"' in create


def test_build_end_reaches_the_reporter_and_the_starter_may_only_start_this_project():
    t = template()
    project_id = next(iter(resources(t, "AWS::CodeBuild::Project")))
    rule = only(t, "AWS::Events::Rule")["Properties"]
    assert rule["EventPattern"]["detail"]["project-name"] == [{"Ref": project_id}]
    assert set(rule["EventPattern"]["detail"]["build-status"]) == {
        "SUCCEEDED",
        "FAILED",
        "FAULT",
        "STOPPED",
        "TIMED_OUT",
    }
    functions = resources(t, "AWS::Lambda::Function")
    reporter_id = rule["Targets"][0]["Arn"]["Fn::GetAtt"][0]
    assert functions[reporter_id]["Properties"]["Handler"] == "report_build.handler"
    for function in functions.values():
        role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
        assert "ManagedPolicyArns" not in t["Resources"][role_id]["Properties"]
        actions = {a for s in statements(t, role_id) for a in as_list(s["Action"])}
        assert actions - {"logs:CreateLogStream", "logs:PutLogEvents"} in (
            {"codebuild:StartBuild"},
            {"codebuild:BatchGetBuilds"},
        )
    for action in ("codebuild:StartBuild", "codebuild:BatchGetBuilds"):
        granted = [s for role in resources(t, "AWS::IAM::Role") for s in statements(t, role)
                   if action in as_list(s["Action"])]  # fmt: skip
        assert [s["Resource"] for s in granted] == [{"Fn::GetAtt": [project_id, "Arn"]}], action


def job_images(jobs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: r["Properties"]["NodeProperties"]["NodeRangeProperties"][0]["Container"]["Image"]
        for k, r in resources(jobs, "AWS::Batch::JobDefinition").items()
    }


def test_job_definitions_run_the_team_repository_at_the_content_tag():
    digest = content_tag_hash()
    exports = template()["Outputs"]
    for logical_id, image in job_images(template("TrainingJobs")).items():
        parts = image["Fn::Join"][1]
        # The default GPU fleet (g6.12xlarge, L4) runs Isaac Sim: the Isaac Lab image.
        expected = "isaaclab" if logical_id.startswith("Gpu") else "trainium"
        assert parts[-1] == f":{expected}-{digest}"
        imported = {p["Fn::ImportValue"] for p in parts if "Fn::ImportValue" in p} | {
            p["Fn::Select"][1]["Fn::Split"][1]["Fn::ImportValue"] for p in parts if "Fn::Select" in p
        }
        # Only the repository's name and ARN cross the stacks: values that never change.
        assert {n.split(":", 1)[1] for n in imported} <= set(exports)
        stable = ({"Ref": repo_ref()}, {"Fn::GetAtt": [repo_ref(), "Arn"]})
        assert all(exports[n.split(":", 1)[1]]["Value"] in stable for n in imported)


def repo_ref() -> str:
    return next(iter(resources(template(), "AWS::ECR::Repository")))


def test_default_mode_exports_the_same_repository_values():
    # Switching imageBuild back to local must not drop an export the jobs stack imports.
    assert set(synth("default").templates[STACK]["Outputs"]) >= set(template()["Outputs"])


def registry_alone(container_dir: Path = ROOT / "container", **context: str) -> RegistryStack:
    """A cloud-mode registry stack of the gpu fleet alone, in a bare app (no nag, no other stacks)."""
    app = cdk.App(context=FEATURE_FLAGS, outdir=scratch_dir("cdkout-"))
    settings = read_settings({"imageBuild": "cloud", "trainiumInstanceType": "none", **context})
    return RegistryStack(app, STACK, fleets=settings.fleets, images=settings.images,
                         log_retention=retention_days(30), container_dir=container_dir)  # fmt: skip


def registry_tag(container_dir: Path) -> str:
    (image,) = registry_alone(container_dir).images.values()
    assert isinstance(image, build.CloudBuiltImage)
    return image.tag


def test_a_fleet_with_its_own_image_builds_nothing_in_cloud_mode():
    stack = registry_alone(gpuImage="123456789012.dkr.ecr.us-east-1.amazonaws.com/isaaclab-batch:v1")
    assert stack.cloud_build is None and stack.images == {}


@functools.cache
def changed_container() -> Path:
    """A copy of container/ with one byte changed in the launcher's comments."""
    copy = Path(scratch_dir("container-")) / "container"
    shutil.copytree(ROOT / "container", copy, ignore=shutil.ignore_patterns("__pycache__"))
    launcher = copy / "distributed_run.sh"
    text = launcher.read_text()
    assert "# Launch a PyTorch" in text
    launcher.write_text(text.replace("# Launch a PyTorch", "# launch a PyTorch", 1))
    return copy


def test_the_tag_follows_container_content_only():
    digest = content_tag_hash()
    assert HASH.fullmatch(digest)
    unchanged = Path(scratch_dir("container-")) / "container"
    shutil.copytree(ROOT / "container", unchanged, ignore=shutil.ignore_patterns("__pycache__"))
    # Another synth of the same files, from another folder: the same tag.
    assert registry_tag(unchanged) == f"isaaclab-{digest}"
    # One byte changed: a new tag.
    assert registry_tag(changed_container()) not in (f"isaaclab-{digest}", "")


@functools.cache
def replay() -> dict[str, str]:
    """The diff of the deployed (unchanged container/) templates against a synth with one byte changed
    in container/, as the next deploy's `cdk diff --template` would print it, both stacks at once.
    Every path is read from the assemblies here, in this thread, before Node diffs them."""
    before = Path(synth(VARIANT).assembly.directory)
    after = Path(
        synth_with(VARIANTS[VARIANT], container_dir=changed_container(), nag=False, validate=False).assembly.directory
    )
    pairs: list[dict[str, str | None]] = [
        {
            "id": stack,
            "stack": stack,
            "old": str(before / f"{stack}.template.json"),
            "new": str(after / f"{stack}.template.json"),
        }
        for stack in ("TrainingJobs", STACK)
    ]
    return {stack: diff["text"] for stack, diff in diff_templates(pairs).items()}


@pytest.mark.skipif(not CDK.exists(), reason="CDK CLI not installed: run through `make test`")
def test_a_changed_container_updates_the_job_definitions_in_place_and_replaces_nothing_stateful():
    jobs, registry = replay()["TrainingJobs"], replay()[STACK]
    changed = [line for line in jobs.splitlines() if "AWS::Batch::JobDefinition" in line]
    assert changed and all(line.lstrip().startswith("[~]") for line in changed), jobs
    assert "replace" not in jobs.lower(), jobs
    # The registry: a new handle, starter and wait condition per image, the old ones removed; the
    # repository, log groups and project are updated or untouched, never replaced.
    assert "replace" not in registry.lower(), registry
    for sign in ("+", "-"):
        for kind, name in (
            ("AWS::CloudFormation::WaitCondition", "IsaaclabImageBuilt"),
            ("Custom::AWS", "IsaaclabImageBuildStart"),
        ):
            assert re.search(rf"\[{re.escape(sign)}\] {kind} (\S+ )?{name}[0-9a-f]{{64}}", registry), registry
    assert "AWS::ECR::Repository" not in registry and "AWS::Logs::LogGroup" not in registry
