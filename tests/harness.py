"""Synthesizes the app in-process, once per context variant, the way `cdk synth` would.

Every test that looks at templates goes through `synth(variant)`, which caches the result for the
whole session. The app is built by app.build_app with cdk.json's feature flags, so tests see the
same templates and the same cdk-nag checks as the CLI.

Checks and their cost: CloudFormation's own validation (aws-cdk-lib's validation plugin, which
app.py adds only with templateValidation=true, as `make deploy` asks, and as these synths ask; its
engine is made once per process) costs several times the synth itself, growing with the templates' size;
cdk-nag and cfn-lint grow the same way. So every variant gets all three except "all-types", whose
40 fleets repeat 17 template shapes: it is synthesized for its structure only, and "layouts", one
fleet of each shape, gets the checks instead (tests/test_shapes.py proves that every type's fleet
has the shape of its variant's representative).
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk

from app import build_app
from config.catalog import CATALOG, AcceleratorKind
from config.context import read_settings

ROOT = Path(__file__).resolve().parent.parent
FEATURE_FLAGS: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]

EFA_TYPES = tuple(name for name, spec in CATALOG.items() if spec.efa_supported)


def shape_key(instance_type: str) -> tuple[object, ...]:
    """What decides a fleet's template shape, beyond names and figures: accelerator kind, Neuron
    devices (each one mapped; GPUs are a count), EFA interfaces and whether card 0 carries one
    (interfaces, uverbs devices), Isaac Sim (its job definition) and a documented driver minimum
    (its variable), and one GPU against several (no intra-node bandwidth figure to test against)."""
    spec = CATALOG[instance_type]
    return (
        spec.accelerator_kind,
        spec.accelerator_count > 1,
        spec.accelerator_count if spec.accelerator_kind is AcceleratorKind.NEURON else 0,
        spec.max_efa_interfaces,
        spec.card_0_has_efa,
        spec.runs_isaac_sim,
        spec.min_nvidia_driver is not None,
    )


def _first_of_each_shape() -> tuple[str, ...]:
    seen: dict[tuple[object, ...], str] = {}
    for name in EFA_TYPES:
        seen.setdefault(shape_key(name), name)
    return tuple(seen.values())


# One EFA type per template shape: the fleets of the "layouts" variant.
SHAPE_TYPES = _first_of_each_shape()


def fleet_name(instance_type: str) -> str:
    """The fleet that carries `instance_type` in the all-types variant: p5e.48xlarge -> p5e48xlarge."""
    return re.sub(r"[^a-z0-9]", "", instance_type)


# The fleets issue's acceptance case: an RL fleet and an LLM fleet of two GPU types and a Trainium
# fleet, each in its own AZ, with alerts, a shorter RUNNABLE limit and a pinned Neuron AMI. The LLM
# fleet falls back to another AZ, a same-shape type and a Capacity Block (the capacity issue's case).
LLM_FALLBACK = [
    {"availabilityZone": "us-west-2c"},
    {"instanceType": "p5.48xlarge"},
    {
        "availabilityZone": "us-west-2a",
        "capacityReservationId": "cr-0a1b2c3d4e5f60718",
        "capacityReservationType": "capacity-block",
        "start": "2026-12-01T11:30Z",
        "end": "2026-12-08T11:30Z",
    },
]
THREE_FLEETS = {
    # 64 nodes: a fleet whose node-fault breaker trips above the minimum (a tenth of maxNodes: 7).
    "rl": {"instanceType": "g6e.48xlarge", "maxNodes": 64},
    "llm": {"instanceType": "p5e.48xlarge", "nodes": 4, "availabilityZone": "us-west-2b", "fallback": LLM_FALLBACK},
    "trn": {"instanceType": "trn2.48xlarge", "amiId": "ami-0123456789abcdef0", "availabilityZone": "us-west-2c"},
}

# The p5-four-nodes variant's jobSecrets (tests/test_job_secrets_synth.py).
JOB_SECRETS = (
    "arn:aws:secretsmanager:us-west-2:123456789012:secret:wandb-api-key-AbCdEf",
    "arn:aws:ssm:us-west-2:123456789012:parameter/training/hf/*",
)

# Context variants the suite synthesizes. Each is synthesized once per session; cdk-nag and
# cfn-lint run over all of them. Later stacks add the variants that exercise them.
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "pinned-az-endpoints": {
        "availabilityZone": "us-west-2b",
        "interfaceEndpoints": "ecr.api,ecr.dkr,logs,sts",
        "logRetentionDays": "365",
    },
    # ECS Exec turned off shares this synth: nothing in the network depends on it.
    "two-nat": {"natGateways": "2", "ecsExec": "false"},
    "existing-images": {
        # A Docker Hub short name, as Batch takes it (issue 32); a private ECR URI: tests/test_registry.py.
        "gpuImage": "ubuntu:22.04",
        "trainiumImage": "public.ecr.aws/neuron/pytorch-training-neuronx:2.5.1-neuronx-py310-sdk2.21.0-ubuntu22.04",
    },
    "reservations": {
        "gpuCapacityReservationId": "cr-0123456789abcdef0",
        "trainiumCapacityReservationId": "cr-0fedcba9876543210",
        "trainiumCapacityReservationType": "capacity-block",
        "gpuMaxNodes": "10",
        "rootVolumeGib": "500",
        "rootVolumeThroughput": "1000",
        "rootVolumeIops": "8000",
        # Images built in CodeBuild at deploy, with an NGC key (tests/test_cloud_build.py): no
        # compute setting depends on it, so it shares this synth instead of adding one.
        "imageBuild": "cloud",
        "ngcSecret": "ngc-api-key",
    },
    # The jobs issue's acceptance case, with fair shares, timeout and attempts, and a fleet check.
    "p5-four-nodes": {
        "gpuInstanceType": "p5.48xlarge",
        "gpuNodes": "4",
        "shares": "llama:2,vision:1,sweep*:4",
        "jobTimeoutSeconds": "7200",
        "jobAttempts": "5",
        # The fleet check on a fair-share queue goes through EventBridge Scheduler (issue 32).
        "healthCheckSchedule": "rate(12 hours)",
        # Team budgets per share (issue 42), the gpu fleet at a reservation's price.
        "budgets": json.dumps({"llama": 20000, "vision": 5000, "sweep*": 2500}),
        "budgetPrices": json.dumps({"gpu": 40}),
        # Secrets for jobs (issue 52): one secret by its full ARN, a prefix of SSM parameters.
        "jobSecrets": ",".join(JOB_SECRETS),
    },
    # The seed plan's Slurm cluster: 80 x p5e.48xlarge.
    "parallelcluster": {"parallelCluster": "true", "pclusterMaxNodes": "80"},
    # Managed Slurm on AWS PCS: two Slurm fleets (32 and 8 EFA cards) in a named AZ, a pinned AMI.
    # The rest is pinned-az-endpoints, so that its other templates are that variant's (linted once).
    "pcs": {
        "availabilityZone": "us-west-2b",
        "interfaceEndpoints": "ecr.api,ecr.dkr,logs,sts",
        "logRetentionDays": "365",
        "slurm": "pcs",
        "pcsAmiId": "ami-0123456789abcdef0",
        "pcsInstanceType": "p5e.48xlarge,trn1.32xlarge",
        "pcsMaxNodes": "16",
    },
    # Every EFA-capable catalog type, one fleet each, in one synth.
    "all-types": {"fleets": json.dumps({fleet_name(t): {"instanceType": t} for t in EFA_TYPES})},
    "three-fleets": {
        "availabilityZone": "us-west-2a",
        "fleets": json.dumps(THREE_FLEETS),
        "alertEmail": "ml-oncall@example.com",
        "runnableTimeoutMinutes": "30",
        # The health issue's scheduled fleet check, every day at 03:00 UTC.
        "healthCheckSchedule": "cron(0 3 * * ? *)",
    },
    "gpu-only": {"trainiumInstanceType": "none"},
    # One fleet per template shape of "all-types": what cdk-nag, CDK's validation and cfn-lint see.
    "layouts": {"fleets": json.dumps({fleet_name(t): {"instanceType": t} for t in SHAPE_TYPES})},
}
# Variants synthesized for their structure only (no cdk-nag, no CDK validation, no cfn-lint).
STRUCTURE_ONLY = frozenset({"all-types"})
CHECKED_VARIANTS = tuple(sorted(set(VARIANTS) - STRUCTURE_ONLY))

_HASH = re.compile(r"[0-9a-f]{64}")
# The node's files packed into user data (one gzip stream, then base64: "H4sI..."). The compressed bytes
# depend on the machine's zlib build, so snapshots keep a placeholder; node_files() reads the real ones.
_PACKED = re.compile(r"H4sI[A-Za-z0-9+/]{100,}={0,2}")
# The one command that writes them (training_constructs/common/node_files.py): python3 -c '<splitter>' '<bundle>'.
_BUNDLE_COMMAND = re.compile(r"^python3 -c '[^']*' '(H4sI[A-Za-z0-9+/=]+)'$", re.MULTILINE)


@dataclass(frozen=True)
class Synth:
    app: cdk.App
    assembly: cdk.cx_api.CloudAssembly
    templates: dict[str, dict[str, Any]]
    manifest: dict[str, Any]


def scratch_dir(prefix: str) -> str:
    """A new folder in the session's scratch folder (TMPDIR, set and removed by tests/conftest.py)."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR"))


