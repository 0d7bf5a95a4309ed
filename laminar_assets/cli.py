"""The `laminar` command line: a thin layer over the engine and the Dagster definitions."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import NoReturn

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from laminar_assets.errors import LakeNotFoundError, LaminarError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Incremental time-window rollups over Delta tables (Spark + Dagster).")
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

# What typer raises for a bad command line (unknown option, bad value, missing argument): its own exceptions
# since it vendors click (typer.TyperException), click's before that. They carry the message naming the
# option and the exit code (2 for usage errors).
USAGE_ERRORS = tuple(t for t in (getattr(typer, "TyperException", None), click.ClickException) if t is not None)


@dataclass
class CliContext:
    """Options shared by every command."""

    root: str
    dagster_home: str
    debug: bool

    def require_lake(self) -> None:
        """Commands that read a lake fail on a root that is not there (a mistyped --root, or no lake created
        yet) instead of reporting an empty lake; commands that create one (demo, generate) do not call this."""
        if os.path.isdir(self.root):
            return
        found = "is not a directory" if os.path.exists(self.root) else "does not exist"
        raise LakeNotFoundError(f"storage root {self.root} {found}: expected a lake (Delta tables) there; pass the "
                                "right --root (or set LAMINAR_ROOT), or create a lake with `laminar demo`")

    def specs(self):
        from laminar_assets.flows import load_specs

        return load_specs()

    def spec(self, name: str):
        specs = {s.name: s for s in self.specs()}
        if name not in specs:
            raise LaminarError(f"unknown flow {name!r}; known flows: {', '.join(sorted(specs))}", flow=name)
        return specs[name]

    def engine(self):
        from laminar_assets.engine import Engine, SparkOptions, build_session

        return Engine(build_session(SparkOptions.from_env()), self.root)

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

    def definitions(self, *, stop_spark_per_run: bool = False):
        from laminar_assets.definitions import build_definitions
        from laminar_assets.resources import LaminarResource, SparkResource
        from laminar_assets.settings import load_settings

        resources = {"laminar": LaminarResource(root=self.root, spark=SparkResource(stop_at_end=stop_spark_per_run))}
        return build_definitions(self.specs(), load_settings(), resources=resources)


@app.callback()
def _main(
    ctx: typer.Context,
    root: str = typer.Option(None, "--root", help="Storage root of the Delta tables (default $LAMINAR_ROOT or ./.laminar/lake)."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    root = os.path.abspath(root or os.environ.get("LAMINAR_ROOT") or ".laminar/lake")
    home = os.path.abspath(os.environ.get("DAGSTER_HOME") or ".dagster_home")
    ctx.obj = CliContext(root=root, dagster_home=home, debug=debug)


def _emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _lit(value) -> str:
    """Engine, Spark or user text inside a rich markup string: `[...]` in it stays text (Spark's
    `Input [9]: [ts#1, ...]`, a LaminarError's `[flow=...]`) instead of being read as a style tag."""
    return escape(str(value))


def _add_row(table: Table, *cells) -> None:
    """A table row whose text is shown literally, like `_lit`; a styled cell is passed as a rich `Text`."""
    table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in cells))


