"""`trainctl rehearse`: a whole multi-node job on this machine, as Batch would run it, before paying for it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainctl.commands.base import app, note, reports_errors, state_of
from trainctl.errors import ExitCode, TrainctlError
from trainctl.naming import camel_keys
from trainctl.rehearsal import summary
from trainctl.rehearsal.faults import KINDS, TRIGGERS
from trainctl.rehearsal.progress import EventPrinter
from trainctl.rehearsal.session import Options, Terminated
from trainctl.rehearsal.session import rehearse as run_rehearsal
from trainctl.submitting.preflight import describe_definition
from trainctl.submitting.taskfile import load_task

FAULT_HELP = (
    "A fault, KIND[:NODE][=VALUE][@TRIGGER]; repeatable. Kinds: "
    + ", ".join(KINDS)
    + ". Triggers: "
    + ", ".join(TRIGGERS)
    + " (default start). Example: kill-child@checkpoint:1."
)


@app.command()
@reports_errors
def rehearse(
    ctx: typer.Context,
    task_file: Annotated[Path, typer.Argument(metavar="TASK.yaml", help="The task file `trainctl run` takes.")],
    nodes: Annotated[int | None, typer.Option(help="Nodes (default: the task's, else the job definition's).")] = None,
    fault: Annotated[list[str] | None, typer.Option(metavar="SPEC", help=FAULT_HELP)] = None,
    expect: Annotated[str, typer.Option(help="The ending that counts as a pass: succeeded or failed.")] = "succeeded",
    app_dir: Annotated[
        Path, typer.Option("--app", help="The synthesized app to read the job definition from (`make synth`).")
    ] = Path("cdk.out"),
    deployed: Annotated[
        bool, typer.Option("--deployed", help="Read the deployed job definition from Batch (needs credentials).")
    ] = False,
    procs: Annotated[int, typer.Option(help="Training processes per node (NPROC_PER_NODE) on this machine.")] = 1,
    deadline: Annotated[float, typer.Option(help="Stop the rehearsal after this many seconds.")] = 1800.0,
    seed: Annotated[int, typer.Option(help="Seed of the children's start order and delays.")] = 0,
    keep: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Keep every node's log and files in DIR (default: only the logs, in a temporary folder it names).",
        ),
    ] = None,
    clean: Annotated[
        bool, typer.Option("--clean", help="Remove the node logs at the end (default: kept, and their folder named).")
    ] = False,
    describe_merged: Annotated[
        bool,
        typer.Option(
            "--describe-merged",
            help="DescribeJobs shows the job's nodeProperties with the submission's overrides merged in "
            "(unverified; default: as the job definition registered them).",
        ),
    ] = False,
) -> None:
    """Run a task on this machine under AWS Batch's multi-node rules: the job definition as deployed, every
    node a process with its own loopback address on a simulated host, checkpoints in a local S3, faults on
    request. Says each event as it happens (on stderr), then what happened, what `trainctl why` would say and
    where the node logs are. No AWS account is used unless --deployed."""
    if keep is not None and clean:
        raise TrainctlError(
            f"--keep {keep} and --clean: --keep keeps every node's files, --clean removes the logs; give one"
        )
    state = state_of(ctx)
    task = load_task(task_file)
    definition, source = None, ""
    if deployed:
        fleet = state.deployment().fleet(task.fleet)
        source = fleet.training_definition if task.job == "training" else fleet.benchmark_definition
        definition = describe_definition(state.batch, source)
    options = Options(
        faults=tuple(fault or ()),
        nodes=nodes,
        expect=expect.lower(),
        procs=procs,
        deadline_seconds=deadline,
        seed=seed,
        keep=keep,
        keep_logs=not clean,
        definition=definition,
        definition_source=source,
        describe_merged=describe_merged,
    )
    printer = EventPrinter(note)
    try:
        result = run_rehearsal(task, assembly=app_dir, options=options, listener=printer)
    except KeyboardInterrupt as stop:
        logs = f"; node logs under {printer.logs}" if printer.logs else ""
        note(f"trainctl: rehearsal interrupted: every node was stopped{logs}")
        # 128 + the signal, as a shell reports it.
        raise typer.Exit(143 if isinstance(stop, Terminated) else 130) from None
    if state.json:
        # The report's keys are Python's (the catalog reads it too); NAME=VALUE pairs left out stay as named.
        state.out(camel_keys(result, keep={"not_rehearsed"}))
        note(summary.verdict(result))
    else:
        typer.echo("")
        for line in summary.lines(result):
            typer.echo(line)
    if not result["as_expected"]:
        raise typer.Exit(int(ExitCode.JOB_FAILED))
