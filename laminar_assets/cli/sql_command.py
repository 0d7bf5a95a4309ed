"""`laminar sql`: one Spark SQL query over the lake's tables and the `laminar_system` tables."""

from __future__ import annotations

import json
from contextlib import nullcontext

import typer
from rich.table import Table
from rich.text import Text

from .app import CliContext, add_row, app, catalog_schema, console, emit_json, err_console


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)  # numbers, booleans, arrays, maps, structs as JSON


@app.command()
def sql(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="One Spark SQL query (or SHOW, DESCRIBE, EXPLAIN), e.g. "
                                "\"SELECT * FROM laminar_system.runs\"."),
    limit: int = typer.Option(100, "--limit", min=1, help="Rows to show at most (the driver collects no more)."),
    as_json: bool = typer.Option(False, "--json", help="A JSON list of row objects."),
) -> None:
    """Spark SQL over the lake: every sink and stage table by its name, the raw sources, and
    laminar_system.dag_topology / .partitions / .runs / .flow_outcomes / .flow_stats / .exports / .dead_letters; with
    LAMINAR_CATALOG set, the tables registered in that catalog schema too (`laminar.vwap_1m`). Reads
    only: one query, SHOW, DESCRIBE or EXPLAIN; any other statement is refused before anything runs."""
    from laminar_assets.engine import SparkOptions, build_session
    from laminar_assets.engine.report import jsonable, run_query

    c: CliContext = ctx.obj
    c.require_lake()
    specs = c.specs()
    with nullcontext() if as_json else console.status("running the query..."):
        result = run_query(lambda: build_session(SparkOptions.from_env()), c.root, specs, query, limit=limit,
                           exports=c.exports(), catalog=catalog_schema())
    more = f"showing the first {limit} rows; the query returned more (raise --limit)" if result.truncated else None
    if as_json:
        emit_json(result.records())
        if more:
            err_console.print(more, markup=False, highlight=False)
        return
    table = Table()
    for name in result.columns:
        table.add_column(Text(name), overflow="fold")  # names are text, not markup; values wrap, never cut
    for row in result.rows:
        add_row(table, *(_cell(jsonable(v)) for v in row))
    console.print(table)
    console.print(more or f"{len(result.rows)} row{'s' if len(result.rows) != 1 else ''}", markup=False,
                  highlight=False)