def build(
    context: dict[str, str], env: cdk.Environment | None = None, *, validate: bool = True, **options: Any
) -> cdk.App:
    """An app with every stack added but not yet synthesized; `options` go to app.build_app.
    `validate=False` leaves out CloudFormation's validation, for synths that are only compared or
    read (templates are the same either way)."""
    # Validation as `make deploy` runs it: CDK's built-in instance off (as in app.main), and the
    # templateValidation key adding app.py's one plugin. (The built-in one also obeys CDK_VALIDATION=false,
    # which would leave the checked variants unchecked without a word.)
    app = cdk.App(
        context={**FEATURE_FLAGS, **context, **({"templateValidation": "true"} if validate else {})},
        outdir=scratch_dir("cdkout-"),
        builtin_cloud_formation_validation=False,
    )
    env = env or cdk.Environment()
    build_app(app, read_settings(app.node.get_all_context(), region=env.region), env, **options)
    return app


def _synth(app: cdk.App) -> Synth:
    assembly = app.synth()
    templates = {stack.stack_name: stack.template for stack in assembly.stacks}
    manifest = json.loads((Path(assembly.directory) / "manifest.json").read_text())
    return Synth(app, assembly, templates, manifest)


@functools.cache
def synth(variant: str) -> Synth:
    checked = variant not in STRUCTURE_ONLY
    return _synth(build(VARIANTS[variant], validate=checked, nag=checked))


