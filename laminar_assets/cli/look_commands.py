"""Commands that look at a lake and write nothing: the graph, a plan explained, status, quarantine."""

from __future__ import annotations

import json

import typer
from rich.table import Table
from rich.text import Text

from laminar_assets import storage
from laminar_assets.errors import LaminarError

from .app import CliContext, add_row, app, console, emit_json, lit


@app.command()
def dag(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The topology: sources, shared stages and flows."""
    from laminar_assets.engine.report import topology

    rows = topology(ctx.obj.specs())
    if as_json:
        emit_json(rows)
        return
    table = Table("node", "kind", "inputs", "outputs", "shared", "partitioning")
    for r in rows:
        add_row(table, r["node"], r["kind"], ", ".join(r["inputs"]), ", ".join(r["outputs"]),
                 "yes" if r["is_shared"] else "", r["partitioning"] or "")
    console.print(table)


def default_partition(c: CliContext, spec) -> str:
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.engine import partition_key
    from laminar_assets.engine.report import new_commits

    done = CheckpointStore(c.root).partitions(spec.name)
    if done:
        return done[-1]
    changes = new_commits(c.root, spec.sources[0], spec.event_time, None)
    if changes is None or not changes.ranges:
        raise LaminarError(f"no data in '{spec.sources[0]}' yet: pass --partition", flow=spec.name)
    return partition_key(changes.ranges[-1].start, spec.granularity)


@app.command()
def explain(
    ctx: typer.Context,
    flow: str = typer.Argument(..., help="Flow or stage name."),
    partition: str = typer.Option(None, "--partition", help="Partition key (default: the latest materialized)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """SQL (for a view), logical (the spec), physical (Spark's plan) and strategy (mode, reason, versions). Writes nothing."""
    from laminar_assets.engine import partition_interval
    from laminar_assets.engine.report import explain as explain_report

    c: CliContext = ctx.obj
    c.require_lake()
    spec = c.spec(flow)
    key = partition or default_partition(c, spec)
    try:
        partition_interval(key, spec.granularity)
    except ValueError as exc:
        raise LaminarError(f"bad --partition for '{flow}': {exc}", flow=flow) from None
    report = explain_report(c.engine(), spec, key)
    if as_json:
        emit_json(report)
        return
    lg, st = report["logical"], report["strategy"]
    # Everything below but the headings is spec, engine or Spark text: printed without markup.
    if lg["sql"]:
        console.print(f"[bold]== sql ==[/bold] ({lit(lg['origin'])})")
        console.print(lg["sql"], markup=False, highlight=False)
        console.print()
    console.print("[bold]== logical ==[/bold]" + (" (compiled from the SQL)" if lg["sql"] else ""))
    console.print(f"{lg['kind']} {lg['name']}: {lg['description']}", markup=False)
    console.print(f"source {', '.join(lg['sources'])}, event time {lg['event_time']}, filter {lg['filter'] or '-'}",
                  markup=False)
    if lg["kind"] == "flow":
        w = lg["window"]
        console.print(f"window {w['kind']} {w['size_seconds']:.0f}s every {w['slide_seconds']:.0f}s, keys {lg['keys']}",
                      markup=False)
        for j in lg["joins"]:
            console.print(f"  {j['how']} join {j['table']} (read whole) on {j['on']}, adds {', '.join(j['columns'])}",
                          markup=False)
        for name, expr in lg["derived"].items():
            console.print(f"  derived {name} = {expr}", markup=False)
        for a in lg["aggregates"]:
            what = a["expr"] if a["kind"] == "sql" else f"{a['kind']}({a['column'] or '*'})"
            console.print(f"  {a['name']} = {what}  state {a['state_columns']}  "
                          f"{'retractable' if a['retractable'] else 'not retractable'}"
                          f"{'  (hidden: used by post)' if a['name'] in lg['hidden'] else ''}", markup=False)
        for name, expr in lg["post"].items():
            console.print(f"  post {name} = {expr}", markup=False)
        if lg["not_incrementalizable"]:
            console.print(f"refill-only: {', '.join(lg['not_incrementalizable'])} cannot merge; every run recomputes "
                          "the windows its changes touch (QUERY_NOT_INCREMENTALIZABLE)", markup=False)
    console.print("\n[bold]== physical ==[/bold]")
    console.print(report["physical"], markup=False, highlight=False, soft_wrap=True)  # Spark's lines, verbatim
    console.print(f"\n[bold]== strategy ==[/bold]\npartition {lit(st['partition'])}: [bold]{lit(st['mode'])}[/bold] "
                  f"({lit(st['reason'])}) — {lit(st['detail'])}")
    console.print(f"watermark {st['watermark']['source_versions'] if st['watermark'] else None} -> target "
                  f"{st['to_versions']}; pending after this run {st['pending_versions']}", markup=False)
    console.print(f"commits to read: {len(st['pending_commits'])}; estimated read {st['estimated_read']}",
                  markup=False)
    console.print(f"refill scope: {'whole partition' if st['refill_all'] else st['refill'] or 'none'}", markup=False)


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json"),
           since: str = typer.Option("24h", "--since", help="Period of the hit and fallback rates: a duration "
                                     "back from now ('24h', '7d', '30m') or 'all'.")) -> None:
    """Per flow: partitions materialized, stale partitions and why, watermarks vs source versions; then
    how its partition runs went over `--since`: merged, refilled (by reason, windows per refill) or NOOP;
    then per export: the version delivered, its lag behind the source table, the last delivery."""
    from laminar_assets.engine.report import describe_failed_runs, export_status, stats_by_flow
    from laminar_assets.engine.report import status as status_report

    ctx.obj.require_lake()
    start = _since(since)
    rows = status_report(ctx.obj.root, ctx.obj.specs())
    rates = {s.flow: s for s in stats_by_flow(ctx.obj.root, ctx.obj.specs(), since=start)}
    exports = export_status(ctx.obj.root, ctx.obj.exports(), ctx.obj.specs())
    if as_json:  # flows first, then one row per export (its "kind" is "export", its target's kind "target_kind")
        emit_json([{**r, "rates": rates[r["flow"]].to_json()} for r in rows]
                  + [{**e, "kind": "export", "target_kind": e["kind"]} for e in exports])
        return
    any_held = any(r["held_partitions"] for r in rows)  # the column only when a run holds a partition
    table = Table("flow", "kind", "source versions", "materialized", "failing", "stale",
                  *(["held by a run"] if any_held else []), "pending versions")
    for r in rows:
        stale = ", ".join(f"{s['partition']} ({s['reason']})" for s in r["stale_partitions"]) or "-"
        failing = "; ".join(f"{f['partition']}: {describe_failed_runs(f)}" for f in r["failing_partitions"]) or "-"
        held = "; ".join(f"{h['partition']}: run {h['run_id']} pid {h['pid']} on {h['host']} since {h['since']}"
                         f"{' (gone: the next run takes it over)' if h['gone'] else ''}"
                         for h in r["held_partitions"]) or "-"
        add_row(table, r["flow"], r["kind"], json.dumps(r["source_versions"]), r["partitions_materialized"],
                Text(failing, style="red") if r["failing_partitions"] else failing, stale, *([held] if any_held else []),
                r["pending_versions"])
    console.print(table)
    period = "all recorded runs" if start is None else f"since {start:%Y-%m-%d %H:%M} UTC"
    runs = Table("flow", "partition runs", "incremental", "refilled", "noop", "hit rate", "refills by reason",
                 "windows / refill", "rows read / changed", title=f"partition runs, {period}")
    for s in rates.values():
        reasons = ", ".join(f"{k} {v}" for k, v in s.refills_by_reason.items()) or "-"
        add_row(runs, s.flow, s.partition_runs, _pct(s.share(s.incremental)), _pct(s.share(s.refill)),
                _pct(s.share(s.noop)), _pct(s.hit_rate), reasons, _num(s.windows_per_refill),
                _num(s.rows_read_per_change))
    console.print(runs)
    if exports:
        _print_exports(exports)


def _print_exports(exports: list[dict]) -> None:
    from laminar_assets.engine.report import describe_export_failures

    table = Table("export", "source", "target", "delivered version", "source version", "lag (versions)", "lag (s)",
                  "last delivery", "dead letters", "failing", title="exports")
    for e in exports:
        last = "never" if e["delivered_at"] is None else \
            f"{e['delivered_at'][:19].replace('T', ' ')} {e['mode']} ({e['reason']}): +{e['rows_upserted']} -{e['rows_deleted']}"
        if e.get("pending_rows"):
            last += f", {e['pending_rows']} pending"
        failing = describe_export_failures(e["failed"]) if e["failed"] else "-"
        letters = e.get("dead_letters")
        add_row(table, e["export"], e["source"], e["target"], _num(e["delivered_version"]), _num(e["source_version"]),
                _num(e["lag_versions"]), _num(e["lag_seconds"]), last,
                Text(str(letters), style="yellow") if letters else _num(letters) if "dead_letters" in e else "-",
                Text(failing, style="red") if e["failed"] else failing)
    console.print(table)


def _since(text: str):
    from datetime import UTC, datetime

    from laminar_assets.engine import parse_duration

    if text.strip().lower() == "all":
        return None
    try:
        return datetime.now(UTC) - parse_duration(text)
    except (TypeError, ValueError) as exc:
        raise typer.BadParameter(f"{exc} (or 'all')", param_hint="--since") from None


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


@app.command()
def quarantine(
    ctx: typer.Context,
    source: str = typer.Argument(None, help="Source table (default: every quarantined source)."),
    examples: int = typer.Option(3, "--examples", min=0, help="Example rows per flow and rule."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Rows kept out of the flows because they broke a rule: counts by source, flow and rule."""
    from laminar_assets.engine.quarantine import summarize

    c: CliContext = ctx.obj
    c.require_lake()
    folder = storage.join(c.root, "_laminar", "quarantine")
    found = storage.list_dirs(folder)
    names = [source] if source else found
    out = [row for name in names for row in summarize(storage.join(folder, name), examples=examples)]
    if source and not out and source not in found:
        raise LaminarError(f"no quarantine table for source {source!r} under {folder}", table=source)
    if as_json:
        emit_json(out)
        return
    table = Table("source", "flow", "rule", "rows", "source versions", "example row")
    for r in out:
        add_row(table, r["source"], r["flow"], r["rule"], r["rows"], f"{r['min_version']}..{r['max_version']}",
                 (r["examples"] or [""])[0])
    console.print(table if out else "nothing quarantined")