@app.command()
def demo(
    ctx: typer.Context,
    rows: int = typer.Option(3000, "--rows", min=50, help="Trades in the first batch (the second batch is a quarter)."),
    seed: int = typer.Option(7, "--seed", help="Random seed of the generator."),
) -> None:
    """The main job: generate sources, let Dagster's sensors bring every asset up to date, commit late
    rows, corrections and cancellations, and let Dagster bring everything up to date again."""
    from laminar_assets.demo.run import run_demo

    c: CliContext = ctx.obj
    defs = c.definitions()
    instance = c.instance()
    with console.status("starting Spark and the Dagster instance...") as status:
        def progress(row):
            status.update(_lit(f"{row.flow} {row.partition}: {row.mode} ({row.reason})"))

        steps = run_demo(defs, instance, c.specs(), c.root, rows=rows, seed=seed, on_run=progress)
    failed = 0
    for step in steps:
        b = step.batch
        console.print(f"\n[bold]{_lit(step.title)}[/bold]: appended {b.appended}, late {b.late}, "
                      f"duplicates {b.duplicates}, corrected {b.updated}, cancelled {b.deleted}, broken {b.bad}; "
                      f"raw_trades versions {_lit(list(b.versions))}; "
                      f"{step.requests} runs from {step.sensor_ticks} sensor ticks in {step.seconds:.1f}s")
        table = Table("flow", "partition", "mode", "reason", "versions", "rows read", "sink rows", "quarantined",
                      "seconds")
        for r in step.runs:
            failed += not r.success
            _add_row(table, r.flow, r.partition, r.mode if r.success else Text("FAILED", style="red"),
                     r.reason if r.success else r.error, r.versions, r.rows_read, r.sink_rows, r.quarantined,
                     f"{r.seconds:.2f}")
        console.print(table)
    console.print(f"\nDelta tables: {c.root}\nNext: `make ui` (or `laminar serve`) starts Spark Connect and the Dagster "
                  "UI + daemon on http://127.0.0.1:3000 with the sensors on; they continue from here without "
                  "re-running anything. Then `laminar generate --batch 2` commits new data and the sensors bring "
                  "every flow up to date.", markup=False)
    if failed:
        raise LaminarError(f"{failed} run(s) failed; see the table above")


@app.command()
def generate(
    ctx: typer.Context,
    rows: int = typer.Option(1000, "--rows", min=1),
    batch: int = typer.Option(1, "--batch", help="Batch number (0 creates the sources; later batches add late rows etc.)."),
    late_share: float = typer.Option(0.05, "--late-share", min=0.0, max=1.0),
    duplicate_share: float = typer.Option(0.02, "--duplicate-share", min=0.0, max=1.0),
    update_share: float = typer.Option(0.02, "--update-share", min=0.0, max=1.0),
    delete_share: float = typer.Option(0.01, "--delete-share", min=0.0, max=1.0),
    bad_share: float = typer.Option(0.003, "--bad-share", min=0.0, max=1.0,
                                    help="Share of rows that break raw_trades' contract rules."),
    seed: int = typer.Option(7, "--seed"),
) -> None:
    """Write more source commits to raw_trades (creating the sources if needed)."""
    from laminar_assets.demo.generator import BatchOptions, recent_start, write_batch

    # a new raw_trades starts a few hours before now, as `laminar demo` does; later batches continue it
    s = write_batch(ctx.obj.root, BatchOptions(rows=rows, late_share=late_share, duplicate_share=duplicate_share,
                                               update_share=update_share, delete_share=delete_share,
                                               bad_share=bad_share, seed=seed, start=recent_start()),
                    batch=batch)
    console.print(f"raw_trades: appended {s.appended}, late {s.late}, duplicates {s.duplicates}, corrected "
                  f"{s.updated}, cancelled {s.deleted}; new versions {list(s.versions)}", markup=False)


