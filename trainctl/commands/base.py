"""What every command shares: the typer app, the global options (before or after the command), the
AWS session and the deployment, one-line errors, and output helpers."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperGroup, TyperOption

from trainctl import __version__
from trainctl.aws import Aws, aws_errors
from trainctl.deployment import Deployment, load_deployment
from trainctl.errors import TrainctlError

EXIT_CODES_HELP = (
    "Exit status: 0 done (check: healthy); 1 the job FAILED (submit/run --watch or --follow, logs -f, check); 2 bad "
    "input (a flag, an unknown fleet, a job that is not ours); 3 AWS could not be asked (credentials, region, no "
    "stacks); 4 check, fabric verdict: the verdict is not healthy; 130 Ctrl-C stopped following (the job goes on)."
)
GLOBAL_HELP = "Global options (--region, --profile, --json) go before or after the command."

# The global options and whether each takes a value.
GLOBAL_OPTIONS = {"--region": True, "--profile": True, "--json": False}


def hoist_global_options(args: list[str], commands: set[str]) -> list[str]:
    """Move global options written after the command in front of it, as the aws CLI takes them.

    Stops at `--` (what follows is a command for `exec`); a value of another option is never read as one.
    """
    position = 0
    while position < len(args) and args[position].startswith("-"):
        name = args[position].split("=", 1)[0]
        takes_value = GLOBAL_OPTIONS.get(name, False) and "=" not in args[position]
        position += 2 if takes_value else 1
    if position >= len(args) or args[position] not in commands:
        return args
    hoisted: list[str] = []
    rest: list[str] = []
    i = position + 1
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            takes_value = GLOBAL_OPTIONS[name]
            if takes_value and "=" not in arg and i + 1 < len(args):
                hoisted += [arg, args[i + 1]]
                i += 2
                continue
            hoisted.append(arg)
        else:
            rest.append(arg)
        i += 1
    return args[:position] + hoisted + args[position : position + 1] + rest


# `--help` and the CLI reference list commands in the order of work: look, start, follow, explain, stop, then the
# fleet-wide ones. A command not named here (a new one) comes after these, in the order it was defined.
COMMAND_ORDER = (
    "status",
    "jobs",
    "ps",
    "submit",
    "run",
    "sweep",
    "logs",
    "show",
    "why",
    "cancel",
    "exec",
    "checkpoints",
    "check",
    "fabric",
    "cost",
    "budget",
    "capacity",
    "rehearse",
)


def in_order_of_work(names: list[str]) -> list[str]:
    rank = {name: position for position, name in enumerate(COMMAND_ORDER)}
    return sorted(names, key=lambda name: rank.get(name, len(COMMAND_ORDER)))


class HumanArgument(TyperArgument):
    """An argument shown by its name alone: `JOB` and `[JOB...]`, not typer's `{JOB}` and `JOB <str>`."""

    def _usage_display_name(self) -> str:
        name = self.metavar or (self.name or "").upper() + ("..." if self.nargs != 1 else "")
        return name if self.required or name.startswith("[") else f"[{name}]"

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


class HumanOption(TyperOption):
    """An option's value shown as a word: `--nodes NODES` and `--job training|benchmark`, not `<int range>`."""

    def display_type_rich(self, ctx: Any) -> str | None:
        if self.metavar is not None or self.is_flag:
            return super().display_type_rich(ctx)
        shown = self.display_type(ctx)[1:-1]  # "<int range>", "<training|benchmark>"
        word = shown if "|" in shown and "[" not in shown else (self.name or "").upper()
        return word + ("..." if self.nargs != 1 else "")


def human_names(params: list[Any]) -> None:
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = HumanArgument
        elif type(param) is TyperOption:
            param.__class__ = HumanOption


class GlobalOptionsGroup(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # typer makes every parameter itself (no hook for their class): each is given the human rendering here.
        human_names(self.params)
        for command in self.commands.values():
            human_names(command.params)

    def list_commands(self, ctx: Any) -> list[str]:
        return in_order_of_work(list(super().list_commands(ctx)))

    # ctx: typer's own (vendored) click Context.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_global_options(list(args), set(self.commands)))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        # Every command's --help says where the global options go.
        command = super().get_command(ctx, cmd_name)
        if command is not None and not command.epilog:
            command.epilog = GLOBAL_HELP
        return command


app = typer.Typer(
    name="trainctl",
    cls=GlobalOptionsGroup,
    help=(
        "Run, watch and account for multi-node training jobs on the fleets `cdk deploy --all` built. "
        "Everything is found from the stacks' outputs in the region: there is no configuration file. "
        + GLOBAL_HELP
        + " "
        + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    # --install-completion / --show-completion for bash, zsh, fish and PowerShell.
    add_completion=True,
    pretty_exceptions_enable=False,
    # Help text is plain: "[n0]" is a log prefix, not rich markup.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

P = ParamSpec("P")
R = TypeVar("R")
# How often --watch, --follow and check ask Batch for news (hidden option; tests use 0).
POLL_SECONDS = 15.0
PollOption = Annotated[float, typer.Option("--poll-seconds", hidden=True, min=0.0)]


def sleep(seconds: float) -> None:
    """Between polls (a test stands in for the time that passes)."""
    time.sleep(seconds)


class State:
    """What every command shares: the AWS session, --json, and the deployment (read once)."""

    def __init__(self, *, aws: Aws, json_output: bool) -> None:
        self.aws = aws
        self.json = json_output
        self._deployment: Deployment | None = None

    @property
    def batch(self) -> Any:
        return self.aws.client("batch")

    def deployment(self) -> Deployment:
        if self._deployment is None:
            self._deployment = load_deployment(self.aws.client("cloudformation"), self.aws.region)
        return self._deployment

    def out(self, value: Any) -> None:
        typer.echo(json.dumps(value, indent=2, default=str))


def reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Show a TrainctlError (and anything the AWS libraries raise) as one line on stderr; exit with its code."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with aws_errors():
                return command(*args, **kwargs)
        except TrainctlError as error:
            typer.echo(f"trainctl: {error.message}", err=True)
            raise typer.Exit(int(error.code)) from None

    return run


def state_of(ctx: typer.Context) -> State:
    state = ctx.obj
    assert isinstance(state, State)  # set by the callback below
    return state


def console() -> Console:
    # Piped or captured output gets wide tables rather than rich's 80-column default.
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def note(message: str) -> None:
    typer.echo(message, err=True)


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainctl {__version__}")
        raise typer.Exit()


@app.callback()
def options(
    ctx: typer.Context,
    region: Annotated[
        str | None,
        typer.Option(help="AWS region of the stacks (default: AWS_REGION, AWS_DEFAULT_REGION, the profile's)."),
    ] = None,
    profile: Annotated[str | None, typer.Option(help="AWS profile to use (default: AWS_PROFILE).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print trainctl's version and exit.")
    ] = False,
) -> None:
    """Options every command takes. AWS_ENDPOINT_URL and the rest of the AWS environment apply too."""
    ctx.obj = State(aws=Aws(region=region, profile=profile), json_output=json_output)
