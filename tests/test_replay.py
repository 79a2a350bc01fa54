"""Replayed deploys: sequences of contexts, each template compared with the one before by the CDK
CLI's own diff engine, the way `cdk diff --template <previous> --no-change-set` would.

Not a SYNTH_FILE on purpose: it synthesizes its own apps (without cdk-nag, which changes no
template) so that it runs on the other xdist worker, beside the subprocess-bound files. Every
context is synthesized once; one Node process diffs every pair (tests/cdk_diff.js), and one real
`cdk diff` call checks that the two agree.

What a step must satisfy, stack by stack in CDK's deploy order (exporting stacks first):
- no subnet, compute environment, job queue, bucket, repository or file system is replaced, and
  no bucket, repository or file system is deleted;
- no export that a deployed stack still imports disappears (CloudFormation refuses that update);
- no subnet or VPC CIDR block is created while another one holds an overlapping CIDR (CloudFormation
  creates a replacement before it deletes the old resource), and the VPC never holds more CIDR
  blocks than its quota, counting the old blocks that are deleted only after the new ones exist.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from app import build_app
from config import limits
from config.context import read_settings
from config.settings import FLEET_ID_SUFFIXES, RESERVED_CONSTRUCT_IDS, fleet_construct_id
from tests.harness import FEATURE_FLAGS, ROOT, scratch_dir
from tests.template_diff import diff_templates

CDK = ROOT / "node_modules" / ".bin" / "cdk"
# Longer than the default limit: the first test pays the module fixtures, a synth of every context and
# one Node process diffing every pair.
pytestmark = pytest.mark.timeout(180)
# Replacing or deleting these fails or loses data.
NEVER_REPLACED = frozenset(
    {
        "AWS::EC2::Subnet",
        "AWS::Batch::ComputeEnvironment",
        "AWS::Batch::JobQueue",
        "AWS::S3::Bucket",
        "AWS::ECR::Repository",
        "AWS::FSx::FileSystem",
    }
)
NEVER_DELETED = frozenset({"AWS::S3::Bucket", "AWS::ECR::Repository", "AWS::FSx::FileSystem"})
REPLACING = ("WILL_REPLACE", "MAY_REPLACE")
MOVED_IN_PLACE = "moved-in-place"


def fleets(**named: dict[str, Any]) -> dict[str, str]:
    return {"fleets": json.dumps(named)}


# The default fleets' names, so that going from the flat keys to per-fleet AZs keeps every fleet.
GPU = {"instanceType": "g6e.48xlarge", "maxNodes": 8}
TRN = {"instanceType": "trn1.32xlarge"}
CONTEXTS: dict[str, dict[str, str]] = {
    "default": {},
    "az-a": {"availabilityZone": "us-east-1a"},
    "az-b": {"availabilityZone": "us-east-1b"},
    "bigger-gpu": {
        "gpuInstanceType": "g6e.48xlarge",
        "gpuNodes": "4",
        "gpuMaxNodes": "8",
        "trainiumNodes": "3",
        "rootVolumeGib": "500",
        "rootVolumeThroughput": "1000",
        "rootVolumeIops": "8000",
    },
    "slurm": {"parallelCluster": "true"},
    "slurm-az-a": {"parallelCluster": "true", "availabilityZone": "us-east-1a"},
    "named-azs": fleets(
        gpu=GPU | {"availabilityZone": "us-east-1a"}, trainium=TRN | {"availabilityZone": "us-east-1b"}
    ),
    # The capacity issue's case: gpu falls back to trainium's AZ, then to a third one.
    "named-azs-fallback": fleets(
        gpu=GPU
        | {
            "availabilityZone": "us-east-1a",
            "fallback": [{"availabilityZone": "us-east-1b"}, {"availabilityZone": "us-east-1c"}],
        },
        trainium=TRN | {"availabilityZone": "us-east-1b"},
    ),
    "gpu-moved": fleets(
        gpu=GPU | {"availabilityZone": "us-east-1c"}, trainium=TRN | {"availabilityZone": "us-east-1b"}
    ),
    "reordered": fleets(
        trainium=TRN | {"availabilityZone": "us-east-1b"}, gpu=GPU | {"availabilityZone": "us-east-1c"}
    ),
    "third-az": fleets(
        gpu=GPU | {"availabilityZone": "us-east-1a"},
        trainium=TRN | {"availabilityZone": "us-east-1b"},
        extra={"instanceType": "g6.12xlarge", "availabilityZone": "us-east-1d"},
    ),
    # Three named AZs, the most config.context allows; then one fleet moved, then two at once.
    "third-az-gpu-moved": fleets(
        gpu=GPU | {"availabilityZone": "us-east-1c"},
        trainium=TRN | {"availabilityZone": "us-east-1b"},
        extra={"instanceType": "g6.12xlarge", "availabilityZone": "us-east-1d"},
    ),
    # Five zones in one layout history: us-east-1 has them (us-west-2 has four, config/availability_zones.json).
    "third-az-two-moved": fleets(
        gpu=GPU | {"availabilityZone": "us-east-1c"},
        trainium=TRN | {"availabilityZone": "us-east-1e"},
        extra={"instanceType": "g6.12xlarge", "availabilityZone": "us-east-1d"},
    ),
}


@dataclass(frozen=True)
class Step:
    context: str
    # Stacks deployed alone (`cdk deploy STACK --exclusively`) before `cdk deploy --all`: the docs'
    # order for a change that truly needs two deploys.
    first: tuple[str, ...] = ()
    # Stacks deleted (`cdk destroy STACK`) before `cdk deploy --all`, the docs' order for moving
    # the Slurm cluster: ParallelCluster cannot move a head node to another subnet.
    destroyed: tuple[str, ...] = ()


# Sequence -> steps; the first step is a fresh deploy. `expect`: changes a step must show, so that a
# sequence cannot pass by changing nothing.
SEQUENCES: dict[str, list[Step]] = {
    "a fleet moves AZ": [Step("named-azs"), Step("gpu-moved")],
    # The primary block, three named AZs and the new AZ's block: the quota of five, for a moment.
    "a fleet moves AZ while three AZs are named": [Step("third-az"), Step("third-az-gpu-moved")],
    "a fleet in a new AZ is added and later removed": [
        Step("named-azs"),
        Step("third-az"),
        # Batch deletes no compute environment a queue still uses, and the old jobs stack imports it.
        Step("named-azs", first=("TrainingJobs",)),
    ],
    "fleets are reordered": [Step("gpu-moved"), Step("reordered")],
    # A fallback placement's compute environment is imported by its queue, like a fleet's.
    "a fallback placement is added and later removed": [
        Step("named-azs"),
        Step("named-azs-fallback"),
        Step("named-azs", first=("TrainingJobs",)),
    ],
    "availabilityZone is set, changed and unset": [Step("default"), Step("az-a"), Step("az-b"), Step("default")],
    "instance type, node counts and root volume change": [Step("default"), Step("bigger-gpu"), Step("default")],
    "ParallelCluster is turned on and then off": [Step("default"), Step("slurm"), Step("default"), Step("slurm")],
    "the Slurm cluster moves to a named AZ": [
        Step("slurm"),
        Step("slurm-az-a", destroyed=("TrainingParallelCluster",)),
        Step("az-a"),
    ],
    "every fleet names its AZ, from the default": [Step("default"), Step("named-azs"), Step("default")],
}
# Orders the docs (deploy and fleets pages) warn against, with what CloudFormation or ParallelCluster would refuse.
REFUSED: dict[str, str] = {
    "a fleet removed in one deploy": "removed while a deployed stack imports it",
    "the Slurm cluster moved in place": "moves the Slurm head node",
    "two fleets move AZ at once while three AZs are named": "6 CIDR blocks at once",
    "a fallback placement removed in one deploy": "removed while a deployed stack imports it",
}
REFUSED_SEQUENCES: dict[str, list[Step]] = {
    "a fleet removed in one deploy": [Step("named-azs"), Step("third-az"), Step("named-azs")],
    "the Slurm cluster moved in place": [Step("slurm"), Step("slurm-az-a")],
    "a fallback placement removed in one deploy": [Step("named-azs"), Step("named-azs-fallback"), Step("named-azs")],
    "two fleets move AZ at once while three AZs are named": [Step("third-az"), Step("third-az-two-moved")],
}
ALL_SEQUENCES = {**SEQUENCES, **REFUSED_SEQUENCES}
EXPECT: dict[tuple[str, int], set[tuple[str, str, str]]] = {
    ("a fleet moves AZ", 1): {
        ("TrainingCompute", "AWS::EC2::Subnet", "WILL_CREATE"),
        ("TrainingCompute", "AWS::EC2::Subnet", "WILL_DESTROY"),
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "WILL_UPDATE"),
    },
    ("a fleet moves AZ while three AZs are named", 1): {
        ("TrainingCompute", "AWS::EC2::VPCCidrBlock", "WILL_CREATE"),
        ("TrainingCompute", "AWS::EC2::VPCCidrBlock", "WILL_DESTROY"),
    },
    ("a fleet in a new AZ is added and later removed", 2): {
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "WILL_DESTROY"),
        ("TrainingCompute", "AWS::EC2::Subnet", "WILL_DESTROY"),
        ("TrainingJobs", "AWS::Batch::JobQueue", "WILL_DESTROY"),
    },
    ("a fallback placement is added and later removed", 1): {
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "WILL_CREATE"),
        ("TrainingJobs", "AWS::Batch::JobQueue", "WILL_CREATE"),
        ("TrainingJobs", "AWS::Lambda::Function", "WILL_CREATE"),
        ("TrainingJobs", "AWS::Batch::JobQueue", "WILL_UPDATE"),
    },
    ("a fallback placement is added and later removed", 2): {
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "WILL_DESTROY"),
        ("TrainingJobs", "AWS::Batch::JobQueue", "WILL_DESTROY"),
        ("TrainingJobs", "AWS::Lambda::Function", "WILL_DESTROY"),
    },
    ("availabilityZone is set, changed and unset", 2): {
        ("TrainingCompute", "AWS::EC2::Subnet", "WILL_CREATE"),
        ("TrainingCompute", "AWS::EC2::Subnet", "WILL_DESTROY"),
    },
    ("instance type, node counts and root volume change", 1): {
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "WILL_UPDATE"),
        ("TrainingCompute", "AWS::EC2::LaunchTemplate", "WILL_UPDATE"),
    },
    ("ParallelCluster is turned on and then off", 1): {
        ("TrainingParallelCluster", "Custom::PclusterCluster", "add"),
    },
    ("the Slurm cluster moves to a named AZ", 1): {
        ("TrainingParallelCluster", "AWS::EC2::Subnet", "WILL_CREATE"),
        ("TrainingParallelCluster", "Custom::PclusterCluster", "add"),
    },
    ("every fleet names its AZ, from the default", 1): {
        ("TrainingCompute", "AWS::EC2::Subnet", "WILL_CREATE"),
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "WILL_UPDATE"),
    },
}


@dataclass(frozen=True)
class Synthed:
    directory: Path
    order: tuple[str, ...]  # CDK's deploy order: every stack after the stacks it depends on
    templates: dict[str, dict[str, Any]]


def _synth(context: dict[str, str]) -> Synthed:
    # Compared, not checked: no cdk-nag and no CDK validation (tests/harness.py says why).
    app = cdk.App(
        context={**FEATURE_FLAGS, **context},
        outdir=scratch_dir("replay-"),
        builtin_cloud_formation_validation=False,
    )
    build_app(app, read_settings(app.node.get_all_context()), cdk.Environment(), nag=False)
    assembly = app.synth()
    stacks = assembly.stacks_recursively  # topologically sorted, dependencies first
    return Synthed(
        Path(assembly.directory), tuple(s.stack_name for s in stacks), {s.stack_name: s.template for s in stacks}
    )


@pytest.fixture(scope="module")
def synthed() -> dict[str, Synthed]:
    return {name: _synth(context) for name, context in CONTEXTS.items()}


def _pair_id(sequence: str, step: int, stack: str) -> str:
    return f"{sequence}|{step}|{stack}"


@pytest.fixture(scope="module")
def diffs(synthed: dict[str, Synthed]) -> dict[str, dict[str, Any]]:
    """Every (sequence, step, stack) diff, against the template that stack last deployed."""
    pairs = []
    for sequence, steps in ALL_SEQUENCES.items():
        deployed: dict[str, tuple[Path, dict[str, Any]]] = {}
        for index, step in enumerate(steps):
            new = synthed[step.context]
            for stack in step.destroyed:
                del deployed[stack]
            for stack in new.order:
                path = new.directory / f"{stack}.template.json"
                old = deployed.get(stack)
                if old is None or old[1] != new.templates[stack]:  # an unchanged template has no diff
                    pair = {"id": _pair_id(sequence, index, stack), "stack": stack, "new": str(path)}
                    pairs.append(pair | {"old": old and str(old[0])})
                deployed[stack] = (path, new.templates[stack])
    # A code change that moves a subnet to another AZ on the same CIDR, as the position-based layout
    # did: the PR comment's test input for a replacement.
    moved = json.loads(json.dumps(synthed["gpu-moved"].templates["TrainingCompute"]))
    subnet = next(k for k in moved["Resources"] if k.startswith("SubnetsUsEast1cSubnet"))
    moved["Resources"][subnet]["Properties"]["AvailabilityZone"] = "us-east-1d"
    moved_path = synthed["gpu-moved"].directory / "moved-in-place.template.json"
    moved_path.write_text(json.dumps(moved))
    old = synthed["gpu-moved"].directory / "TrainingCompute.template.json"
    pairs.append({"id": MOVED_IN_PLACE, "stack": "TrainingCompute", "old": str(old), "new": str(moved_path)})
    return diff_templates(pairs)


def _exports(template: dict[str, Any]) -> set[str]:
    return {o["Export"]["Name"] for o in template.get("Outputs", {}).values() if "Export" in o}


def _imports(value: Any) -> set[str]:
    if isinstance(value, dict):
        if set(value) == {"Fn::ImportValue"} and isinstance(value["Fn::ImportValue"], str):
            return {value["Fn::ImportValue"]}
        return set().union(*(_imports(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_imports(v) for v in value)) if value else set()
    return set()


def _networks(template: dict[str, Any]) -> dict[str, ipaddress.IPv4Network]:
    """Logical id -> CIDR of every subnet, VPC and VPC CIDR block in the template."""
    found = {}
    for key, resource in template.get("Resources", {}).items():
        if resource["Type"] in ("AWS::EC2::Subnet", "AWS::EC2::VPC", "AWS::EC2::VPCCidrBlock"):
            cidr = resource["Properties"]["CidrBlock"]
            assert isinstance(cidr, str), f"{key}: a CIDR computed at deploy time cannot be checked"
            found[key] = ipaddress.ip_network(cidr)
    return found


def _deploy(state: dict[str, dict[str, Any]], stack: str, new: dict[str, Any], created: set[str]) -> list[str]:
    """Deploy one stack over `state` (stack -> deployed template); the problems CloudFormation would
    hit. `created`: the logical ids the diff creates or replaces in this stack."""
    problems = []
    old = state.get(stack, {})
    others = [t for name, t in state.items() if name != stack]
    imported = set().union(*map(_imports, others))
    for name in sorted((_exports(old) - _exports(new)) & imported):
        problems.append(f"{stack}: export {name} removed while a deployed stack imports it")
    for name in sorted(_imports(new) - set().union(*map(_exports, others))):
        problems.append(f"{stack}: imports {name}, which no deployed stack exports")
    # A created (or replacing) subnet or CIDR block exists beside everything deployed, the resource
    # it replaces included. A subnet lies inside a block by design; two subnets or two blocks must
    # not overlap.
    existing = [
        (f"{name}/{key}", t["Resources"][key]["Type"], net)
        for name, t in state.items()
        for key, net in _networks(t).items()
    ]
    for key, net in _networks(new).items():
        if key not in created:
            continue
        is_subnet = new["Resources"][key]["Type"] == "AWS::EC2::Subnet"
        for where, kind, other in existing:
            if (kind == "AWS::EC2::Subnet") == is_subnet and net.overlaps(other):
                problems.append(f"{stack}: creates {key} ({net}) while {where} holds {other}")
    # CloudFormation deletes what a stack drops or replaces in its cleanup phase, after every create:
    # for a moment the VPC holds its primary block, every deployed block and every new one.
    blocks = [k for k in created if new["Resources"][k]["Type"] == "AWS::EC2::VPCCidrBlock"]
    if blocks:
        held = 1 + sum(kind == "AWS::EC2::VPCCidrBlock" for _, kind, _ in existing) + len(blocks)
        if held > limits.VPC_CIDR_BLOCKS:
            problems.append(f"{stack}: {held} CIDR blocks at once, more than the VPC's {limits.VPC_CIDR_BLOCKS}")
    if _head_node_subnet(old) not in (None, _head_node_subnet(new)):
        # ParallelCluster's HeadNode/Networking/SubnetId has UpdatePolicy.UNSUPPORTED
        # (pcluster/schemas/cluster_schema.py): the provider fails the update.
        problems.append(f"{stack}: moves the Slurm head node to another subnet")
    state[stack] = new
    return problems


def _head_node_subnet(template: dict[str, Any]) -> Any:
    for resource in template.get("Resources", {}).values():
        if resource["Type"] == "Custom::PclusterCluster":
            return json.dumps(resource["Properties"]["ClusterConfiguration"]["HeadNode"]["Networking"]["SubnetId"])
    return None


def _changes(diffs: dict[str, dict[str, Any]], sequence: str, index: int) -> list[tuple[str, str, str, str]]:
    found = []
    for key, diff in diffs.items():
        if key.count("|") != 2:
            continue
        name, step, stack = key.split("|")
        if name == sequence and int(step) == index:
            # Custom resources have no CloudFormation impact: their op says what happens.
            found += [
                (stack, c["type"], c["logicalId"], c["impact"] if c["type"].startswith("AWS::") else c["op"])
                for c in diff["changes"]
            ]
    return found


def _replay(sequence: str, synthed: dict[str, Synthed], diffs: dict[str, Any]) -> list[tuple[list[str], set[Any]]]:
    """Per step of `sequence`: the problems CloudFormation would hit, and the changes shown."""
    state: dict[str, dict[str, Any]] = {}
    steps = []
    for index, step in enumerate(ALL_SEQUENCES[sequence]):
        new = synthed[step.context]
        for stack in step.destroyed:
            del state[stack]
        changes = _changes(diffs, sequence, index)
        created = {(stack, key) for stack, _, key, impact in changes if impact in ("WILL_CREATE", *REPLACING)}
        problems = []
        # A stack deployed alone first is unchanged when `cdk deploy --all` reaches it.
        for stack in (*step.first, *(s for s in new.order if s not in step.first)):
            mine = {key for name, key in created if name == stack}
            problems += _deploy(state, stack, new.templates[stack], mine)
        problems += [
            f"{stack}: {impact} of {kind} {key}"
            for stack, kind, key, impact in changes
            if (kind in NEVER_REPLACED and impact in REPLACING) or (kind in NEVER_DELETED and impact == "WILL_DESTROY")
        ]
        steps.append((problems, {(stack, kind, impact) for stack, kind, _, impact in changes}))
    return steps


@pytest.mark.parametrize("sequence", SEQUENCES)
def test_every_redeploy_updates_in_place(sequence: str, synthed: dict[str, Synthed], diffs: dict[str, Any]) -> None:
    for index, (problems, shown) in enumerate(_replay(sequence, synthed, diffs)):
        assert not problems, f"step {index} ({SEQUENCES[sequence][index].context}): " + "; ".join(problems)
        assert EXPECT.get((sequence, index), set()) <= shown, f"step {index}: expected changes missing"


def test_reordering_fleets_only_reorders_the_alert_rules_queues(
    synthed: dict[str, Synthed], diffs: dict[str, Any]
) -> None:
    (_, shown) = _replay("fleets are reordered", synthed, diffs)[1]
    # The dashboard's rows follow the fleets' order.
    assert shown == {
        ("TrainingJobs", "AWS::Events::Rule", "WILL_UPDATE"),
        ("TrainingMonitoring", "AWS::CloudWatch::Dashboard", "WILL_UPDATE"),
    }


@pytest.mark.parametrize("sequence", REFUSED)
def test_the_replay_catches_what_cloudformation_refuses(
    sequence: str, synthed: dict[str, Synthed], diffs: dict[str, Any]
) -> None:
    """The same checks fail where the docs say a change needs another order."""
    *before, (problems, _) = _replay(sequence, synthed, diffs)
    assert not any(p for p, _ in before)
    assert problems and all(REFUSED[sequence] in p for p in problems), problems


def test_the_default_layout_is_kept(synthed: dict[str, Synthed]) -> None:
    """Deployments made before AZ-keyed subnets update in place: the network's subnets keep the
    logical ids and CIDRs that ec2.Vpc gave them for the region's first two AZs."""
    network = synthed["az-a"].templates["TrainingNetwork"]
    cidrs = {k: str(n) for k, n in _networks(network).items()}
    assert cidrs == {
        "NetworkVpc7FB7348F": "10.0.0.0/16",
        "NetworkVpcPublicSubnet1Subnet36933139": "10.0.0.0/24",
        "NetworkVpcPublicSubnet2SubnetC427CCE0": "10.0.1.0/24",
        "NetworkVpcTrainingSubnet1Subnet78795A94": "10.0.64.0/18",
        "NetworkVpcTrainingSubnet2Subnet2155B0E1": "10.0.128.0/18",
    }


