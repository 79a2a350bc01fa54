"""The `trainctl` command line (typer). Commands live by group in trainctl/commands/; importing a group
registers its commands on the one app."""

from __future__ import annotations

from trainctl.commands import budgeting, capacity, control, fabric, fleet, inspecting, rehearsing, submitting
from trainctl.commands.base import app

__all__ = ["app", "main"]
# Each module registers its commands on import.
COMMAND_GROUPS = (fleet, fabric, submitting, inspecting, control, budgeting, capacity, rehearsing)


def main() -> None:
    """Console script entry point."""
    app(prog_name="trainctl")
