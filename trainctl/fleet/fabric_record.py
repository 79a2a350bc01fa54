"""`trainctl fabric record`: a measurement nobody has published, written into the reference table.

The table is config/fabric_references.py and its byte-identical copy in container/benchmark/ (the
benchmark image sees only container/). Recorded rows live in the block between the module's RECORDED
markers; this module renders that block again from the rows already there plus the new ones, checks
that the result still loads, and writes both files with the same bytes.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from config.catalog import CATALOG, Profile
from config.fabric_references import (
    BENCHMARK_NCCL,
    BENCHMARK_XLA,
    DEGRADED,
    GIB,
    NCCL_TESTS_ALL_REDUCE,
    Reference,
    Source,
    judge,
    references_for,
)
from trainctl.errors import TrainctlError, clip
from trainctl.fleet.fabric import Figure

TABLE = Path("config") / "fabric_references.py"
TABLE_COPY = Path("container") / "benchmark" / "fabric_references.py"
BEGIN = "# BEGIN RECORDED (written by `trainctl fabric record`)"
END = "# END RECORDED"
# The table holds the sizes a fleet check is judged at: 1 GiB and more, as the published rows.
RECORD_FROM_BYTES = GIB

_NCCL_VERSION = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
_NCCL_LIBRARY = re.compile(r"\bnccl-library=(\d{5,})\b")  # nccl-tests' header: 22803 is 2.28.3
_OFI_VERSION = re.compile(r"\baws-ofi-nccl v?(\d+\.\d+\.\d+[\w.+-]*)")
_BENCHMARK_BACKEND = re.compile(r'"backend":\s*"(\w+)"')
_GITHUB_AT_COMMIT = re.compile(r"^https://github\.com/[^/]+/[^/]+/blob/([0-9a-f]{40})/(\S+)$")


@dataclass(frozen=True)
class LogFacts:
    """What a log says about the run besides its figures (None: it does not say)."""

    test: str | None
    nccl: str | None
    aws_ofi_nccl: str | None


def log_facts(lines: Iterable[str]) -> LogFacts:
    """The collective test (nccl-tests' header, or the benchmark's report and its backend) and the NCCL and
    aws-ofi-nccl versions (NCCL's `NCCL version` INFO line, nccl-tests' `nccl-library=`, the plugin's
    `Initializing aws-ofi-nccl` INFO line)."""
    test = nccl = library = ofi = None
    for line in lines:
        if "nccl-tests version" in line or "out-of-place" in line:
            test = NCCL_TESTS_ALL_REDUCE
        if (backend := _BENCHMARK_BACKEND.search(line)) and test is None:
            test = {"nccl": BENCHMARK_NCCL, "xla": BENCHMARK_XLA}.get(backend.group(1))
        if match := _NCCL_VERSION.search(line):
            nccl = nccl or match.group(1)
        if match := _NCCL_LIBRARY.search(line):
            library = library or match.group(1)
        if match := _OFI_VERSION.search(line):
            ofi = ofi or match.group(1)
    if nccl is None and library is not None:
        code = int(library)
        nccl = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return LogFacts(test, nccl, ofi)


# --test's values and the names the table keeps.
TESTS = {"nccl-tests": NCCL_TESTS_ALL_REDUCE, "benchmark-nccl": BENCHMARK_NCCL, "benchmark-xla": BENCHMARK_XLA}


def pick_test(given: str | None, logged: str | None, instance_type: str) -> str:
    """The collective test that measured the log: --test, else what the log says; Trainium runs no NCCL."""
    if given is not None and given not in TESTS:
        raise TrainctlError(f"--test {clip(given)} is not one of {', '.join(TESTS)}")
    test = TESTS[given] if given else logged
    if test is None:
        raise TrainctlError(
            "the log does not say which test measured it (no nccl-tests header, no benchmark report): give --test"
        )
    spec = CATALOG.get(instance_type)
    trainium = spec is not None and spec.profile is Profile.TRAINIUM
    if trainium != (test == BENCHMARK_XLA):
        wanted = "the benchmark's XLA run (--test benchmark-xla)" if trainium else "an NCCL run"
        raise TrainctlError(f"{instance_type} is measured by {wanted}, not by {test}")
    return test


def pick_version(name: str, given: str | None, logged: str | None) -> str | None:
    """The version the user gave, else the log's; the two disagreeing is refused."""
    if given and logged and not logged.startswith(given):
        raise TrainctlError(f"{name} {clip(given)} disagrees with the log, which says {logged}")
    return given or logged


