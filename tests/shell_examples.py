"""The shell examples of README.md and docs/, run as a reader pastes them, with every command that would
reach AWS, the network or a build replaced by a stub that records its arguments (tests/test_docs_commands.py
says what is checked and how placeholders are treated)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "shell"}
# Blocks of a command and its output: only the `$ ` lines (and their continuations) are commands.
PROMPTED_LANGUAGES = {"console", "text"}
# Commands that would touch AWS, the network, a build or the terminal (tail -f), and `out`, the docs'
# own helper for stack outputs (defined in docs/jobs.md, used on other pages).
STUBBED = (
    "make", "cdk", "npx", "npm", "node", "trainctl", "aws", "docker", "git", "pip", "pip3", "python",
    "python3", "sbatch", "squeue", "sinfo", "sacct", "srun", "tail", "curl", "wget", "crane", "mkdocs",
    "pytest", "ruff", "out",
)  # fmt: skip
# `<words a reader replaces>`: bash would read the `<` as a redirection from a file.
PLACEHOLDER_PATTERN = re.compile(r"<[A-Za-z][^<>\n]*>")
PLACEHOLDER = "PLACEHOLDER"
# An inline `code` span that is a command to paste (a -c argument is run as `cdk synth <argument>`).
INLINE_COMMAND = re.compile(r"^(make |npx cdk |cdk |trainctl |ARGS=|-c [A-Za-z]+=)")
PAGE_SECONDS = 30

# Each stub appends one record per call to $DOCS_CALLS: the count of fields, its own name, then its
# arguments, each ended by NUL. make's stub adds a record "make ARGS" with ARGS as the Makefile's recipe
# gives it to the shell (`$(CDK) deploy ... $(ARGS)`): bash reads that text again, quotes and braces
# included, and a syntax error there fails make, so it fails the stub.
STUB = r"""#!/bin/bash
name=${0##*/}
{ printf '%s\0' "$(( $# + 1 ))" "$name" "$@"; } >> "$DOCS_CALLS"
if [ "$name" = make ]; then
  for arg; do
    case $arg in
      ARGS=*) ( eval "set -- ${arg#ARGS=}" || exit 2
                { printf '%s\0' "$(( $# + 1 ))" "make ARGS" "$@"; } >> "$DOCS_CALLS" ) || exit 2 ;;
    esac
  done
fi
exit 0
"""


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    script: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


# The syntax itself, as prose names it: not a command.
SYNTAX_SPANS = {"-c key=value"}


def _inline_spans(line: str) -> list[str]:
    spans = re.findall(r"(?<!`)`([^`]+)`(?!`)", line)
    return [span for span in spans if INLINE_COMMAND.match(span) and span not in SYNTAX_SPANS]


def _as_command(span: str) -> str:
    if span.startswith("ARGS="):
        return f"make deploy {span}"
    return f"cdk synth {span}" if span.startswith("-c ") else span


def examples(path: Path) -> Iterator[Example]:
    return examples_in(str(path.relative_to(ROOT)), path.read_text())


def examples_in(name: str, text: str) -> Iterator[Example]:
    """Every shell block of a page (at its fence's line) and every inline command span (at its line)."""
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        fence = re.match(r"(\s*)(`{3,})\s*([\w-]*)", lines[number])
        if not fence:
            for span in _inline_spans(lines[number]):
                yield Example(name, number + 1, _as_command(span))
            number += 1
            continue
        body: list[str] = []
        end = number + 1
        while end < len(lines) and lines[end].strip() != fence[2]:
            body.append(lines[end].removeprefix(fence[1]))
            end += 1
        if fence[3] in SHELL_LANGUAGES:
            yield Example(name, number + 1, "\n".join(body))
        elif fence[3] in PROMPTED_LANGUAGES and (commands := _prompted(body)):
            yield Example(name, number + 1, commands)
        number = end + 1


def _prompted(body: list[str]) -> str:
    """A console block's commands: the `$ ` lines and the lines that a trailing backslash continues."""
    commands, continued = [], False
    for line in body:
        if line.startswith("$ ") or continued:
            commands.append(line.removeprefix("$ "))
            continued = line.endswith("\\")
    return "\n".join(commands)


def with_placeholders(script: str) -> str:
    return PLACEHOLDER_PATTERN.sub(PLACEHOLDER, script)


def make_stubs(folder: Path) -> Path:
    """A folder of stub executables, one per STUBBED command."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for name in STUBBED:
        stub = bin_dir / name
        stub.write_text(STUB)
        stub.chmod(0o755)
    return bin_dir


@dataclass(frozen=True)
class Run:
    returncode: int
    stderr: str
    calls: list[list[str]]


def run_all(scripts: Sequence[str], bin_dir: Path, workdir: Path) -> list[Run]:
    """Each script as `bash -e` would run it, all in one bash (a process per block would cost most of the
    time): each in its own subshell under `set -e`, through eval so that a syntax error ends only its own,
    in `workdir` (a checkout's stand-in: .venv/bin/activate, the launcher), stubs first on PATH, no AWS
    credentials. A marker record before each script tells whose stub calls follow."""
    (workdir / ".venv" / "bin").mkdir(parents=True)
    (workdir / ".venv" / "bin" / "activate").write_text("")
    (workdir / "container").mkdir()
    launcher = workdir / "container" / "distributed_run.sh"
    launcher.write_text(STUB)
    launcher.chmod(0o755)
    log = workdir.parent / f"{workdir.name}-log"
    log.mkdir()
    calls = log / "calls"
    calls.touch()
    lines = []
    for number, script in enumerate(scripts):
        lines += [
            f"printf '%s\\0' 1 '#{number}' >> \"$DOCS_CALLS\"",
            f"( set -e; eval {shlex.quote(with_placeholders(script))} ) 2> {shlex.quote(f'{log}/stderr.{number}')}",
            f"echo $? > {shlex.quote(f'{log}/status.{number}')}",
        ]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(workdir), "DOCS_CALLS": str(calls), "LANG": "C"}
    subprocess.run(
        ["bash", "-c", "\n".join(lines)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,  # an example that reads its input reads nothing, instead of waiting
        capture_output=True,
        timeout=PAGE_SECONDS,
        check=True,
    )
    by_script: list[list[list[str]]] = []
    for record in _records(calls.read_bytes()):
        if record[0].startswith("#"):
            by_script.append([])
        else:
            by_script[-1].append(record)
    return [
        Run(int((log / f"status.{n}").read_text()), (log / f"stderr.{n}").read_text(), by_script[n])
        for n in range(len(scripts))
    ]


def _records(data: bytes) -> list[list[str]]:
    fields = data.split(b"\0")[:-1]
    records, at = [], 0
    while at < len(fields):
        count = int(fields[at])
        records.append([field.decode() for field in fields[at + 1 : at + 1 + count]])
        at += 1 + count
    return records


def context_arguments(call: list[str]) -> list[str] | None:
    """The arguments of a call that the CDK CLI reads `-c` from: cdk's own, npx cdk's, and make's ARGS as
    the recipe's shell split them. None for any other call."""
    name, arguments = call[0], call[1:]
    if name in ("cdk", "make ARGS"):
        return arguments
    if name == "npx" and arguments[:1] == ["cdk"]:
        return arguments[1:]
    return None
