"""The `laminar` application: options shared by every command, output helpers, and the entry point that
turns errors into one red line."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from laminar_assets import storage
from laminar_assets.errors import LakeNotFoundError, LaminarError, did_you_mean

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Incremental time-window rollups over Delta tables (Spark + Dagster).")
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

# What typer raises for a bad command line (unknown option, bad value, missing argument): its own exceptions
# since it vendors click (typer.TyperException), click's before that. They carry the message naming the
# option and the exit code (2 for usage errors).
USAGE_ERRORS = tuple(t for t in (getattr(typer, "TyperException", None), click.ClickException) if t is not None)


def _holds_a_lake(folder: str) -> bool:
    """A local lake holds Laminar's `_laminar/` folder or at least one Delta table (a folder with `_delta_log/`):
    a mistyped --root that is some other folder (`/etc`, a project folder) is refused instead of reported as a
    lake where nothing exists yet and every check passes."""
    with os.scandir(folder) as entries:
        return any(e.is_dir() and (e.name == "_laminar" or os.path.isdir(os.path.join(e.path, "_delta_log")))
                   for e in entries)

@dataclass
class CliContext:
    """Options shared by every command."""

    root: str
    dagster_home: str
    debug: bool
    flows: str | None = None  # a folder of .py/.sql specs or a module; None: this project's laminar_assets.flows
    _specs: list | None = field(default=None, repr=False)
    _exports: list | None = field(default=None, repr=False)

    def require_lake(self) -> None:
        """Commands that read a lake fail on a root that is not there (a mistyped --root, or no lake created
        yet) instead of reporting an empty lake; commands that create one (demo, generate) do not call this."""
        if storage.is_object_store(self.root):
            storage.check_reachable(self.root)  # the store answers and the bucket exists: one line if not
            storage.copies.kept()  # a wrong LAMINAR_CACHE_* setting: one line, not an ERROR in each flow's row
            if storage.list_dirs(self.root):
                return
            found = "holds nothing"
        elif os.path.isdir(self.root):
            if _holds_a_lake(self.root):
                return
            found = "holds no Delta table and no _laminar/ folder"
        else:
            found = "is not a directory" if os.path.exists(self.root) else "does not exist"
        raise LakeNotFoundError(f"storage root {self.root} {found}: expected a lake (Delta tables) there; pass the "
                                "right --root (or set LAMINAR_ROOT), or create a lake with `laminar demo`")

    def specs(self):
        """The flows' specs (loaded once per command), their tables checked against each other under this
        root: two outputs in one folder, or an output in a table the flows read or in `_laminar/`, fail here."""
        if self._specs is None:
            from laminar_assets.engine import check_tables, collect_specs

            if self.flows:  # e.g. a dg project's component folder (defs/trades/flows)
                specs = collect_specs(self.flows)
            else:
                from laminar_assets.flows import load_specs

                specs = load_specs()
            check_tables(specs, root=self.root)
            self._specs = specs
        return self._specs

    def exports(self):
        """The flows' exports (PostgresExport, ..., CREATE SINK), checked against the specs."""
        if self._exports is None:
            from laminar_assets.engine import collect

            self._exports = collect(self.flows or "laminar_assets.flows").exports
        return self._exports

    def spec(self, name: str):
        specs = {s.name: s for s in self.specs()}
        if name not in specs:
            raise LaminarError(f"unknown flow {name!r}; {did_you_mean(name, specs)}known flows: "
                               f"{', '.join(sorted(specs))}", flow=name)
        return specs[name]

    def engine(self):
        from laminar_assets.engine import CatalogOptions, Engine, EngineOptions, SparkOptions, build_session
        from laminar_assets.pipeline.settings import load_settings

        options = EngineOptions.of(load_settings().engine_options(), where="[tool.laminar]")  # as Dagster's runs
        schema = catalog_schema()
        return Engine(build_session(SparkOptions.from_env()), self.root, options=options,
                      catalog=CatalogOptions(schema=schema) if schema else None)

    def instance(self):
        """The Dagster instance under DAGSTER_HOME, its dagster.yaml kept in step with the project's
        template: ./dagster.yaml (SQLite), or the file LAMINAR_DAGSTER_YAML names (e.g. dagster.postgres.yaml)."""
        import dagster as dg

        os.makedirs(self.dagster_home, exist_ok=True)
        target = os.path.join(self.dagster_home, "dagster.yaml")
        template = os.path.abspath(os.environ.get("LAMINAR_DAGSTER_YAML") or os.path.join(os.getcwd(), "dagster.yaml"))
        if os.path.exists(template):
            if not os.path.exists(target) or os.path.getmtime(template) > os.path.getmtime(target):
                shutil.copy(template, target)
        elif not os.path.exists(target):
            with open(target, "w") as fh:
                fh.write("telemetry:\n  enabled: false\n")
        return dg.DagsterInstance.from_config(self.dagster_home)

    def definitions(self, *, stop_spark_per_run: bool = False, jit: str | None = None):
        from laminar_assets.orchestration.builder import build_definitions
        from laminar_assets.pipeline.settings import load_settings
        from laminar_assets.resources import LaminarResource, SparkResource

        resources = {"laminar": LaminarResource(root=self.root, spark=SparkResource(stop_at_end=stop_spark_per_run, jit=jit))}
        return build_definitions(self.specs(), load_settings(), resources=resources, exports=self.exports())