def test_the_slurm_cluster_gets_its_own_subnet_in_a_named_az(synthed: dict[str, Synthed]) -> None:
    template = synthed["slurm-az-a"].templates["TrainingParallelCluster"]
    subnets = {k: r["Properties"] for k, r in template["Resources"].items() if r["Type"] == "AWS::EC2::Subnet"}
    ((key, subnet),) = subnets.items()
    assert key.startswith("SubnetsUsEast1a") and subnet["CidrBlock"] == "10.1.64.0/18"
    (cluster,) = (r for r in template["Resources"].values() if r["Type"] == "Custom::PclusterCluster")
    configuration = cluster["Properties"]["ClusterConfiguration"]
    assert configuration["HeadNode"]["Networking"]["SubnetId"] == {"Ref": key}
    assert all(q["Networking"]["SubnetIds"] == [{"Ref": key}] for q in configuration["Scheduling"]["SlurmQueues"])


def test_the_cli_agrees_with_the_in_process_diff(synthed: dict[str, Synthed], diffs: dict[str, Any]) -> None:
    """`cdk diff --app <cdk.out> --template <previous> --no-change-set` on one pair gives the same
    resource lines as tests/cdk_diff.js (the CLI adds construct paths between type and id)."""
    sequence, index, stack = "a fleet moves AZ", 1, "TrainingCompute"
    old = synthed["named-azs"].directory / f"{stack}.template.json"
    command = [str(CDK), "diff", "--app", str(synthed["gpu-moved"].directory), "--template", str(old)]
    command += ["--no-change-set", "--exclusively", "--no-color", stack]
    result = subprocess.run(command, capture_output=True, text=True, cwd=scratch_dir("cli-diff-"), timeout=60)
    line = re.compile(r"^\[(?P<op>[+~-])\] (?P<type>\S+) (?:\S+ )?(?P<id>[A-Za-z0-9]+)(?: (?P<impact>.+))?$")

    def resources(text: str) -> set[tuple[str, ...]]:
        return {m.group("op", "type", "id", "impact") for m in map(line.match, text.splitlines()) if m}

    cli = resources(result.stdout + result.stderr)
    ours = resources(diffs[_pair_id(sequence, index, stack)]["text"])
    assert cli and cli == ours


