"""`trainctl fabric`: all-reduce figures judged against published runs (config/fabric_references.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from trainctl.commands.base import GLOBAL_HELP, app, human_names, reports_errors, state_of
from trainctl.errors import ExitCode, TrainctlError, clip
from trainctl.fleet.fabric import fabric_judgement, figures_table, is_healthy, parse_figures, verdict_line


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