@app.command()
def dag(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """The topology: sources, shared stages and flows."""
    from laminar_assets.engine.report import topology

    rows = topology(ctx.obj.specs())
    if as_json:
        _emit_json(rows)
        return
    table = Table("node", "kind", "inputs", "outputs", "shared", "partitioning")
    for r in rows:
        _add_row(table, r["node"], r["kind"], ", ".join(r["inputs"]), ", ".join(r["outputs"]),
                 "yes" if r["is_shared"] else "", r["partitioning"] or "")
    console.print(table)


def _default_partition(c: CliContext, spec) -> str:
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.engine.inspect import new_commits
    from laminar_assets.engine.windows import partition_key

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
    """Logical (the spec), physical (Spark's plan) and strategy (mode, reason, versions, estimates). Writes nothing."""
    from laminar_assets.engine.report import explain as explain_report
    from laminar_assets.engine.windows import partition_interval

    c: CliContext = ctx.obj
    c.require_lake()
    spec = c.spec(flow)
    key = partition or _default_partition(c, spec)
    try:
        partition_interval(key, spec.granularity)
    except ValueError as exc:
        raise LaminarError(f"bad --partition for '{flow}': {exc}", flow=flow) from None
    report = explain_report(c.engine(), spec, key)
    if as_json:
        _emit_json(report)
        return
    lg, st = report["logical"], report["strategy"]
    # Everything below but the headings is spec, engine or Spark text: printed without markup.
    console.print("[bold]== logical ==[/bold]")
    console.print(f"{lg['kind']} {lg['name']}: {lg['description']}", markup=False)
    console.print(f"source {', '.join(lg['sources'])}, event time {lg['event_time']}, filter {lg['filter'] or '-'}",
                  markup=False)
    if lg["kind"] == "flow":
        w = lg["window"]
        console.print(f"window {w['kind']} {w['size_seconds']:.0f}s every {w['slide_seconds']:.0f}s, keys {lg['keys']}",
                      markup=False)
        for a in lg["aggregates"]:
            console.print(f"  {a['name']} = {a['kind']}({a['column'] or '*'})  state {a['state_columns']}  "
                          f"{'retractable' if a['retractable'] else 'not retractable'}", markup=False)
    console.print("\n[bold]== physical ==[/bold]")
    console.print(report["physical"], markup=False, highlight=False, soft_wrap=True)  # Spark's lines, verbatim
    console.print(f"\n[bold]== strategy ==[/bold]\npartition {_lit(st['partition'])}: [bold]{_lit(st['mode'])}[/bold] "
                  f"({_lit(st['reason'])}) — {_lit(st['detail'])}")
    console.print(f"watermark {st['watermark']['source_versions'] if st['watermark'] else None} -> target "
                  f"{st['to_versions']}; pending after this run {st['pending_versions']}", markup=False)
    console.print(f"commits to read: {len(st['pending_commits'])}; estimated read {st['estimated_read']}",
                  markup=False)
    console.print(f"refill scope: {'whole partition' if st['refill_all'] else st['refill'] or 'none'}", markup=False)


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """Per flow: partitions materialized, stale partitions and why, watermarks vs source versions."""
    from laminar_assets.engine.report import status as status_report

    ctx.obj.require_lake()
    rows = status_report(ctx.obj.root, ctx.obj.specs())
    if as_json:
        _emit_json(rows)
        return
    table = Table("flow", "kind", "source versions", "materialized", "stale", "pending versions")
    for r in rows:
        stale = ", ".join(f"{s['partition']} ({s['reason']})" for s in r["stale_partitions"]) or "-"
        _add_row(table, r["flow"], r["kind"], json.dumps(r["source_versions"]), r["partitions_materialized"], stale,
                 r["pending_versions"])
    console.print(table)


@app.command()
def refill(
    ctx: typer.Context,
    flow: str = typer.Argument(...),
    partition_range: str = typer.Option(None, "--partition-range", help="A...B (inclusive); default: every materialized partition."),
) -> None:
    """Recompute partitions through Dagster, recorded with reason FORCED_BY_USER."""
    import dagster as dg

    from laminar_assets.assets import FORCE_TAG
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.engine.windows import partition_interval
    from laminar_assets.orchestrate import execute_request, failure_message
    from laminar_assets.sensors import RANGE_END, RANGE_START

    c: CliContext = ctx.obj
    c.require_lake()
    spec = c.spec(flow)
    if partition_range:
        if "..." not in partition_range:
            raise LaminarError(f"--partition-range must look like A...B, found {partition_range!r}", flow=flow)
        start, end = partition_range.split("...", 1)
    else:
        done = CheckpointStore(c.root).partitions(flow)
        if not done:
            raise LaminarError(f"'{flow}' has no materialized partitions; pass --partition-range A...B", flow=flow)
        start, end = done[0], done[-1]
    for key in (start, end):
        try:
            partition_interval(key, spec.granularity)
        except ValueError as exc:
            raise LaminarError(f"bad partition in --partition-range: {exc}", flow=flow) from None
    request = dg.RunRequest(asset_selection=[dg.AssetKey(flow)],
                            tags={RANGE_START: start, RANGE_END: end, FORCE_TAG: "true"})
    with console.status(_lit(f"refilling {flow} {start}...{end}")):
        outcome = execute_request(c.definitions(), request, c.instance())
    if not outcome.success:
        raise LaminarError(f"refill of {flow} {start}...{end} failed (Dagster run {outcome.run_id[:8]}): "
                           f"{failure_message(outcome)}")
    mats = outcome.asset_materializations_for_node(flow)
    console.print(f"refilled {flow}: {len(mats)} partition(s) {start}...{end}, reason FORCED_BY_USER "
                  f"(run {outcome.run_id})", markup=False)


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
    folder = os.path.join(c.root, "_laminar", "quarantine")
    names = [source] if source else sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    out = [row for name in names for row in summarize(os.path.join(folder, name), examples=examples)]
    if source and not out and not os.path.isdir(os.path.join(folder, source)):
        raise LaminarError(f"no quarantine table for source {source!r} under {folder}", table=source)
    if as_json:
        _emit_json(out)
        return
    table = Table("source", "flow", "rule", "rows", "source versions", "example row")
    for r in out:
        _add_row(table, r["source"], r["flow"], r["rule"], r["rows"], f"{r['min_version']}..{r['max_version']}",
                 (r["examples"] or [""])[0])
    console.print(table if out else "nothing quarantined")


@app.command()
def check(
    ctx: typer.Context,
    demo_first: bool = typer.Option(False, "--demo", help="Run the demo pipeline first (fresh sources)."),
    rows: int = typer.Option(200, "--rows", min=50, help="Demo size with --demo."),
    sample: int = typer.Option(8, "--sample", min=1, help="Windows per partition for the equivalence check."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Quality gate: every contract (Great Expectations) and equivalence check on every materialized
    partition; exits non-zero if any fails."""
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.checks import contract_result, equivalence_result
    from laminar_assets.contracts import load_contracts
    from laminar_assets.definitions import CONTRACTS
    from laminar_assets.engine import FlowSpec

    c: CliContext = ctx.obj
    if demo_first:
        from laminar_assets.demo.run import run_demo

        with console.status("running the demo pipeline..."):
            run_demo(c.definitions(), c.instance(), c.specs(), c.root, rows=rows, seed=7)
    c.require_lake()
    contracts = load_contracts(CONTRACTS)
    engine = c.engine()
    store = CheckpointStore(c.root)
    rows_out = []
    with console.status("checking...") as status:
        for spec in c.specs():
            for key in store.partitions(spec.name):
                status.update(_lit(f"{spec.name} {key}"))
                if spec.sink in contracts:
                    r = contract_result(engine, spec, contracts[spec.sink], key)
                    rows_out.append({"check": "contract", "asset": spec.name, "partition": key, "passed": r.passed,
                                     "details": r.metadata["failures"].value})
                if isinstance(spec, FlowSpec):
                    r = equivalence_result(engine, spec, key, sample=sample)
                    rows_out.append({"check": "equivalence", "asset": spec.name, "partition": key, "passed": r.passed,
                                     "details": r.metadata.get("mismatched_windows").value
                                     if "mismatched_windows" in r.metadata else []})
    failed = [r for r in rows_out if not r["passed"]]
    if as_json:
        _emit_json(rows_out)
    else:
        table = Table("check", "asset", "partitions", "passed", "failures")
        summary: dict[tuple, list] = {}
        for r in rows_out:
            summary.setdefault((r["check"], r["asset"]), []).append(r)
        for (name, asset), items in summary.items():
            bad = [i for i in items if not i["passed"]]
            _add_row(table, name, asset, len(items), Text("yes", style="green") if not bad else Text("no", style="red"),
                     "; ".join(f"{i['partition']}: {json.dumps(i['details'], default=str)[:200]}" for i in bad))
        console.print(table)
    if not rows_out:
        raise LaminarError(f"nothing to check under {c.root}: materialize something first (or pass --demo)")
    if failed:
        raise LaminarError(f"{len(failed)} of {len(rows_out)} checks failed: "
                           + ", ".join(sorted({f"{r['check']} on {r['asset']}" for r in failed})))
    if not as_json:
        console.print(f"all {len(rows_out)} checks passed")


@app.command()
def serve(
    ctx: typer.Context,
    ui_port: int = typer.Option(3000, "--ui-port", help="Port of the Dagster UI (on 127.0.0.1)."),
    spark_port: int = typer.Option(15002, "--spark-port", help="Port of the Spark Connect server (on 127.0.0.1)."),
    spark_remote: str = typer.Option(None, "--spark-remote", envvar="LAMINAR_SPARK_REMOTE",
                                     help="Use this Spark Connect endpoint (sc://host:port) instead of starting one."),
    driver_memory: str = typer.Option("4g", "--driver-memory", help="Memory of the Spark Connect server's driver."),
    local_spark: bool = typer.Option(False, "--local-spark", help="Start no Connect server: every run starts its "
                                     "own Spark JVM (slow; for comparison)."),
) -> None:
    """Start the deployment: a Spark Connect server and `dagster dev` (UI + daemon) on 127.0.0.1.
    Sensors launch runs that connect to the warm Spark; Ctrl-C stops everything."""
    from laminar_assets.deploy.connect_server import ConnectServerOptions
    from laminar_assets.deploy.serve import ServeOptions, serve as run_serve
    from laminar_assets.engine import SparkOptions

    c: CliContext = ctx.obj
    c.instance()  # DAGSTER_HOME with the project's dagster.yaml
    logs = os.path.join(os.path.dirname(c.root), "logs")  # .laminar/logs beside .laminar/lake
    options = ServeOptions(root=c.root, dagster_home=c.dagster_home, ui_port=ui_port, spark_remote=spark_remote,
                           local_spark=local_spark, log_dir=logs, spark=ConnectServerOptions(
                               port=spark_port, log_path=os.path.join(logs, "spark-connect.log"),
                               spark=SparkOptions(driver_memory=driver_memory)))

    def ready(d) -> None:
        spark = f"Spark Connect server {d.remote} (log {logs}/spark-connect.log)" if d.spark else \
            f"Spark Connect endpoint {d.remote} (not started here)" if d.remote else \
            "local Spark: every run starts its own JVM (--local-spark)"
        console.print(f"[bold]Laminar is up[/bold]\n  Dagster UI and daemon: {d.ui_url}  (log {logs}/dagster.log)"
                      f"\n  {spark}\n  Delta tables: {c.root}\n  DAGSTER_HOME: {c.dagster_home}\n"
                      "Sensors are on: commit to a source (e.g. `laminar generate --batch 1`) and watch the runs. "
                      "Ctrl-C stops both processes.", markup=True, highlight=False)

    console.print("starting the Spark Connect server and Dagster (about 30 s)...")
    code = run_serve(options, on_ready=ready)
    if code:
        raise LaminarError(f"a process of the deployment exited unexpectedly (code {code}); see {logs}/")


def _usage_error(exc) -> NoReturn:
    """A bad command line: typer's message (it names the option or argument) as one red line with where to
    find help, and typer's exit code (2 for usage errors). `laminar` alone shows the help instead."""
    message = exc.format_message().strip()
    if type(exc).__name__ == "NoArgsIsHelpError":  # the message is the help (typer's rich help is printed already)
        if message:
            err_console.print(message, markup=False, highlight=False)
    else:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else " (see --help)"
        err_console.print(f"[red]error:[/red] {_lit(message + hint)}", soft_wrap=True)
    sys.exit(exc.exit_code)


def main() -> None:
    """Entry point: a LaminarError becomes one red line and exit 1, a usage error one red line and exit 2."""
    import warnings

    debug = "--debug" in sys.argv
    warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")
    try:
        app(standalone_mode=False)
    except LaminarError as exc:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {_lit(exc)}", soft_wrap=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("[red]aborted[/red]")
        sys.exit(130)
    except USAGE_ERRORS as exc:
        _usage_error(exc)
    except Exception as exc:
        if debug:
            raise
        err_console.print(f"[red]error:[/red] {type(exc).__name__}: {_lit(exc)} (run with --debug for the traceback)",
                          soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
