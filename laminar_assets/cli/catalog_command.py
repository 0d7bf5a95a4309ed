"""`laminar catalog`: register every table the project's flows, stages and exports wrote in the catalog."""

from __future__ import annotations

import typer

from laminar_assets.errors import LaminarError

from .app import CliContext, app, catalog_schema, console, emit_json


@app.command()
def catalog(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="The report as JSON.")) -> None:
    """Register every table Laminar wrote (sinks, stages, state, quarantine, dead letters) in the catalog schema
    LAMINAR_CATALOG names, as external Delta tables at their locations (idempotent; runs register their own
    tables too), and list the schema's entries no flow claims any more: left in place, never dropped."""
    c: CliContext = ctx.obj
    c.require_lake()
    if not catalog_schema():
        raise LaminarError("no catalog schema: set LAMINAR_CATALOG (e.g. `LAMINAR_CATALOG=laminar`; docs/catalog.md)")
    engine = c.engine()
    report = engine.sync_catalog(c.specs(), c.exports())
    if as_json:
        emit_json(report.to_json())
        return
    for label, names in (("created", report.created), ("repointed", report.repointed),
                         ("properties updated", report.updated), ("unchanged", report.unchanged)):
        if names:
            console.print(f"{label}: {', '.join(f'{report.schema}.{n}' for n in names)}", markup=False)
    for old, new in report.renamed:
        console.print(f"renamed: {report.schema}.{old} -> {report.schema}.{new}", markup=False)
    if report.left:
        console.print(f"left in place (no flow, stage or export writes them any more; drop them yourself if they are "
                      f"not wanted): {', '.join(f'{report.schema}.{n}' for n in report.left)}", markup=False)
