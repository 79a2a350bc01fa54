"""Turn `cdk diff --no-color` output into one pull-request comment (Markdown on stdout).

    python cdk_diff_comment.py cdk-diff.txt > comment.md

The first line is a marker the workflow uses to find and update its earlier comment. Changes that
replace, destroy or orphan a stateful resource (buckets, repositories, file systems, log groups,
...) are listed first, loudly; each stack's full diff follows in a collapsed section.
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
# How `cdk diff` words the impact of a resource change, at the end of its line.
RISKY_IMPACTS = ("may be replaced", "replace", "destroy", "orphan")
# GitHub refuses comments over 65,536 characters. The whole comment stays below this, with room
# to spare for the truncation notes; the largest stack diffs are cut first.
MAX_COMMENT_CHARS = 60_000

_STACK = re.compile(r"^Stack (\S+)")
_RESOURCE = re.compile(r"^\[(?P<op>[+~-])\] (?P<type>(?:AWS|Custom)::\S+) (?P<rest>.+)$")


@dataclass
class StackDiff:
    name: str
    lines: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(_RESOURCE.match(line) for line in self.lines)


@dataclass(frozen=True)
class Risk:
    stack: str
    resource_type: str
    resource: str
    impact: str


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
    found = []
    for stack in stacks:
        for line in stack.lines:
            match = _RESOURCE.match(line.strip())
            if not match or match["type"] not in STATEFUL_TYPES:
                continue
            rest = match["rest"]
            impact = next((i for i in RISKY_IMPACTS if rest.endswith(f" {i}")), None)
            if impact is None and match["op"] == "-":
                impact = "destroy"
            if impact:
                resource = rest[: -len(impact)].strip() if rest.endswith(impact) else rest
                found.append(Risk(stack.name, match["type"], resource, impact))
    return found


def render(stacks: list[StackDiff]) -> str:
    changed = [s for s in stacks if s.changed]
    out = [MARKER, "## cdk diff", ""]
    at_risk = risks(stacks)
    if at_risk:
        out += [
            "> [!CAUTION]",
            f"> **{len(at_risk)} stateful resource change(s) can lose or orphan data.** "
            "Check each before merging; a replaced bucket or file system starts empty.",
            "",
            "| stack | resource | type | change |",
            "|---|---|---|---|",
            *(f"| {r.stack} | `{r.resource}` | `{r.resource_type}` | **{r.impact}** |" for r in at_risk),
            "",
        ]
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
