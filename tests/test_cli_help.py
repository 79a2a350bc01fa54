"""`trainctl --help` and the CLI reference: commands in the order of work, arguments and values by name."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from tests.docs_text import page
from tools import docs_reference
from trainctl.cli import app
from trainctl.commands.base import GlobalOptionsGroup, in_order_of_work

WORK_ORDER = [
    "status",
    "jobs",
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
    "cost",
    "budget",
    "rehearse",
]


def help_text(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], prog_name="trainctl", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.output


def test_help_lists_commands_in_the_order_of_work():
    listed = re.findall(r"^  (\w+)  ", help_text().split("Commands:")[1], re.M)
    expected = [name for name in WORK_ORDER if name in listed]
    assert [name for name in listed if name in WORK_ORDER] == expected
    assert listed[:3] == ["status", "jobs", "ps"]  # ps, the alias of jobs, beside it
    assert {"status", "jobs", "submit", "logs", "cancel", "exec", "cost", "rehearse"} <= set(listed)


def test_budget_follows_cost_when_present_and_new_commands_come_last():
    assert in_order_of_work(["rehearse", "zeta", "budget", "cost", "alpha", "status"]) == [
        "status",
        "cost",
        "budget",
        "rehearse",
        "zeta",
        "alpha",
    ]
    assert in_order_of_work(["rehearse", "cost", "status"]) == ["status", "cost", "rehearse"]


def test_a_new_command_comes_after_the_known_ones_in_a_real_group():
    demo = typer.Typer(cls=GlobalOptionsGroup)

    @demo.command()
    def later() -> None:
        """Defined first, listed after the known commands."""

    @demo.command()
    def cost() -> None:
        """Known."""

    @demo.command()
    def status() -> None:
        """Known."""

    group = typer.main.get_command(demo)
    assert group.list_commands(group.context_class(group)) == ["status", "cost", "later"]


def test_usage_and_help_name_arguments_and_values_as_words():
    exec_help = help_text("exec")
    assert "Usage: trainctl exec [OPTIONS] JOB [-- CMD...]" in exec_help
    submit_help = help_text("submit")
    assert "Usage: trainctl submit [OPTIONS] FLEET\n" in submit_help
    assert "--env NAME=VALUE" in submit_help and "--nodes NODES" in submit_help
    assert "--job training|benchmark" in submit_help
    assert "Usage: trainctl cancel [OPTIONS] [JOB...]" in help_text("cancel")
    assert "--region REGION" in help_text()
    for text in (exec_help, submit_help, help_text(), help_text("cancel"), help_text("sweep")):
        assert not re.search(r"\{[A-Z]|<(str|int|float|path|list)|\[\[", text), text


def test_cli_reference_has_the_same_order_and_words():
    text = page("reference/cli.md")
    documented = re.findall(r"^## `trainctl (\w+)`", text, re.M)
    # The help's order, but `rehearse` beside `run` (tools/docs_reference.py: BESIDE; tests/test_docs_offline.py).
    page_order = docs_reference.page_order(WORK_ORDER)
    assert [name for name in documented if name in WORK_ORDER] == [n for n in page_order if n in documented]
    assert "## Options before the command" not in text and "## Global options" in text
    assert not re.search(r"\{[A-Z]|<(str|int|float|path|list)|\[\[", text)
    assert "trainctl exec [OPTIONS] JOB [-- CMD...]" in text and "| `--env NAME=VALUE` |" in text