def test_every_stack_child_that_is_not_a_fleets_is_reserved() -> None:
    """A fleet named like a stack's own child crashes synth; config.context refuses those names from
    RESERVED_CONSTRUCT_IDS. Any child added later by any stack must be listed there, and any id a
    stack derives from a fleet's must be the fleet's id plus one of FLEET_ID_SUFFIXES. The app is built
    with every optional part (Slurm in a named AZ, fair share, alerts), not synthesized."""
    context = {"parallelCluster": "true", "availabilityZone": "us-east-1a", "shares": "a:1"}
    context |= {
        "alertEmail": "ml-oncall@example.com",
        "interfaceEndpoints": "logs",
        "healthCheckSchedule": "rate(1 day)",
    }
    # Fleet names that start no other id, one of each accelerator kind, one in an AZ of its own, one
    # with a fallback placement.
    qa = {"instanceType": "g6.12xlarge", "fallback": [{"availabilityZone": "us-east-1b"}]}
    context |= fleets(qa=qa, qb=TRN | {"availabilityZone": "us-east-1b"})
    # Compared, not checked: no cdk-nag and no CDK validation (tests/harness.py says why).
    app = cdk.App(
        context={**FEATURE_FLAGS, **context},
        outdir=scratch_dir("replay-"),
        builtin_cloud_formation_validation=False,
    )
    build_app(app, read_settings(app.node.get_all_context()), cdk.Environment(), nag=False)
    reserved = {name.lower() for name in RESERVED_CONSTRUCT_IDS}
    fleet_ids = [fleet_construct_id(f) for f in ("qa", "qb")]
    stacks = [s for s in app.node.children if isinstance(s, cdk.Stack)]
    assert len(stacks) == 7
    per_fleet: dict[str, set[str]] = {f: set() for f in fleet_ids}
    for stack in stacks:
        for child in stack.node.children:
            name = child.node.id
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name):
                continue  # CDK's own ids with other characters
            fleet = next((f for f in fleet_ids if name.startswith(f)), None)
            if fleet:
                # config.context refuses fleets whose ids meet from FLEET_ID_SUFFIXES.
                per_fleet[fleet].add(name[len(fleet) :])
                continue
            assert name.lower() in reserved, f"{stack.node.id}/{name} is not in RESERVED_CONSTRUCT_IDS"
    # Every stack-level id a fleet makes is its construct id plus a listed suffix, and every listed
    # suffix is made (so that the list cannot go stale either).
    # Placements: only a fleet with fallback placements has that output.
    assert per_fleet == {"Qa": set(FLEET_ID_SUFFIXES), "Qb": set(FLEET_ID_SUFFIXES) - {"Placements"}}


