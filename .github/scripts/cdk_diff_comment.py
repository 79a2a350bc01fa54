"""Turn `cdk diff --no-color` output into one pull-request comment (Markdown on stdout).

    python cdk_diff_comment.py cdk-diff.txt > comment.md

The first line is a marker the workflow uses to find and update its earlier comment. Every resource
the change would replace, destroy or orphan, and every export it would remove, is listed first;
the ones whose replacement fails or loses data are marked (subnets, compute environments, job
queues, buckets, repositories, file systems, log groups, exports that another stack may import).
Each stack's full diff follows in a collapsed section.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

MARKER = "<!-- cdk-diff-comment -->"
# Resource types that hold data: replacing or deleting one loses it (or, when retained, leaves it
# behind outside the stack).
STATEFUL_TYPES = frozenset(
    {
        "AWS::S3::Bucket",
        "AWS::ECR::Repository",
        "AWS::FSx::FileSystem",
        "AWS::FSx::DataRepositoryAssociation",
        "AWS::EFS::FileSystem",
        "AWS::Logs::LogGroup",
        "AWS::DynamoDB::Table",
        "AWS::RDS::DBInstance",
        "AWS::RDS::DBCluster",
        "AWS::KMS::Key",
        "Custom::PclusterCluster",
    }
)
# Replacing or deleting these fails while they are in use, or drops work: (on replacement, on deletion).
# CloudFormation creates a replacement before it deletes the old resource.
FAILS_WHEN_REPLACED = {
    "AWS::EC2::Subnet": (
        "the new subnet is created first and collides on the CIDR",
        # Deletes run in the cleanup phase: a failed one leaves the update UPDATE_COMPLETE and the
        # subnet orphaned (CloudFormation User Guide, Troubleshooting, "Resource removed from stack
        # but not deleted").
        "left orphaned, outside any stack, while instances still have interfaces in it: drain first (docs/fleets.md)",
    ),
    "AWS::EC2::VPCCidrBlock": (
        "the new block is associated first and overlaps",
        "left orphaned while a subnet uses it; the AZ's block cannot be created again until it is removed",
    ),
    "AWS::Batch::ComputeEnvironment": (
        "new ARN; queues that use the old one block its deletion",
        "fails while a job queue uses it: deploy TrainingJobs first (docs/fleets.md)",
    ),
    "AWS::Batch::JobQueue": ("new ARN; jobs in the old queue are lost", "jobs still in the queue are lost"),
}
EXPORT_DANGER = "fails while a deployed stack still imports it (CDK deploys this stack first)"
STATEFUL_DANGER = "holds data: the new one starts empty, or the old one is left behind"
# At most this many rows in the summary: dangerous ones first; the diffs below have the rest.
MAX_ROWS = 40
# How `cdk diff` words the impact of a resource change, at the end of its line.
RISKY_IMPACTS = ("may be replaced", "replace", "destroy", "orphan")
# GitHub refuses comments over 65,536 characters. The whole comment stays below this, with room
# to spare for the truncation notes; the largest stack diffs are cut first.
MAX_COMMENT_CHARS = 60_000

_STACK = re.compile(r"^Stack (\S+)")
_RESOURCE = re.compile(r"^\[(?P<op>[+~-])\] (?P<type>(?:AWS|Custom)::\S+) (?P<rest>.+)$")
_REMOVED_OUTPUT = re.compile(r"^\[-\] Output (?P<name>[^\s:]+): (?P<body>.*)$")


@dataclass
class StackDiff:
    name: str
    lines: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(_RESOURCE.match(line) for line in self.lines)


@dataclass(frozen=True)
class Risk:
    """A resource or export the change replaces or removes; `danger` says why that fails or loses
    data, empty when it does neither."""

    stack: str
    resource_type: str
    resource: str
    impact: str
    danger: str = ""


def parse(text: str) -> list[StackDiff]:
    stacks: list[StackDiff] = []
    for line in text.splitlines():
        match = _STACK.match(line)
        if match:
            stacks.append(StackDiff(match.group(1)))
        elif stacks:
            stacks[-1].lines.append(line)
    return stacks


def risks(stacks: list[StackDiff]) -> list[Risk]:
    """Every replaced, destroyed or orphaned resource and every removed export, dangerous first."""
    found = []
    for stack in stacks:
        for line in stack.lines:
            output = _REMOVED_OUTPUT.match(line.strip())
            if output and '"Export"' in output["body"]:
                found.append(Risk(stack.name, "Export", output["name"], "remove", EXPORT_DANGER))
            match = _RESOURCE.match(line.strip())
            if not match:
                continue
            rest = match["rest"]
            impact = next((i for i in RISKY_IMPACTS if rest.endswith(f" {i}")), None)
            if impact is None and match["op"] == "-":
                impact = "destroy"
            if impact:
                resource = rest[: -len(impact)].strip() if rest.endswith(impact) else rest
                kind = match["type"]
                danger = STATEFUL_DANGER if kind in STATEFUL_TYPES else ""
                if kind in FAILS_WHEN_REPLACED:
                    danger = FAILS_WHEN_REPLACED[kind][0 if "replace" in impact else 1]
                found.append(Risk(stack.name, kind, resource, impact, danger))
    return sorted(found, key=lambda r: not r.danger)


def summary(at_risk: list[Risk]) -> list[str]:
    """The table above the diffs: what is replaced or removed, the dangerous rows marked."""
    if not at_risk:
        return []
    dangerous = sum(1 for r in at_risk if r.danger)
    if dangerous:
        head = [
            "> [!CAUTION]",
            f"> **{dangerous} of {len(at_risk)} replaced or removed resource(s) fail or lose data (marked ⛔).** "
            "Check each before merging; docs/fleets.md, Changing a deployed fleet, has the order that works.",
        ]
    else:
        head = ["> [!NOTE]", f"> {len(at_risk)} resource(s) replaced or removed; none holds data or blocks the deploy."]
    rows = [
        f"| {'⛔' if r.danger else ''} | {r.stack} | `{r.resource}` | `{r.resource_type}` | "
        f"{f'**{r.impact}**' if r.danger else r.impact} | {r.danger} |"
        for r in at_risk[:MAX_ROWS]
    ]
    if len(at_risk) > MAX_ROWS:
        rows.append(f"| | | {len(at_risk) - MAX_ROWS} more in the diffs below | | | |")
    return [
        *head,
        "",
        "| | stack | resource | type | change | why it matters |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def render(stacks: list[StackDiff]) -> str:
    changed = [s for s in stacks if s.changed]
    out = [MARKER, "## cdk diff", ""]
    out += summary(risks(stacks))
    if not changed:
        out.append(f"No differences in {len(stacks)} stack(s) against what is deployed.")
        return "\n".join(out) + "\n"
    out.append(f"{len(changed)} of {len(stacks)} stack(s) differ from what is deployed.")
    bodies = {stack.name: "\n".join(stack.lines).strip() for stack in changed}
    frame = len("\n".join(out)) + sum(len(_section(name, "")) for name in bodies)
    limits = budget({name: len(body) for name, body in bodies.items()}, MAX_COMMENT_CHARS - frame)
    cut = []
    for name, body in bodies.items():
        if len(body) > limits[name]:
            cut.append(name)
            body = body[: limits[name]] + f"\n... ({len(body) - limits[name]:,} characters cut here; {TRUNCATED})"
        out.append(_section(name, body))
    if cut:
        out.insert(3, f"> [!NOTE]\n> Diffs of {', '.join(cut)} are cut to keep this comment under GitHub's limit; "
                   "the full diff is in the job log.\n")  # fmt: skip
    return "\n".join(out) + "\n"


# Room for the note that says what was cut, per stack.
TRUNCATED = "the full diff is in the job log"
NOTE_ROOM = 120


def _section(name: str, body: str) -> str:
    return "\n".join(["", f"<details><summary><b>{name}</b></summary>", "", "```", body, "```", "", "</details>"])


def budget(sizes: dict[str, int], total: int) -> dict[str, int]:
    """How many characters each stack's diff may keep so that all fit in `total`: small diffs stay
    whole, and the largest are cut to an equal share of what is left."""
    limits = dict(sizes)
    remaining = max(total - NOTE_ROOM * (len(sizes) + 1), 0)
    left = sorted(sizes, key=sizes.get)
    while left:
        share = remaining // len(left)
        name = left[0]
        if sizes[name] <= share:
            remaining -= sizes[name]
            left.pop(0)
            continue
        for name in left:
            limits[name] = share
        break
    return limits


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: cdk_diff_comment.py CDK_DIFF_OUTPUT", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        sys.stdout.write(render(parse(handle.read())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
