"""The `laminar` command line: a thin layer over the engine and the Dagster definitions.

`app.py` holds the shared options and the entry point; each `*_command(s).py` module adds its
commands to the typer app when imported (below)."""

from . import run_commands, look_commands, check_command, sql_command, catalog_command  # noqa: F401, I001  (registers the commands, in help order)
from .app import CliContext, app, main

__all__ = ["CliContext", "app", "main"]
