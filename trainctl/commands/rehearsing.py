"""`trainctl rehearse`: a whole multi-node job on this machine, as Batch would run it, before paying for it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainctl.commands.base import app, console, note, reports_errors, state_of
from trainctl.errors import ExitCode
from trainctl.naming import camel_keys
from trainctl.rehearsal import report
from trainctl.rehearsal.faults import KINDS, TRIGGERS
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
        Path | None, typer.Option(metavar="DIR", help="Keep every node's log and files in DIR (default: removed).")
    ] = None,
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
    request; print what happened and what `trainctl why` would say. No AWS account is used unless --deployed."""
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
        definition=definition,
        definition_source=source,
        describe_merged=describe_merged,
    )
    try:
        result = run_rehearsal(task, assembly=app_dir, options=options)
    except KeyboardInterrupt as stop:
        note("trainctl: rehearsal interrupted: every node was stopped")
        # 128 + the signal, as a shell reports it.
        raise typer.Exit(143 if isinstance(stop, Terminated) else 130) from None
    if state.json:
        # The report's keys are Python's (the catalog reads it too); NAME=VALUE pairs left out stay as named.
        state.out(camel_keys(result, keep={"not_rehearsed"}))
    else:
        out = console()
        for line in report.text(result):
            out.print(line, markup=False, highlight=False)
    if not result["as_expected"]:
        raise typer.Exit(int(ExitCode.JOB_FAILED))
