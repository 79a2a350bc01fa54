"""trainctl's commands, one module per group; trainctl.cli imports them all."""