@app.callback()
def _options(
    ctx: typer.Context,
    root: str = typer.Option(None, "--root", help="Storage root of the Delta tables (default $LAMINAR_ROOT or ./.laminar/lake)."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    flows: str = typer.Option(None, "--flows", help="The flows to use: a folder of .py and .sql specs (a dg "
                              "project's component folder, e.g. defs/trades/flows) or a module (default: this "
                              "project's laminar_assets.flows)."),
) -> None:
    from laminar_assets.pipeline.settings import load_settings

    load_settings()  # a misspelled or bad [tool.laminar] setting: one error line for every command, before it runs
    root = storage.resolve_root(root or os.environ.get("LAMINAR_ROOT") or ".laminar/lake")
    home = os.path.abspath(os.environ.get("DAGSTER_HOME") or ".dagster_home")
    ctx.obj = CliContext(root=root, dagster_home=home, debug=debug, flows=flows)


def emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def lit(value) -> str:
    """Engine, Spark or user text inside a rich markup string: `[...]` in it stays text (Spark's
    `Input [9]: [ts#1, ...]`, a LaminarError's `[flow=...]`) instead of being read as a style tag."""
    return escape(str(value))


def add_row(table: Table, *cells) -> None:
    """A table row whose text is shown literally, like `_lit`; a styled cell is passed as a rich `Text`."""
    table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in cells))


def pool_wait_notes(status, doing: str, wait_seconds: float, option: str = "") -> Callable[[str], None]:
    """What a run a command executes says while it waits for a concurrency slot another run holds, and when it
    failed a run whose process is gone (`execute_request`'s `notify`): a line each (a status line is not shown
    in a log), a wait with its bound (and the option setting it), and the status saying it waits."""
    def notify(note: str) -> None:
        waiting = note.startswith("waiting")
        bound = f" (giving up after {wait_seconds:.0f} s{', ' + option if option else ''})"
        console.print(note + bound if waiting else note, markup=False)
        if waiting:
            status.update(lit(f"{doing}: waiting for another run"))
    return notify


_TOP_LEVEL_OPTIONS = ("--root", "--flows", "--debug")  # the options `app`'s callback takes, before any command


def usage_error(exc) -> NoReturn:
    """A bad command line: typer's message (it names the option or argument) as one red line with where to
    find help, and typer's exit code (2 for usage errors). `laminar` alone shows the help instead."""
    message = exc.format_message().strip()
    if type(exc).__name__ == "NoArgsIsHelpError":  # the message is the help (typer's rich help is printed already)
        if message:
            err_console.print(message, markup=False, highlight=False)
    else:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else " (see --help)"
        option = getattr(exc, "option_name", None)
        if ctx is not None and ctx.parent is not None and option in _TOP_LEVEL_OPTIONS:
            # `laminar serve --root X`: an option of `laminar` itself, written after the command
            hint = f"; {option} is an option of `laminar` itself and goes before the command: " \
                   f"`laminar {option} ... {ctx.info_name} ...` (see `laminar --help`)"
        err_console.print(f"[red]error:[/red] {lit(message + hint)}", soft_wrap=True)
    sys.exit(exc.exit_code)


INTERRUPTED = ("what was committed is kept and nothing is half-applied; a run cut short (the running steps "
               "finish, no new one starts) is recorded as failed, and its partitions are settled by their next run")


def interrupted() -> None:
    """The one line a Ctrl-C ends a command with (exit code 130): that it was interrupted, and the state it left."""
    err_console.print(f"[red]interrupted:[/red] {INTERRUPTED}", soft_wrap=True)


def catalog_schema() -> str | None:
    """The catalog schema the CLI's engines register tables in and `laminar sql` reads `<schema>.<table>` from:
    LAMINAR_CATALOG (read when a command runs); None: no catalog (docs/catalog.md)."""
    return os.environ.get("LAMINAR_CATALOG") or None


def main() -> NoReturn:
    """Entry point: a LaminarError becomes one red line and exit 1, a usage error one red line and exit 2. The
    process ends with that code once its output is flushed, never with a crash of the interpreter's teardown
    after the command (laminar_assets/process_exit.py): the code says what the command did."""
    from laminar_assets.process_exit import run_then_exit

    run_then_exit(_run_command)


def _run_command() -> int:
    import warnings

    debug = "--debug" in sys.argv
    warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")
    try:
        # Outside standalone mode typer returns, not raises, the code of a `typer.Exit(code)` a command raised, and
        # 130 for an interrupt it caught (commands themselves return None): that code is the exit code.
        code = app(standalone_mode=False)
        if not isinstance(code, int) or isinstance(code, bool):
            return 0
        if code == 130:
            interrupted()
        return code
    except LaminarError as exc:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {lit(exc)}", soft_wrap=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        interrupted()
        sys.exit(130)
    except USAGE_ERRORS as exc:
        usage_error(exc)
    except Exception as exc:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {type(exc).__name__}: {lit(exc)} (run with --debug for the traceback)",
                          soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
