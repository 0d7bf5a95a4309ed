"""The `laminar` command line: a thin layer over the engine (and, for runs, Dagster)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import typer
from rich.console import Console
from rich.table import Table

from laminar_assets.engine import LaminarError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Incremental time-window rollups over Delta tables.")
console = Console()
err_console = Console(stderr=True)


@dataclass
class CliContext:
    """Options shared by every command."""

    root: str
    debug: bool


@app.callback()
def _main(
    ctx: typer.Context,
    root: str = typer.Option(None, "--root", help="Storage root of the Delta tables (default: $LAMINAR_ROOT or ./.laminar/lake)."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    ctx.obj = CliContext(root=os.path.abspath(root or os.environ.get("LAMINAR_ROOT") or ".laminar/lake"), debug=debug)


def _engine(root: str):
    from laminar_assets.engine import Engine, SparkOptions, build_session

    spark = build_session(SparkOptions(master=os.environ.get("LAMINAR_SPARK_MASTER", "local[*]")))
    return Engine(spark, root)


@app.command()
def demo(
    ctx: typer.Context,
    rows: int = typer.Option(3000, "--rows", min=50, help="Trades in the first batch (the second batch is a quarter)."),
    seed: int = typer.Option(7, "--seed", help="Random seed of the generator."),
) -> None:
    """Generate the trades sources, bring every flow up to date, then apply late rows,
    corrections and cancellations and bring everything up to date again."""
    from laminar_assets.demo.run import run_demo
    from laminar_assets.flows import load_specs

    root = ctx.obj.root
    specs = load_specs()
    with console.status("starting Spark...") as status:
        engine = _engine(root)

        def progress(spec, result):
            status.update(f"{spec.name} {result.plan.partition}: {result.mode.value} ({result.reason.value})")

        steps = run_demo(engine, specs, rows=rows, seed=seed, on_result=progress)
    for step in steps:
        b = step.batch
        console.print(f"\n[bold]{step.title}[/bold] — appended {b.appended}, late {b.late}, duplicates {b.duplicates}, "
                      f"updated {b.updated}, deleted {b.deleted}; source versions {list(b.versions)}; "
                      f"{step.seconds:.1f}s")
        table = Table("flow", "partition", "mode", "reason", "versions", "rows read", "sink rows", "seconds")
        for r in step.results:
            p = r.plan
            versions = ", ".join(f"{s}: {p.from_versions.get(s)}→{v}" for s, v in p.to_versions.items())
            table.add_row(p.flow, p.partition, r.mode.value, r.reason.value, versions,
                          str(r.metrics.get("rows_read", 0)), str(r.metrics.get("sink_rows", "-")),
                          f"{sum(r.seconds.values()):.2f}")
        console.print(table)
    console.print(f"\nTables are under {root}. Explore them with any Delta reader, e.g. "
                  f"`python -c \"import deltalake; print(deltalake.DeltaTable('{root}/vwap_1m').to_pandas())\"`.")


def main() -> None:
    """Entry point: run the app; a LaminarError becomes one red line and exit code 1."""
    debug = "--debug" in sys.argv
    try:
        app(standalone_mode=False)
    except LaminarError as exc:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("[red]aborted[/red]")
        sys.exit(130)
    except Exception as exc:  # click usage errors and anything unexpected
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {type(exc).__name__}: {exc} (run with --debug for the traceback)")
        sys.exit(1)


if __name__ == "__main__":
    main()
