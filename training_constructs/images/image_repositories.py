"""The ECR repositories this deployment's training images live in, for roles that pull them."""

from __future__ import annotations

from aws_cdk import DefaultStackSynthesizer, Fn, Stack
from aws_cdk import aws_ecr as ecr
from constructs import Construct


def image_repository_arns(scope: Construct, team_repository: ecr.IRepository) -> list[str]:
    """The team repository (images built in the cloud, or pushed by the team) and the CDK bootstrap's
    container-asset repository, where DockerImageAsset pushes the images built from container/. Its name
    is the default synthesizer's (CDK's DefaultStackSynthesizer, imageAssetsRepositoryName) with this
    app's bootstrap qualifier; an app with another synthesizer would name its own."""
    stack = Stack.of(scope)
    qualifier = getattr(stack.synthesizer, "bootstrap_qualifier", None) or DefaultStackSynthesizer.DEFAULT_QUALIFIER
    name = DefaultStackSynthesizer.DEFAULT_IMAGE_ASSETS_REPOSITORY_NAME.replace("${Qualifier}", qualifier)
    assets = Fn.sub(f"arn:${{AWS::Partition}}:ecr:${{AWS::Region}}:${{AWS::AccountId}}:repository/{name}")
    return [team_repository.repository_arn, assets]