def synth_with(context: dict[str, str], env: cdk.Environment | None = None, **options: Any) -> Synth:
    """An uncached synth for one-off contexts (options: `validate`, and app.build_app's
    container_dir and nag)."""
    return _synth(build(context, env, **options))


def scrub(value: Any) -> Any:
    """Replace every 64-hex asset hash and every packed script, wherever they appear, so snapshots
    survive asset changes."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return _PACKED.sub("<packed-files>", _HASH.sub("<asset-hash>", value))
    return value


def bundle_command(script: str) -> str:
    """The user-data script's one command that writes the node's files."""
    (match,) = _BUNDLE_COMMAND.finditer(script)
    return match.group(0)


def node_files(script: str) -> dict[str, bytes]:
    """The files the user-data script writes onto the node, by path, read from its bundle (a JSON header
    line of [path, size] pairs, then the files' bytes in that order) independently of the node's splitter."""
    (blob,) = _BUNDLE_COMMAND.findall(script)
    header, data = gzip.decompress(base64.b64decode(blob, validate=True)).split(b"\n", 1)
    entries = json.loads(header)
    files = {}
    for path, size in entries:
        files[path], data = data[:size], data[size:]
        assert len(files[path]) == size, f"{path}: the bundle ends early"
    assert len(files) == len(entries) and not data, "paths repeat or bytes are left over"
    return files


def resources(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == resource_type}


def pulls_only_this_deployments_images(statements: list[dict[str, Any]]) -> bool:
    """Whether the ECR pull statement among `statements` names exactly the team repository (the registry
    stack's export) and the CDK bootstrap's container-asset repository: no other repository of the account."""
    pulls = [s for s in statements if "ecr:BatchGetImage" in s["Action"]]
    if len(pulls) != 1 or not isinstance(pulls[0]["Resource"], list) or len(pulls[0]["Resource"]) != 2:
        return False
    team, assets = (json.dumps(r) for r in pulls[0]["Resource"])
    return (
        '"Fn::ImportValue": "TrainingRegistry:ExportsOutputFnGetAttTeamImages' in team
        and assets.startswith('{"Fn::Sub": "arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/')
        and "container-assets-${AWS::AccountId}-${AWS::Region}" in assets
        and "*" not in team + assets
    )