def _comment_script() -> Any:
    spec = importlib.util.spec_from_file_location("cdk_diff_comment", ROOT / ".github/scripts/cdk_diff_comment.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cdk_diff_comment"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_pr_comment_marks_what_a_fleet_removal_deletes(synthed: dict[str, Synthed], diffs: dict[str, Any]) -> None:
    """The diff comment over a replayed step: the removed fleet's compute environment, queue, subnet
    and export are listed above the diffs and marked."""
    sequence = "a fleet in a new AZ is added and later removed"
    text = "\n\n".join(d["text"] for key, d in diffs.items() if key.startswith(f"{sequence}|2|"))
    script = _comment_script()
    marked = {(r.stack, r.resource_type, r.impact) for r in script.risks(script.parse(text)) if r.danger}
    assert {
        ("TrainingCompute", "AWS::Batch::ComputeEnvironment", "destroy"),
        ("TrainingCompute", "AWS::EC2::Subnet", "destroy"),
        ("TrainingCompute", "Export", "remove"),
        ("TrainingJobs", "AWS::Batch::JobQueue", "destroy"),
    } <= marked
    (subnet,) = [r for r in script.risks(script.parse(text)) if r.resource_type == "AWS::EC2::Subnet"]
    assert "orphaned" in subnet.danger  # a failed cleanup delete does not roll the deploy back
    # Job definitions, roles and launch templates of the removed fleet are listed but not marked.
    unmarked = {r.resource_type for r in script.risks(script.parse(text)) if not r.danger}
    assert {"AWS::Batch::JobDefinition", "AWS::EC2::LaunchTemplate", "AWS::IAM::Role"} <= unmarked
    comment = script.render(script.parse(text))
    assert comment.index("[!CAUTION]") < comment.index("<details>")


def test_pr_comment_marks_a_replaced_subnet(diffs: dict[str, Any]) -> None:
    script = _comment_script()
    text = diffs[MOVED_IN_PLACE]["text"]
    (subnet,) = [r for r in script.risks(script.parse(text)) if r.resource_type == "AWS::EC2::Subnet"]
    assert subnet.impact == "replace" and "collides on the CIDR" in subnet.danger
    assert "| ⛔ | TrainingCompute | `SubnetsUsEast1cSubnet" in script.render(script.parse(text))
