"""`trainctl fabric`: all-reduce figures judged against published runs (config/fabric_references.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from config import fabric_references
from config.fabric_references import size_text
from trainctl.commands.base import GLOBAL_HELP, app, human_names, reports_errors, state_of
from trainctl.errors import ExitCode, TrainctlError, clip
from trainctl.fleet.fabric import fabric_judgement, figures_table, is_healthy, parse_figures, verdict_line
from trainctl.fleet.fabric_record import (
    TABLE_COPY,
    TESTS,
    known_type,
    log_facts,
    pick_test,
    pick_version,
    read_table,
    record,
    rows_to_record,
    source_of,
)


class FabricGroup(TyperGroup):
    """The sub-commands' arguments and values shown by name, as the top-level commands' are."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            human_names(command.params)
            command.epilog = command.epilog or GLOBAL_HELP


fabric_app = typer.Typer(
    name="fabric",
    cls=FabricGroup,
    help="The network fabric judged against published all-reduce runs of the same instance type and node count.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(fabric_app)


def read_log(log: Path) -> list[str]:
    """The log's lines; `-` reads standard input."""
    if str(log) == "-":
        return typer.get_text_stream("stdin").read().splitlines()
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError as error:
        raise TrainctlError(f"cannot read LOG {clip(log)}: {error.strerror or error}") from None


@fabric_app.command("verdict")
@reports_errors
def verdict(
    ctx: typer.Context,
    log: Annotated[
        Path,
        typer.Argument(
            metavar="LOG",
            help="all_reduce_perf output: nccl-tests' table or the benchmark's (`trainctl logs JOB`); - reads stdin.",
        ),
    ],
    instance_type: Annotated[
        str, typer.Option("--instance-type", metavar="TYPE", help="The nodes' EC2 instance type, e.g. p5.48xlarge.")
    ],
    nodes: Annotated[int, typer.Option(min=1, metavar="N", help="How many nodes the run spanned (at least 1).")],
) -> None:
    """Say healthy, degraded (with the likely cause) or uncalibrated (nothing published: figures shown, not
    judged) for an all-reduce run. Healthy is at least 90% of the published median at the largest size
    measured that has one. Exit 0 only when healthy; 4 otherwise."""
    state = state_of(ctx)
    figures = parse_figures(read_log(log))
    if not figures:
        raise TrainctlError(
            f"no all_reduce_perf rows in {clip(log)}: expected lines of size, count, type, redop, root, "
            "time, algbw, busbw (nccl-tests or the benchmark)"
        )
    judged = fabric_judgement(figures, instance_type, nodes)
    if state.json:
        state.out(
            {
                "verdict": judged.word,
                "instanceType": instance_type,
                "nodes": nodes,
                "bytes": judged.message_bytes,
                "busbwGBps": judged.busbw_GBps,
                "referenceGBps": judged.reference_GBps,
                "cause": judged.cause,
                "reason": judged.reason,
                "figures": [{"bytes": f.bytes, "algbwGBps": f.algbw_GBps, "busbwGBps": f.busbw_GBps} for f in figures],
            }
        )
    else:
        typer.echo(verdict_line(judged, instance_type, nodes))
        for line in figures_table(figures, judged.message_bytes):
            typer.echo(line)
    raise typer.Exit(int(ExitCode.OK if is_healthy(judged) else ExitCode.UNHEALTHY))


def _repository() -> Path:
    """The checkout trainctl runs from: the one whose config/ holds the table."""
    return Path(fabric_references.__file__).resolve().parents[1]


@fabric_app.command("record")
@reports_errors
def record_command(
    log: Annotated[
        Path,
        typer.Argument(metavar="LOG", help="all_reduce_perf output of a healthy run (as for `fabric verdict`)."),
    ],
    instance_type: Annotated[
        str, typer.Option("--instance-type", metavar="TYPE", help="The nodes' EC2 instance type (in the catalog).")
    ],
    nodes: Annotated[int, typer.Option(min=2, metavar="N", help="How many nodes the run spanned (at least 2).")],
    source: Annotated[
        str,
        typer.Option(
            metavar="TEXT_OR_URL",
            help="Where the log is published: a GitHub file at a commit (.../blob/<commit>/<path>), a page, a note.",
        ),
    ],
    test: Annotated[
        str | None,
        typer.Option(metavar="TEST", help=f"The collective test ({', '.join(TESTS)}); default: what the log says."),
    ] = None,
    nccl: Annotated[str | None, typer.Option(metavar="VERSION", help="NCCL's version; default: the log's.")] = None,
    aws_ofi_nccl: Annotated[
        str | None, typer.Option(metavar="VERSION", help="aws-ofi-nccl's version; default: the log's.")
    ] = None,
    efa_installer: Annotated[
        str | None, typer.Option(metavar="VERSION", help="The EFA installer's version (no log prints it).")
    ] = None,
    command: Annotated[
        str | None, typer.Option(metavar="TEXT", help="The command that ran the test; default: the test's name.")
    ] = None,
    note: Annotated[str, typer.Option(metavar="TEXT", help="Anything else a reader needs (image, placement).")] = "",
    replace: Annotated[
        bool, typer.Option("--replace", help="Record it where the type and node count already have a reference.")
    ] = False,
    repo: Annotated[
        Path | None, typer.Option(metavar="DIR", help="The checkout to write; default: the one trainctl runs from.")
    ] = None,
) -> None:
    """Add a healthy all-reduce run to the reference table (config/fabric_references.py and the benchmark's
    copy), for a type and node count nothing is published for. Refused: a type outside the catalog, a log
    without rows or with wrong results, a type and node count with a reference (unless --replace), a run the
    verdict calls degraded."""
    known_type(instance_type)
    lines = read_log(log)
    figures = parse_figures(lines)
    facts = log_facts(lines)
    chosen = pick_test(test, facts.test, instance_type)
    versions = {
        "nccl": pick_version("--nccl", nccl, facts.nccl),
        "aws_ofi_nccl": pick_version("--aws-ofi-nccl", aws_ofi_nccl, facts.aws_ofi_nccl),
        "efa_installer": efa_installer,
    }
    today = datetime.now(UTC).date().isoformat()
    cited = source_of(source, today, command or chosen, versions, note)
    checkout = repo or _repository()
    current = read_table(checkout)
    rows = rows_to_record(figures, instance_type, nodes, cited, chosen, replace, current.module.REFERENCES)
    table = record(checkout, current, rows, replace)
    sizes = ", ".join(f"{size_text(row.message_bytes)} {row.busbw_GBps:.2f}" for row in rows)
    typer.echo(f"recorded: {nodes} x {instance_type}, {chosen}, busbw GB/s {sizes}")
    copy = table.parents[1] / TABLE_COPY
    typer.echo(f"  written to {table} and {copy}; add the row to docs/observability.md's reference table")