def source_of(text: str, today: str, command: str, versions: dict[str, str | None], note: str) -> Source:
    """A Source from --source: a GitHub file at a commit fills path and commit, anything else is the url."""
    match = _GITHUB_AT_COMMIT.match(text)
    commit, path = (match.group(1), match.group(2)) if match else ("", "")
    return Source(
        url=text,
        path=path,
        commit=commit,
        published=today,
        retrieved=today,
        command=command,
        nccl=versions.get("nccl"),
        aws_ofi_nccl=versions.get("aws_ofi_nccl"),
        efa_installer=versions.get("efa_installer"),
        note=note,
    )


def known_type(instance_type: str) -> None:
    if instance_type not in CATALOG:
        raise TrainctlError(f"--instance-type {clip(instance_type)} is not in the catalog (config/catalog.py)")


def rows_to_record(
    figures: list[Figure],
    instance_type: str,
    nodes: int,
    source: Source,
    test: str,
    replacing: bool,
    table: tuple[Reference, ...],
) -> list[Reference]:
    """The rows the measurement adds to `table` (the references as the checkout has them), or the one-line
    refusal of it."""
    known_type(instance_type)
    if nodes < 2:
        raise TrainctlError(f"--nodes {nodes}: a reference is measured across nodes, at least 2")
    if not figures:
        raise TrainctlError("no all_reduce_perf rows in the log: nothing to record")
    wrong = [figure for figure in figures if figure.wrong]
    if wrong:
        raise TrainctlError(f"the log has wrong results (#wrong {wrong[0].wrong} at {wrong[0].bytes} B): not recorded")
    large = [figure for figure in figures if figure.bytes >= RECORD_FROM_BYTES and figure.busbw_GBps > 0]
    if not large:
        raise TrainctlError("the log has no busbw at 1 GiB or more: rerun to at least 1 GiB (-e 8G, --sizes 8K:8G)")
    published = [row for row in references_for(instance_type, nodes, table) if row.cause is None]
    if published and not replacing:
        raise TrainctlError(
            f"{nodes} x {instance_type} already has a published reference; --replace records this one instead"
        )
    verdict = judge({figure.bytes: figure.busbw_GBps for figure in figures}, instance_type, nodes, table)
    if verdict.word == DEGRADED:
        raise TrainctlError(f"not recorded: the verdict is degraded: {verdict.reason}")
    return [Reference(instance_type, nodes, f.bytes, f.busbw_GBps, source, test=test) for f in large]


def load_table(text: str, path: Path) -> ModuleType:
    """The table module as `text` defines it, loaded apart from config.fabric_references (registered while it
    runs: dataclasses look their module up by name)."""
    module = ModuleType("_fabric_table_being_read")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)  # noqa: S102 - the repository's own table
    finally:
        del sys.modules[module.__name__]
    return module


def _values(row: object) -> tuple[object, ...]:
    return tuple(getattr(row, name) for name in ("instance_type", "nodes", "message_bytes", "busbw_GBps", "test"))


def _literal(value: str | None) -> str:
    """A Python literal in the module's style: JSON's escapes of a string are Python's too."""
    return "None" if value is None else json.dumps(value)


