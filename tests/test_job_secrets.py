"""A job's secrets (issue 52, item 5): `--secret` / `secrets:` go into the job's revision as Batch `secrets`
with the deployment's execution role, so DescribeJobs and DescribeJobDefinitions show the ARNs and never a
value; env names that look like a secret's are refused; the rehearsal takes secrets from trainctl's own
environment. Against moto on 127.0.0.1 (tests/trainctl_world.py), plus the pure rules."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from config.context import ConfigError, read_settings
from config.job_secrets import covers, secret_word
from tests.trainctl_world import ACCOUNT, World, moto_environment, served_world
from trainctl.cli import app
from trainctl.errors import ExitCode, TrainctlError
from trainctl.rehearsal.app_code import spec_from_request
from trainctl.rehearsal.definition import job_spec, secret_values
from trainctl.submitting.revisions import node_properties
from trainctl.submitting.taskfile import Task, make_task

ROLE = f"arn:aws:iam::{ACCOUNT}:role/training-job-execution"
SECRETS_PREFIX = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:"
HF_VALUE = "hf_s3cr3t_never_shown"
WANDB_VALUE = "wandb-s3cr3t-never-shown"


def set_outputs(world: World, extra: dict[str, str], *, drop: tuple[str, ...] = ()) -> None:
    """The jobs stack's outputs with `extra` added and `drop` left out (moto's UpdateStack re-reads them)."""
    cloudformation = world.client("cloudformation")
    (stack,) = cloudformation.describe_stacks(StackName="TrainingJobs")["Stacks"]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"] if o["OutputKey"] not in drop} | extra
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cloudformation.update_stack(StackName="TrainingJobs", TemplateBody=json.dumps(template))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """A deployment with jobSecrets: its execution role, the wandb secret by prefix and the hf secret exactly."""
    with served_world() as world:
        manager = world.client("secretsmanager")
        world.secrets = {  # type: ignore[attr-defined]
            "hf": manager.create_secret(Name="hf-token", SecretString=HF_VALUE)["ARN"],
            "wandb": manager.create_secret(Name="wandb", SecretString=json.dumps({"api_key": WANDB_VALUE}))["ARN"],
        }
        allowed = f"{world.secrets['hf']},{SECRETS_PREFIX}wandb-*"  # type: ignore[attr-defined]
        set_outputs(world, {"JobExecutionRole": ROLE, "JobSecrets": allowed})
        yield world


@pytest.fixture
def trainctl(world: World) -> Any:
    runner = CliRunner()

    def run(*args: str, env: dict[str, str | None] | None = None) -> Any:
        return runner.invoke(app, list(args), env={**moto_environment(world.endpoint), **(env or {})})

    return run


def one_error_line(result: Any, code: ExitCode) -> str:
    assert result.exit_code == code, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("trainctl: ") and "Traceback" not in result.output and len(line) <= 200, line
    return str(line)


def revisions(world: World) -> list[dict[str, Any]]:
    pages = world.client("batch").get_paginator("describe_job_definitions")
    return [d for p in pages.paginate(jobDefinitionName="gpu-training-trainctl") for d in p["jobDefinitions"]]


# ---------------------------------------------------------------------------------------------- on moto
def test_a_secret_reaches_the_revision_as_its_arn_and_never_shows_in_describe_jobs(world: World, trainctl: Any) -> None:
    hf, wandb = world.secrets["hf"], world.secrets["wandb"]  # type: ignore[attr-defined]
    result = trainctl(
        "--json", "submit", "gpu", "--env", "TASK=Isaac-Velocity-Flat-H1-v0", "--secret", f"HF_TOKEN={hf}",
        "--secret", f"WANDB_API_KEY={wandb}:api_key::",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["jobId"]
    batch = world.client("batch")

    (job,) = batch.describe_jobs(jobs=[job_id])["jobs"]
    (revision,) = batch.describe_job_definitions(jobDefinitions=[job["jobDefinition"]])["jobDefinitions"]
    shown = json.dumps(job) + json.dumps(revision)
    assert HF_VALUE not in shown and WANDB_VALUE not in shown
    (node_range,) = revision["nodeProperties"]["nodeRangeProperties"]
    container = node_range["container"]
    assert container["secrets"] == [
        {"name": "HF_TOKEN", "valueFrom": hf},
        {"name": "WANDB_API_KEY", "valueFrom": f"{wandb}:api_key::"},
    ]
    assert container["executionRoleArn"] == ROLE
    variables = {e["name"]: e["value"] for e in container["environment"]}
    assert variables["TASK"] == "Isaac-Velocity-Flat-H1-v0"
    assert "HF_TOKEN" not in variables and "WANDB_API_KEY" not in variables

    # The control: the same token as a value (taken with --allow-env-secrets) is there for anyone to read.
    control = trainctl("--json", "submit", "gpu", "--env", f"HF_TOKEN={HF_VALUE}", "--allow-env-secrets")
    assert control.exit_code == 0, control.output
    (exposed,) = batch.describe_jobs(jobs=[json.loads(control.stdout)["jobId"]])["jobs"]
    described = batch.describe_job_definitions(jobDefinitions=[exposed["jobDefinition"]])
    assert HF_VALUE in json.dumps(described)


def test_a_task_files_secrets_go_into_its_revision_and_the_dry_run_names_no_value(
    world: World, trainctl: Any, tmp_path: Path
) -> None:
    hf = world.secrets["hf"]  # type: ignore[attr-defined]
    task = tmp_path / "task.yaml"
    task.write_text(f"fleet: gpu\ncommand: train.py --lr 1\nsecrets:\n  HF_TOKEN: {hf}\n")

    dry = trainctl("run", str(task), "--dry-run")
    assert dry.exit_code == 0, dry.output
    request = json.loads(dry.stdout)
    # SubmitJob cannot carry secrets (API ContainerOverrides): only the revision, named here, does.
    assert "secret" not in json.dumps(request.get("nodeOverrides", {})).lower()
    assert "secrets" in request["jobDefinition"]

    before = len(revisions(world))
    submitted = trainctl("--json", "run", str(task))
    assert submitted.exit_code == 0, submitted.output
    (job,) = world.client("batch").describe_jobs(jobs=[json.loads(submitted.stdout)["jobId"]])["jobs"]
    (revision,) = [r for r in revisions(world) if r["jobDefinitionArn"] == job["jobDefinition"]]
    assert revision["nodeProperties"]["nodeRangeProperties"][0]["container"]["secrets"] == [
        {"name": "HF_TOKEN", "valueFrom": hf}
    ]
    assert len(revisions(world)) == before + 1


def test_a_secret_the_deployment_does_not_allow_is_refused_before_any_revision(world: World, trainctl: Any) -> None:
    other = f"{SECRETS_PREFIX}someone-elses-AbCdEf"
    before = len(revisions(world))
    line = one_error_line(trainctl("submit", "gpu", "--secret", f"HF_TOKEN={other}"), ExitCode.USAGE)
    assert other in line and "jobSecrets" in line
    assert len(revisions(world)) == before


def test_a_deployment_without_job_secrets_refuses_secrets_naming_the_key(world: World, trainctl: Any) -> None:
    hf = world.secrets["hf"]  # type: ignore[attr-defined]
    kept = {"JobExecutionRole": ROLE, "JobSecrets": f"{hf},{SECRETS_PREFIX}wandb-*"}
    set_outputs(world, {}, drop=tuple(kept))
    try:
        line = one_error_line(trainctl("submit", "gpu", "--secret", f"HF_TOKEN={hf}", "--dry-run"), ExitCode.USAGE)
    finally:
        set_outputs(world, kept)
    assert "-c jobSecrets=" in line


def test_env_names_that_look_like_secrets_are_refused_before_any_aws_call(trainctl: Any, tmp_path: Path) -> None:
    # Nothing listens on port 9: had trainctl asked AWS first, it would exit 3, not 2.
    offline = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    env_file = tmp_path / "job.env"
    env_file.write_text("LR=0.1\nWANDB_API_KEY=abc\n")
    hf = f"{SECRETS_PREFIX}hf-AbCdEf"
    for args, says in (
        (("submit", "gpu", "--env", "HF_TOKEN=abc"), "--env HF_TOKEN: named like a secret (TOKEN)"),
        (("submit", "gpu", "--env-file", str(env_file)), "--env-file job.env: WANDB_API_KEY: named like a secret"),
        (("sweep", "gpu", "--grid", "DB_PASSWORD=a,b"), "--grid DB_PASSWORD"),
        (("submit", "gpu", "--secret", "HF_TOKEN=hf-token"), "HF_TOKEN: 'hf-token' is not arn:aws:secretsmanager:"),
        (("submit", "gpu", "--secret", f"AWS_BATCH_X={hf}"), "reserved for Batch"),
        (("submit", "gpu", "--secret", f"H={hf}", "--secret", f"H={hf}"), "--secret H is given twice"),
        (("submit", "gpu", "--env", "H=1", "--secret", f"H={hf}"), "--secret H is also an environment variable"),
    ):
        line = one_error_line(trainctl(*args, env=offline), ExitCode.USAGE)
        assert says in line, (args, line)
    # A name that only contains a marker passes the check and goes on to AWS (exit 3 here, offline).
    passed = trainctl("submit", "gpu", "--env", "TOKENIZERS_PARALLELISM=false", "--dry-run", env=offline)
    assert passed.exit_code == ExitCode.AWS, passed.output


def test_task_file_refusals_name_the_field(trainctl: Any, tmp_path: Path) -> None:
    offline = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    hf = f"{SECRETS_PREFIX}hf-AbCdEf"
    task = tmp_path / "task.yaml"
    for body, says in (
        ("env: {HF_TOKEN: abc}", "field env.HF_TOKEN: named like a secret (TOKEN)"),
        (f"env: {{HF_TOKEN: abc}}\nsecrets: {{HF_TOKEN: '{hf}'}}", "field secrets: HF_TOKEN is also in env"),
        ("secrets: {HF_TOKEN: arn:aws:s3:::bucket}", "secrets.HF_TOKEN: 'arn:aws:s3:::bucket' is not arn:aws:"),
        ("secret: {HF_TOKEN: x}", "field secret: unknown (did you mean 'secrets'?)"),
    ):
        task.write_text(f"fleet: gpu\n{body}\n")
        line = one_error_line(trainctl("run", str(task), env=offline), ExitCode.USAGE)
        assert says in line, (body, line)
    # The file's own allow_env_secrets, and the flag, both take such a name (then AWS is asked: exit 3).
    task.write_text("fleet: gpu\nenv: {HF_TOKEN: abc}\nallow_env_secrets: true\n")
    assert trainctl("run", str(task), "--dry-run", env=offline).exit_code == ExitCode.AWS
    task.write_text("fleet: gpu\nenv: {HF_TOKEN: abc}\n")
    assert trainctl("run", str(task), "--allow-env-secrets", "--dry-run", env=offline).exit_code == ExitCode.AWS
    # An --env-file name the task file takes as a secret.
    env_file = tmp_path / "job.env"
    env_file.write_text("H=1\n")
    task.write_text(f"fleet: gpu\nsecrets: {{H: '{hf}'}}\n")
    line = one_error_line(trainctl("run", str(task), "--env-file", str(env_file), env=offline), ExitCode.USAGE)
    assert "secret H is also an environment variable" in line


def test_the_secrets_the_jobs_page_shows_are_taken() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "jobs.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "secrets:" in b]
    shown = [yaml.safe_load(b)["secrets"] for b in blocks]
    assert len(shown) == 2 and sum(len(s) for s in shown) == 4
    for secrets in shown:
        assert make_task({"fleet": "gpu", "secrets": secrets}, where="").secrets == secrets


# ------------------------------------------------------------------------------------------ pure rules
@pytest.mark.parametrize(
    ("name", "word"),
    [
        ("HF_TOKEN", "TOKEN"),
        ("WANDB_API_KEY", "KEY"),
        ("AWS_SECRET_ACCESS_KEY", "SECRET"),
        ("DB_PASSWORD", "PASSWORD"),
        ("GITHUBTOKEN", "TOKEN"),
        ("wandbApiKey", "KEY"),
        ("TOKENIZERS_PARALLELISM", None),
        ("MAX_TOKENS", None),
        ("KEYBOARD_LAYOUT", None),
        ("NUM_KEYS", None),
        ("MAX_ITERATIONS", None),
    ],
)
def test_which_env_names_look_like_secrets(name: str, word: str | None) -> None:
    assert secret_word(name) == word


def test_a_prefix_covers_what_iam_would_match_and_an_arn_only_itself() -> None:
    assert covers(f"{SECRETS_PREFIX}wandb-*", f"{SECRETS_PREFIX}wandb-AbCdEf")
    assert not covers(f"{SECRETS_PREFIX}wandb-*", f"{SECRETS_PREFIX}hf-AbCdEf")
    assert covers(f"{SECRETS_PREFIX}hf-AbCdEf", f"{SECRETS_PREFIX}hf-AbCdEf")
    assert not covers(f"{SECRETS_PREFIX}hf-AbCdEf", f"{SECRETS_PREFIX}hf-AbCdEf2")


DEFINITION: dict[str, Any] = {
    "jobDefinitionArn": "arn:aws:batch:us-east-1:123456789012:job-definition/gpu-training:3",
    "jobDefinitionName": "gpu-training",
    "nodeProperties": {
        "numNodes": 2,
        "mainNode": 0,
        "nodeRangeProperties": [
            {
                "targetNodes": "0:",
                "container": {
                    "command": ["train.py"],
                    "environment": [{"name": "TRAINING_FLEET", "value": "gpu"}, {"name": "HF_TOKEN", "value": "x"}],
                    "executionRoleArn": ROLE,
                },
            }
        ],
    },
}


def test_the_revision_carries_the_secrets_and_the_role_and_drops_a_variable_a_secret_replaces() -> None:
    hf = f"{SECRETS_PREFIX}hf-AbCdEf"
    other_role = f"arn:aws:iam::{ACCOUNT}:role/other"
    properties = node_properties(DEFINITION, secrets={"HF_TOKEN": hf}, execution_role=other_role)
    (node_range,) = properties["nodeRangeProperties"]
    container = node_range["container"]
    assert container["secrets"] == [{"name": "HF_TOKEN", "valueFrom": hf}]
    assert container["executionRoleArn"] == other_role
    assert container["environment"] == [{"name": "TRAINING_FLEET", "value": "gpu"}]
    # The deployed definition is left as it was.
    assert "secrets" not in DEFINITION["nodeProperties"]["nodeRangeProperties"][0]["container"]


# ----------------------------------------------------------------------------------------- the context
def test_job_secrets_are_read_as_arns_and_a_bad_entry_is_one_line_naming_the_key() -> None:
    hf = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-AbCdEf"
    prefix = "arn:aws-cn:ssm:cn-north-1:123456789012:parameter/training/*"
    assert read_settings({}).jobs.job_secrets == ()
    assert read_settings({"jobSecrets": f"{hf}, {prefix},{hf}"}).jobs.job_secrets == (hf, prefix)
    # cdk.json may give a JSON list.
    assert read_settings({"jobSecrets": [hf, prefix]}).jobs.job_secrets == (hf, prefix)
    for bad in ("*", "arn:aws:secretsmanager:*:123456789012:secret:hf", "arn:aws:s3:::bucket", f"{hf}*x"):
        with pytest.raises(ConfigError) as refused:
            read_settings({"jobSecrets": bad})
        (line,) = str(refused.value).splitlines()
        assert line.startswith("context key jobSecrets=") and "not a secret or parameter ARN" in line


# ----------------------------------------------------------------------------------------- the rehearsal
def rehearsal_definition(*, role: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"command": ["train.py"], "environment": [{"name": "TRAINING_FLEET", "value": "g"}]}
    if role:
        container["executionRoleArn"] = "rehearsal-jobsecretsexecutionrole-arn"
    return {"nodeProperties": {"numNodes": 2, "mainNode": 0, "nodeRangeProperties": [{"container": container}]}}


def test_the_rehearsal_takes_each_secret_from_trainctls_environment_or_refuses_naming_it() -> None:
    task = Task(fleet="gpu", secrets={"HF_TOKEN": f"{SECRETS_PREFIX}hf-AbCdEf"})
    definition = rehearsal_definition(role=True)
    assert secret_values(task, definition, {"HF_TOKEN": "local", "OTHER": "x"}, source="cdk.out/Gpu") == {
        "HF_TOKEN": "local"
    }
    with pytest.raises(TrainctlError, match=r"^secret HF_TOKEN: .*export HF_TOKEN"):
        secret_values(task, definition, {}, source="cdk.out/Gpu")
    with pytest.raises(TrainctlError, match=r"^secrets: cdk.out/Gpu names no execution role.*jobSecrets"):
        secret_values(task, rehearsal_definition(role=False), {"HF_TOKEN": "local"}, source="cdk.out/Gpu")
    assert secret_values(Task(fleet="gpu"), rehearsal_definition(role=False), {}, source="cdk.out/Gpu") == {}


def test_a_rehearsed_job_resubmitted_by_the_capacity_fallback_keeps_its_secrets() -> None:
    task = Task(fleet="gpu", secrets={"HF_TOKEN": f"{SECRETS_PREFIX}hf-AbCdEf"})
    spec = job_spec(rehearsal_definition(role=True), fleet="gpu", source="cdk.out/Gpu", task=task, name="job")
    local = "value-from-the-shell"
    spec = dataclasses.replace(spec, secret_values={"HF_TOKEN": local})
    again = spec_from_request(spec, {"jobName": "job-again", "nodeOverrides": {"numNodes": 2}})
    assert again.environment["HF_TOKEN"] == local
    # What DescribeJobs shows in the rehearsal stays without the value.
    assert "HF_TOKEN" not in spec.registered.environment and local not in repr(spec)


def test_a_rehearsed_nodes_environment_has_the_secret_from_trainctls_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in node of tests/test_rehearsal.py records its environment; no torch, no launcher."""
    from tests.test_rehearsal import STUB, definition, env_of
    from trainctl.rehearsal.session import Options, rehearse

    records = tmp_path / "records"
    records.mkdir()
    local = "value-exported-in-the-shell"
    monkeypatch.setenv("HF_TOKEN", local)
    job = definition(nodes=1)
    job["nodeProperties"]["nodeRangeProperties"][0]["container"]["executionRoleArn"] = ROLE
    task = make_task(
        {"fleet": "gpu", "command": ["sh", str(STUB)], "launcher": False,
         "env": {"STUB_DIR": str(records)}, "secrets": {"HF_TOKEN": f"{SECRETS_PREFIX}hf-AbCdEf"}},
        where="test: ",
    )  # fmt: skip
    options = Options(nodes=1, deadline_seconds=60, definition=job, definition_source="test definition")
    report = rehearse(task, assembly=tmp_path / "no-cdk-out", options=options)

    assert report["as_expected"], report
    assert env_of(tmp_path, 0)["HF_TOKEN"] == local
    assert local not in json.dumps(report)
