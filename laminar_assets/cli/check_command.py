"""`laminar check`: the quality gate over every materialized partition."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from laminar_assets.errors import LaminarError, SourceError, SpecError

from .app import CliContext, add_row, app, console, emit_json, lit, pool_wait_notes

CHUNK = 24  # partitions per check pass: one day of hourly partitions


@app.command()
def check(
    ctx: typer.Context,
    demo_first: bool = typer.Option(False, "--demo", help="Run the demo pipeline first (fresh sources; the root must "
                                    "be empty, new, or an earlier demo's lake)."),
    rows: int = typer.Option(200, "--rows", min=50, help="Demo size with --demo."),
    sample: int = typer.Option(8, "--sample", min=1, help="Windows per partition for the equivalence check."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Quality gate: every sink is its own flow's output, every file each table Laminar writes names exists,
    and every contract (Great Expectations) and equivalence check passes on every materialized partition;
    exits non-zero if any fails."""
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.contracts import CONTRACTS, load_contracts
    from laminar_assets.engine.report import describe_failed_runs, failed_runs
    from laminar_assets.orchestration.checks import contract_outcomes, equivalence_outcomes

    c: CliContext = ctx.obj
    if demo_first:
        from laminar_assets.demo import DEMO_JIT
        from laminar_assets.demo.lake import check_demo_root
        from laminar_assets.demo.run import run_demo
        from laminar_assets.deploy.embedded_targets import embedded_folder, start_embedded_targets
        from laminar_assets.orchestration.internals.in_process import POOL_WAIT_SECONDS

        check_demo_root(c.root)  # refused before anything starts (run_demo checks again before it deletes)
        # the exports deliver as in `laminar demo`: to embedded targets for the connections nothing defines
        with console.status("running the demo pipeline...") as status, \
                start_embedded_targets(c.exports(), embedded_folder(c.root), fresh=True):
            run_demo(c.definitions(jit=DEMO_JIT), c.instance(), c.specs(), c.root, rows=rows, seed=7,
                     notify=pool_wait_notes(status, "running the demo pipeline", POOL_WAIT_SECONDS))
    c.require_lake()
    contracts = load_contracts(CONTRACTS)
    engine = c.engine()
    store = CheckpointStore(c.root)
    rows_out: list[dict[str, Any]] = []
    with console.status("checking...") as status:
        seen: set[str] = set()
        for spec in c.specs():  # every sink is its own flow's output (not a source or another flow's table)
            try:
                engine.check_sink(spec, store.partitions(spec.name))
                rows_out.append({"check": "sink owner", "asset": spec.name, "partition": spec.sink, "passed": True,
                                 "details": ""})
            except (SpecError, SourceError) as exc:  # not this flow's table, or a log that cannot be read
                rows_out.append({"check": "sink owner", "asset": spec.name, "partition": spec.sink, "passed": False,
                                 "details": exc.message if isinstance(exc, SpecError) else str(exc)})  # the file
        for spec in c.specs():  # every table Laminar writes names only files that exist
            for table in engine.integrity(spec):
                if table.uri not in seen:
                    seen.add(table.uri)
                    rows_out.append({"check": "integrity", "asset": spec.name, "partition": table.table,
                                     "passed": table.ok, "details": table.describe() if not table.ok else ""})
        for spec in c.specs():
            keys = store.partitions(spec.name)
            for key in keys:  # the latest run of every partition succeeded (docs/cli.md, Failing runs)
                failed_run = failed_runs(store.load(spec.name, key))
                rows_out.append({"check": "runs", "asset": spec.name, "partition": key, "passed": failed_run is None,
                                 "details": describe_failed_runs(failed_run) if failed_run else ""})
            for i in range(0, len(keys), CHUNK):  # partitions checked together: one Spark pass per chunk
                chunk = keys[i:i + CHUNK]
                status.update(lit(f"{spec.name} {chunk[0]} ... {chunk[-1]}"))
                if spec.sink in contracts:
                    outcomes = _outcomes(chunk, contract_outcomes, engine, spec, contracts[spec.sink], chunk)
                    for key, (passed, md) in outcomes.items():
                        rows_out.append({"check": "contract", "asset": spec.name, "partition": key, "passed": passed,
                                         "details": md["failures"].value if "failures" in md else md.get("integrity", [])})
                if spec.recompute_checked:
                    outcomes = _outcomes(chunk, equivalence_outcomes, engine, spec, chunk, sample)
                    for key, (passed, md) in outcomes.items():
                        rows_out.append({"check": "equivalence", "asset": spec.name, "partition": key,
                                         "passed": passed, "details": md["mismatched_windows"].value
                                         if "mismatched_windows" in md else md.get("integrity", [])})
    failed = [r for r in rows_out if not r["passed"]]
    if as_json:
        emit_json(rows_out)
    else:
        table = Table("check", "asset", "partitions", "passed", "failures")
        summary: dict[tuple, list] = {}
        for r in rows_out:
            summary.setdefault((r["check"], r["asset"]), []).append(r)
        for (name, asset), items in summary.items():
            bad = [i for i in items if not i["passed"]]
            add_row(table, name, asset, len(items), Text("yes", style="green") if not bad else Text("no", style="red"),
                     "; ".join(_failure(i) for i in bad))
        console.print(table)
    if not rows_out:
        raise LaminarError(f"nothing to check under {c.root}: materialize something first (or pass --demo)")
    if failed:
        raise LaminarError(f"{len(failed)} of {len(rows_out)} checks failed: "
                           + ", ".join(sorted({_named(r) for r in failed})))
    if not as_json:
        console.print(f"all {len(rows_out)} checks passed")


def _failure(row: dict) -> str:
    details = row["details"]
    if isinstance(details, str):  # a sentence already (integrity, sink owner, failing runs): shown whole
        if row["check"] in ("integrity", "sink owner"):
            return details
        return f"{row['partition']}: {details}"[:600 if row["check"] == "runs" else 200]
    return f"{row['partition']}: {json.dumps(details, default=str)[:200]}"


def _named(row: dict) -> str:
    """'<check> on <asset>', with the partition for failing runs (each is its own problem to look at)."""
    return f"{row['check']} on {row['asset']}" + (f" {row['partition']}" if row["check"] == "runs" else "")


def _outcomes(keys: list[str], evaluate, *args) -> dict[str, tuple[bool, dict]]:
    """`evaluate(*args)`, or every partition failed with the error when the check cannot run at all (e.g. a
    source retyped since: the failing runs say the same), so one flow does not stop the whole gate."""
    try:
        return evaluate(*args)
    except LaminarError as exc:
        return {k: (False, {"integrity": f"the check could not run: {exc.message}"}) for k in keys}
