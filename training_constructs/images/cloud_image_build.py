"""Training images built in AWS CodeBuild at deploy time, pushed to the team repository under a
content tag, with the stack waiting for every build (`-c imageBuild=cloud`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from aws_cdk import Acknowledgment, CfnResource, Duration, IgnoreMode, RemovalPolicy, Stack, Validations
from aws_cdk import aws_cloudformation as cfn
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct

from training_constructs.common.nag_names import nag_name
from training_constructs.common.small_functions import depend_on_policy_only, logging_role
from training_constructs.images.build_reporter import report_build
from training_constructs.images.image_versions import VERSIONS_FILE, load_versions

REPORTER_DIR = Path(report_build.__file__).resolve().parent
# BUILD_GENERAL1_2XLARGE: 144 GiB memory, 72 vCPUs, 824 GB SSD, "Docker images up to 100 GB
# uncompressed" (CodeBuild API reference, ProjectEnvironment.computeType). The Isaac Sim base alone is
# 15 GB+ compressed; LARGE and XLARGE document no disk that holds it several times over.
COMPUTE_TYPE = codebuild.ComputeType.X2_LARGE
# TimeoutInMinutes and QueuedTimeoutInMinutes: 5..480 (CodeBuild API, ProjectEnvironment and
# CreateProject). The wait condition must outlast both.
BUILD_TIMEOUT_MINUTES = 240
QUEUED_TIMEOUT_MINUTES = 60
# AWS::CloudFormation::WaitCondition Timeout: at most 43200 s (12 h); a custom resource gives up
# after at most 3600 s (ServiceTimeout), shorter than one Isaac Sim build (README, "Images built in AWS").
WAIT_SECONDS = (QUEUED_TIMEOUT_MINUTES + BUILD_TIMEOUT_MINUTES + 10) * 60
MAX_WAIT_SECONDS = 43200
# CodeBuild's managed image, whose own Docker (BuildKit inside dockerd, privileged mode) builds and
# pushes: no builder image from any registry (build_image.sh says which Docker it ships).
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_image.sh"
# The construct id of the Lambda function that every AwsCustomResource in a stack shares.
AWS_CUSTOM_RESOURCE_SINGLETON = "AWS679f53fac002430cb0da5b7982bd2287"


class CloudBuiltImage:
    """One image the cloud build pushes: its content tag and URI."""

    def __init__(self, *, repository: ecr.IRepository, tag: str) -> None:
        self.tag = tag
        self.image_uri = f"{repository.repository_uri}:{tag}"


class CloudImageBuild(Construct):
    """A CodeBuild project that builds container/ (an S3 asset) and pushes to `repository`; per image a
    starter that starts one build and a wait condition that the build's end signals, both new for each
    content tag. Attributes: `project`, `source`, `content_hash`, `images` (name -> CloudBuiltImage),
    `wait_conditions` (name -> CfnWaitCondition), `log_group`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        repository: ecr.IRepository,
        dockerfiles: Mapping[str, str],
        source_dir: Path,
        ngc_secret: str | None,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        # The same files the Dockerfiles see: .dockerignore decides, as for DockerImageAsset.
        ignore = (source_dir / ".dockerignore").read_text().splitlines()
        self.source = s3_assets.Asset(
            self,
            "Source",
            path=str(source_dir),
            exclude=[line for line in ignore if line.strip() and not line.startswith("#")],
            ignore_mode=IgnoreMode.DOCKER,
        )
        # A hash of the staged files' names and contents, computed at synth: the tag of every image.
        self.content_hash = self.source.asset_hash
        self._versions = load_versions(source_dir / VERSIONS_FILE.name)
        self.log_group = logs.LogGroup(self, "BuildLogs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN)
        variables = {
            "REPOSITORY_URI": codebuild.BuildEnvironmentVariable(value=repository.repository_uri),
            "REPOSITORY_NAME": codebuild.BuildEnvironmentVariable(value=repository.repository_name),
        }
        if ngc_secret:
            variables["NGC_SECRET"] = codebuild.BuildEnvironmentVariable(value=ngc_secret)
            # CodeBuild reads the secret at build start; CDK grants GetSecretValue on that one secret.
            variables["NGC_API_KEY"] = codebuild.BuildEnvironmentVariable(
                value=ngc_secret, type=codebuild.BuildEnvironmentVariableType.SECRETS_MANAGER
            )
        self.project = codebuild.Project(
            self,
            "Project",
            description="Builds the training images from container/ at cdk deploy (imageBuild=cloud)",
            source=codebuild.Source.s3(bucket=self.source.bucket, path=self.source.s3_object_key),
            environment=codebuild.BuildEnvironment(build_image=BUILD_IMAGE, compute_type=COMPUTE_TYPE, privileged=True),
            environment_variables=variables,
            timeout=Duration.minutes(BUILD_TIMEOUT_MINUTES),
            queued_timeout=Duration.minutes(QUEUED_TIMEOUT_MINUTES),
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=self.log_group)),
            build_spec=codebuild.BuildSpec.from_object(
                {
                    "version": "0.2",
                    "env": {"shell": "bash"},
                    # One command: CodeBuild runs it in one bash, so the script's exits end the phase.
                    "phases": {"build": {"commands": [f"bash -c {shlex.quote(BUILD_SCRIPT.read_text())}"]}},
                }
            ),
        )
        repository.grant_pull_push(self.project)
        repository.grant(self.project, "ecr:DescribeImages")

        # Both functions write only to their own log groups (logging_role).
        reporter_logs = logs.LogGroup(
            self, "ReporterLogs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN
        )
        self._reporter_role = logging_role(self, "ReporterRole", reporter_logs)
        # The reporter's fallback when an event lacks the build's variables: read this project's builds.
        self._reporter_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["codebuild:BatchGetBuilds"], resources=[self.project.project_arn])
        )
        self.reporter = lambda_.Function(
            self,
            "Reporter",
            description="Signals the deploy's wait condition when an image build ends",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="report_build.handler",
            code=lambda_.Code.from_asset(str(REPORTER_DIR), exclude=["__pycache__", "*.pyc"]),
            timeout=Duration.minutes(1),
            role=self._reporter_role,
            log_group=reporter_logs,
        )
        self._starter_logs = logs.LogGroup(
            self, "StarterLogs", retention=log_retention, removal_policy=RemovalPolicy.RETAIN
        )
        self._starter_role = logging_role(self, "StarterRole", self._starter_logs)
        self._starter_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["codebuild:StartBuild"], resources=[self.project.project_arn])
        )
        rule = events.Rule(
            self,
            "BuildEnded",
            description="Image builds that ended, for the deploy waiting on them",
            event_pattern=events.EventPattern(
                source=["aws.codebuild"],
                detail_type=["CodeBuild Build State Change"],
                detail={"project-name": [self.project.project_name], "build-status": list(report_build.FINAL_STATUSES)},
            ),
            targets=[targets.LambdaFunction(self.reporter, retry_attempts=8)],
        )

        self.images: dict[str, CloudBuiltImage] = {}
        self.wait_conditions: dict[str, cfn.CfnWaitCondition] = {}
        for name, dockerfile in dockerfiles.items():
            tag = f"{name}-{self.content_hash}"
            self.images[name] = CloudBuiltImage(repository=repository, tag=tag)
            self.wait_conditions[name] = self._wait_for_build(name, tag, dockerfile, rule)
        self._drop_redundant_role_dependencies()
        self._acknowledge()

    def _wait_for_build(self, name: str, tag: str, dockerfile: str, rule: events.Rule) -> cfn.CfnWaitCondition:
        # A wait condition cannot be updated and a handle must not be reused (CloudFormation template
        # reference, AWS::CloudFormation::WaitCondition): logical ids carry the tag, so a new
        # container/ brings a new starter, handle and condition, and the old ones go.
        prefix = name[0].upper() + name[1:]
        build_args = " ".join(f"{key}={value}" for key, value in self._versions.build_args(name).items())
        handle = cfn.CfnWaitConditionHandle(self, f"{prefix}Handle")
        handle.override_logical_id(f"{prefix}ImageHandle{self.content_hash}")
        starter = cr.AwsCustomResource(
            self,
            f"{prefix}Start",
            on_create=cr.AwsSdkCall(
                service="CodeBuild",
                action="startBuild",
                parameters={
                    "projectName": self.project.project_name,
                    "environmentVariablesOverride": [
                        {"name": "IMAGE_TAG", "value": tag, "type": "PLAINTEXT"},
                        {"name": "DOCKERFILE", "value": dockerfile, "type": "PLAINTEXT"},
                        # The pins of container/versions.toml, as for the local build: NAME=value ...
                        {"name": "BUILD_ARGS", "value": build_args, "type": "PLAINTEXT"},
                        {"name": report_build.HANDLE_VARIABLE, "value": handle.ref, "type": "PLAINTEXT"},
                    ],
                },
                physical_resource_id=cr.PhysicalResourceId.from_response("build.id"),
                output_paths=["build.id"],
            ),
            role=self._starter_role,
            log_group=self._starter_logs,
            install_latest_aws_sdk=False,
        )
        resource = starter.node.find_child("Resource").node.default_child
        if not isinstance(resource, CfnResource):
            raise TypeError("AwsCustomResource no longer wraps one CfnResource")
        resource.override_logical_id(f"{prefix}ImageBuildStart{self.content_hash}")
        # The reporter must be in place before the build can end.
        starter.node.add_dependency(rule)
        condition = cfn.CfnWaitCondition(self, f"{prefix}Built", handle=handle.ref, timeout=str(WAIT_SECONDS), count=1)
        condition.override_logical_id(f"{prefix}ImageBuilt{self.content_hash}")
        condition.node.add_dependency(starter)
        return condition

    def _drop_redundant_role_dependencies(self) -> None:
        depend_on_policy_only(self.reporter, self._reporter_role)
        depend_on_policy_only(Stack.of(self).node.find_child(AWS_CUSTOM_RESOURCE_SINGLETON), self._starter_role)

    def _acknowledge(self) -> None:
        Validations.of(self.project).acknowledge(
            Acknowledgment(id="AwsSolutions-CB3", reason="docker build needs privileged mode (CodeBuild user guide)"),
            Acknowledgment(
                id="AwsSolutions-CB4",
                reason="the project has no artifacts; its only output is the image, encrypted at rest by ECR",
            ),
        )
        stack = Stack.of(self)
        project = stack.get_logical_id(self.project.node.default_child)  # type: ignore[arg-type]
        # Literals when the stack is bound to a region (`cdk synth` on a machine with a default
        # region), pseudo parameters otherwise: cdk-nag's finding ids follow the template.
        arn, where = nag_name(stack, f"arn:{stack.partition}"), nag_name(stack, f"{stack.region}:{stack.account}")
        findings = {
            # ECR API reference, GetAuthorizationToken: the action takes no resource; pushes are scoped
            # to the team repository by the statement beside it.
            "Resource::*": "ecr:GetAuthorizationToken only, which has no resource to scope to",
            "Action::s3:GetObject*": "read the container/ source asset object only",
            "Action::s3:GetBucket*": "bucket location of the staging bucket that holds the source asset",
            "Action::s3:List*": "list the source asset key in the staging bucket",
            f"Resource::{arn}:logs:{where}:log-group:/aws/codebuild/<{project}>:*": (
                "CDK's default grant for the project's own CodeBuild log group; builds log to BuildLogs"
            ),
            f"Resource::{arn}:codebuild:{where}:report-group/<{project}>-*": (
                "CDK's default grant for test report groups of this project only"
            ),
        }
        policy = self.project.role.node.find_child("DefaultPolicy")  # type: ignore[union-attr]
        for finding, reason in findings.items():
            Validations.of(policy).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