def render_source(source: Source, indent: str) -> list[str]:
    fields = [f"{name}={_literal(getattr(source, name))}," for name in Source.__dataclass_fields__]
    return [f"{indent}Source(", *(f"{indent}    {field}" for field in fields), f"{indent}),"]


def render_block(recorded: Iterable[Reference], replaced: Iterable[tuple[str, int]]) -> list[str]:
    """The lines between the markers: one `_rows(...)` per recorded run (type, nodes, source, test)."""
    runs: dict[tuple[str, int, Source, str], dict[int, float]] = {}
    for row in recorded:
        runs.setdefault((row.instance_type, row.nodes, row.source, row.test), {})[row.message_bytes] = row.busbw_GBps
    lines = ["RECORDED: tuple[Reference, ...] = tuple("]
    for number, ((instance_type, nodes, source, test), figures) in enumerate(runs.items()):
        lines.append(f"    {'+ ' if number else ''}_rows(")
        lines.append(f"        {_literal(instance_type)},")
        lines += render_source(source, "        ")
        lines.append("        {" + ", ".join(f"{size}: {busbw!r}" for size, busbw in sorted(figures.items())) + "},")
        lines.append(f"        nodes={nodes},")
        lines.append(f"        test={_literal(test)},")
        lines.append("    )")
    if not runs:
        lines.append("    ()")
    lines.append(")")
    pairs = "".join(f"({_literal(name)}, {nodes}), " for name, nodes in sorted(set(replaced)))
    lines.append(f"REPLACED: tuple[tuple[str, int], ...] = ({pairs.rstrip()})")
    return lines


@dataclass(frozen=True)
class TableFile:
    """The table's text in a checkout and the module it defines."""

    text: str
    module: ModuleType


def read_table(repo: Path) -> TableFile:
    """The checkout's table, refused when its benchmark copy differs or its RECORDED block is not whole."""
    table, copy = repo / TABLE, repo / TABLE_COPY
    try:
        text, copied = table.read_text(), copy.read_bytes()
    except OSError as error:
        raise TrainctlError(f"cannot read the table in {clip(repo)}: {error.strerror or error}") from None
    if copied != text.encode():
        raise TrainctlError(f"{TABLE_COPY} differs from {TABLE}: cp {TABLE} {TABLE_COPY.parent}/ first")
    lines = text.splitlines()
    if lines.count(BEGIN) != 1 or lines.count(END) != 1 or lines.index(BEGIN) > lines.index(END):
        raise TrainctlError(f"{table}: the RECORDED markers are missing or repeated")
    return TableFile(text, load_table(text, table))


def record(repo: Path, current: TableFile, rows: list[Reference], replacing: bool) -> Path:
    """Write `rows` into the checkout's table (`current`, as read_table read it) and its copy: a size recorded
    again replaces the earlier row, and replacing drops every earlier recorded row of the type and node count.
    Returns the table's path."""
    table = repo / TABLE
    lines = current.text.splitlines()
    start, end = lines.index(BEGIN), lines.index(END)
    key = (rows[0].instance_type, rows[0].nodes)
    sizes = {row.message_bytes for row in rows}
    kept = [
        row
        for row in current.module.RECORDED
        if (row.instance_type, row.nodes) != key or not (replacing or row.message_bytes in sizes)
    ]
    # Only published healthy rows need hiding: earlier recorded ones are dropped from the block itself.
    published = any((r.instance_type, r.nodes) == key and r.cause is None for r in current.module.PUBLISHED)
    replaced = [*current.module.REPLACED, *([key] if replacing and published else [])]
    block = render_block([*kept, *rows], replaced)
    written = "\n".join([*lines[: start + 1], *block, *lines[end:]]) + "\n"
    listed = {_values(row) for row in load_table(written, table).REFERENCES}
    if not all(_values(row) in listed for row in rows):
        raise TrainctlError(f"{table}: the table rewritten would not list the new rows; nothing written")
    for path in (table, repo / TABLE_COPY):
        path.write_text(written)
    return table
