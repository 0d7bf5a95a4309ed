"""Commands that run the pipeline: the demo, new source data, a forced refill, the local deployment."""

from __future__ import annotations

import os
import re
import socket
from datetime import UTC, datetime

import typer
from rich.table import Table
from rich.text import Text

from laminar_assets import storage
from laminar_assets.errors import LaminarError

from .app import CliContext, add_row, app, console, lit, pool_wait_notes


@app.command()
def demo(
    ctx: typer.Context,
    rows: int = typer.Option(3000, "--rows", min=50, help="Trades in the first batch (the second batch is a quarter)."),
    seed: int = typer.Option(7, "--seed", help="Random seed of the generator."),
) -> None:
    """The main job: generate sources, let Dagster's sensors bring every asset up to date, commit late
    rows, corrections and cancellations, and let Dagster bring everything up to date again. The root must
    be empty, new, or a lake an earlier demo made (it is emptied first)."""
    from laminar_assets.demo import DEMO_JIT
    from laminar_assets.demo.lake import check_demo_root
    from laminar_assets.engine import SparkOptions
    from laminar_assets.engine.spark import start_session

    c: CliContext = ctx.obj
    check_demo_root(c.root)  # a root holding anything but an earlier demo's lake: refused before Spark starts
    # Spark's JVM starts before Dagster is imported and the definitions load: the runs' SparkResource
    # asks for these same options (a test holds the two together), so their session is this one.
    start_session(SparkOptions.from_env(jit=DEMO_JIT))
    from laminar_assets.demo.run import run_demo
    from laminar_assets.deploy.embedded_targets import embedded_folder, start_embedded_targets
    from laminar_assets.orchestration.internals.in_process import POOL_WAIT_SECONDS

    # the exports' targets: a local Postgres and webhook receiver for the connections nothing defines,
    # while the demo runs (stopped at its end, also on a failure or Ctrl-C)
    with start_embedded_targets(c.exports(), embedded_folder(c.root), fresh=True) as targets:
        defs = c.definitions(jit=DEMO_JIT)
        instance = c.instance()
        with console.status("starting Spark and the Dagster instance...") as status:
            def progress(row):
                status.update(lit(f"{row.flow} {row.partition}: {row.mode} ({row.reason})"))

            steps = run_demo(defs, instance, c.specs(), c.root, rows=rows, seed=seed, on_run=progress,
                             notify=pool_wait_notes(status, "running the demo", POOL_WAIT_SECONDS))
        _print_demo(c, targets, steps)


def _print_demo(c: CliContext, targets, steps) -> None:
    """A table per batch of the demo's runs, one of what each export delivered, and what to do next."""
    failed = 0
    for step in steps:
        b = step.batch
        console.print(f"\n[bold]{lit(step.title)}[/bold]: appended {b.appended}, late {b.late}, "
                      f"duplicates {b.duplicates}, corrected {b.updated}, cancelled {b.deleted}, broken {b.bad}; "
                      f"raw_trades versions {lit(list(b.versions))}; "
                      f"{step.requests} runs from {step.sensor_ticks} sensor ticks in {step.seconds:.1f}s")
        # versions only when a run names them (a range run records them per partition, not in total);
        # reasons fold instead of being cut off, also in a log file's 80 columns
        versions = any(r.versions for r in step.runs)
        table = Table("flow", "partition", "mode", "reason", *(["versions"] if versions else []), "rows read",
                      "sink rows", "quarantined", "seconds")
        table.columns[3].overflow = "fold"
        for r in step.runs:
            failed += not r.success
            add_row(table, r.flow, r.partition, r.mode if r.success else Text("FAILED", style="red"),
                     r.reason if r.success else r.error, *([r.versions] if versions else []), r.rows_read,
                     r.sink_rows, r.quarantined, f"{r.seconds:.2f}")
        console.print(table)
    if c.exports():
        _print_deliveries(c, targets, steps)
    console.print(next_steps(c.root, os.environ.get("LAMINAR_LOCAL_STORE")), markup=False)
    if failed:
        raise LaminarError(f"{failed} run(s) failed; see the table above")


def _print_deliveries(c: CliContext, targets, steps) -> None:
    """What each export delivered during the demo (its deliveries' rows summed), the version its target holds
    against its source table's, and where to see it (an embedded target's database or file, else the target)."""
    from laminar_assets.engine.report import export_status

    runs = [r for step in steps for r in step.runs]
    table = Table("export", "source", "delivered", "delivered version", "source version", "where",
                  title="exports: what the demo delivered")
    table.columns[5].overflow = "fold"
    by_name = {e.name: e for e in c.exports()}
    for e in export_status(c.root, c.exports(), c.specs()):
        mine = [r for r in runs if r.flow == e["export"]]
        failed = [r for r in mine if not r.success]
        total = {k: sum(int(r.delivered.get(k) or 0) for r in mine) for k in ("upserted", "deleted", "sent")}
        what: str | Text
        if e["kind"] == "webhook":
            what = f"{total['sent']} row(s) sent in {len(mine)} delivery(ies)"
            if e.get("dead_letters"):
                what = f"{what}, {e['dead_letters']} dead letter(s)"
        else:
            what = f"{total['upserted']} row(s) upserted, {total['deleted']} deleted in {len(mine)} delivery(ies)"
        if failed:
            what = Text(f"{len(failed)} delivery(ies) FAILED; " + what, style="red")
        export = by_name[e["export"]]
        where = targets.where(export.connection) or e["target"]
        if export.kind == "postgres":
            where = f"table {export.schema_name}.{export.table_name} in {where}"
        add_row(table, e["export"], e["source"], what, e["delivered_version"] if e["delivered_version"] is not None
                else "-", e["source_version"] if e["source_version"] is not None else "-", where)
    console.print(table)


@app.command()
def generate(
    ctx: typer.Context,
    rows: int = typer.Option(1000, "--rows", min=1, help="Rows appended in the batch's new hour."),
    batch: int = typer.Option(1, "--batch", help="Batch number (0 creates the sources; later batches add late "
                              "rows etc.; the demo wrote 0 and 1, so continue with 2, 3, ...: a number used "
                              "again repeats that batch's random draws)."),
    late_share: float = typer.Option(0.05, "--late-share", min=0.0, max=1.0,
                                     help="Share of rows that land late, in older partitions."),
    duplicate_share: float = typer.Option(0.02, "--duplicate-share", min=0.0, max=1.0,
                                          help="Share of rows sent again (the stage drops the duplicates)."),
    update_share: float = typer.Option(0.02, "--update-share", min=0.0, max=1.0,
                                       help="Share of existing trades corrected (a Delta update)."),
    delete_share: float = typer.Option(0.01, "--delete-share", min=0.0, max=1.0,
                                       help="Share of existing trades cancelled (a Delta delete)."),
    bad_share: float = typer.Option(0.003, "--bad-share", min=0.0, max=1.0,
                                    help="Share of rows that break raw_trades' contract rules."),
    seed: int = typer.Option(7, "--seed", help="Random seed (combined with the batch number)."),
) -> None:
    """Write more source commits to raw_trades (creating the sources if needed)."""
    from laminar_assets.demo.generator import BatchOptions, recent_start, write_batch

    # a new raw_trades starts a few hours before now, as `laminar demo` does; later batches continue it
    s = write_batch(ctx.obj.root, BatchOptions(rows=rows, late_share=late_share, duplicate_share=duplicate_share,
                                               update_share=update_share, delete_share=delete_share,
                                               bad_share=bad_share, seed=seed, start=recent_start()),
                    batch=batch)
    console.print(f"raw_trades: appended {s.appended}, late {s.late}, duplicates {s.duplicates}, corrected "
                  f"{s.updated}, cancelled {s.deleted}, broken {s.bad} (they go to the quarantine); new versions "
                  f"{list(s.versions)}", markup=False)


@app.command()
def refill(
    ctx: typer.Context,
    flow: str = typer.Argument(...),
    partition_range: str = typer.Option(None, "--partition-range",
                                        help="A...B (inclusive); default: every materialized partition."),
    wait_seconds: float = typer.Option(600, "--wait-seconds", min=0,
                                       help="How long to wait while another live run of the flow holds its "
                                       "concurrency slot (one run of a flow at a time) before giving up. A run "
                                       "whose process is gone (killed) is failed and its slot freed at once."),
) -> None:
    """Recompute partitions through Dagster, recorded with reason FORCED_BY_USER."""
    import dagster as dg

    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.orchestration.assets import FORCE_TAG
    from laminar_assets.orchestration.internals.in_process import execute_request, failure_message
    from laminar_assets.orchestration.sensors import RANGE_END, RANGE_START

    c: CliContext = ctx.obj
    c.require_lake()
    spec = c.spec(flow)
    if partition_range:
        if "..." not in partition_range:
            raise LaminarError(f"--partition-range must look like A...B, found {partition_range!r}", flow=flow)
        start, end = partition_range.split("...", 1)
        _check_range(spec, start, end)  # before Dagster and Spark start: nothing is run for a range it would not run
    else:
        done = CheckpointStore(c.root).partitions(flow)
        if not done:
            raise LaminarError(f"'{flow}' has no materialized partitions; pass --partition-range A...B", flow=flow)
        start, end = done[0], done[-1]
    request = dg.RunRequest(asset_selection=[dg.AssetKey(flow)],
                            tags={RANGE_START: start, RANGE_END: end, FORCE_TAG: "true"})
    with console.status(lit(f"refilling {flow} {start}...{end}")) as status:
        notify = pool_wait_notes(status, f"refilling {flow} {start}...{end}", wait_seconds, "--wait-seconds")
        outcome = execute_request(c.definitions(), request, c.instance(), pool_wait_seconds=wait_seconds,
                                  notify=notify)
    if not outcome.success:
        raise LaminarError(f"refill of {flow} {start}...{end} failed (Dagster run {outcome.run_id[:8]}): "
                           f"{failure_message(outcome)}")
    mats = outcome.asset_materializations_for_node(flow)
    console.print(f"refilled {flow}: {len(mats)} partition(s) {start}...{end}, reason FORCED_BY_USER "
                  f"(run {outcome.run_id})", markup=False)


@app.command()
def release(
    ctx: typer.Context,
    flow: str = typer.Argument(..., help="The flow (or stage) whose partitions to release."),
    partitions: list[str] = typer.Argument(..., help="Partition keys, e.g. 2024-01-01-00:00."),  # noqa: B008
) -> None:
    """Clear the run named as holder of partitions whose run died where this machine cannot tell (another
    host: its pid means nothing here), instead of waiting `lease_seconds` for it to expire. A holder that is
    alive on this host is refused. An interrupted run's intent stays: the next run settles it."""
    from laminar_assets.checkpoints import CheckpointStore

    c: CliContext = ctx.obj
    c.require_lake()
    spec = c.spec(flow)
    store = CheckpointStore(c.root)
    from laminar_assets.engine import partition_interval

    for key in partitions:  # every key checked before any is released
        try:
            partition_interval(key, spec.granularity)
        except ValueError as exc:
            raise LaminarError(f"bad partition for '{flow}': {exc}; nothing was released", flow=flow) from None
    for key in partitions:
        mark, tag = store.load_tagged(spec.name, key)
        if mark is None or mark.holder is None:
            console.print(f"{flow} {key}: no run holds it", markup=False)
            continue
        who = store.describe(mark.holder)
        if mark.holder.host == socket.gethostname() and not store.holder_gone(mark.holder, spec.name, key):
            raise LaminarError(f"{flow} {key} is held by {who}, alive on this host: let it finish, or stop that "
                               "process (its partition is then taken over by the next run)", flow=flow, partition=key)
        if store.write_if(mark.with_(holder=None), tag) is None:
            raise LaminarError(f"{flow} {key}: its watermark changed while being released (a run took it over or "
                               "finished): run `laminar status` and try again if it is still held", flow=flow,
                               partition=key)
        intent = "; the next run settles its intent" if mark.pending is not None else ""
        console.print(f"{flow} {key}: released from {who}{intent}", markup=False)


def _check_range(spec, start: str, end: str) -> None:
    """Both ends are partitions of the flow's asset (a partition key on a boundary: '16:00', not '16:30';
    from its first partition to now + future_horizon), first to last; else an error naming flow and key."""
    from laminar_assets.engine import checked_keys
    from laminar_assets.pipeline.settings import load_settings

    settings = load_settings()
    for key in (start, end):
        try:
            checked_keys(spec, [key], first=spec.start or settings.partitions_start, future_horizon=settings.future_horizon)
        except LaminarError as exc:
            raise LaminarError(f"bad partition in --partition-range: {exc.message}", **exc.facts) from None
    if end < start:  # fixed-width UTC keys: text order is time order
        raise LaminarError(f"--partition-range {start}...{end} ends before it starts: expected the earlier partition "
                           f"first ({end}...{start})", flow=spec.name)


@app.command()
def serve(
    ctx: typer.Context,
    ui_port: int = typer.Option(3000, "--ui-port", help="Port of the Dagster UI (on 127.0.0.1)."),
    spark_port: int = typer.Option(15002, "--spark-port", help="Port of the Spark Connect server (on 127.0.0.1)."),
    spark_remote: str = typer.Option(None, "--spark-remote", envvar="LAMINAR_SPARK_REMOTE",
                                     help="Use this Spark Connect endpoint (sc://host:port) instead of starting one."),
    driver_memory: str = typer.Option("4g", "--driver-memory", help="Memory of the Spark Connect server's driver."),
    jit: str = typer.Option("tiered", "--jit", envvar="LAMINAR_SPARK_JIT", help="How the Spark Connect server's JVM "
                            "compiles: tiered (the JVM's own), hot (C2 only for the hottest code: faster batched runs "
                            "in a long-lived server) or quick (C1 only)."),
    local_spark: bool = typer.Option(False, "--local-spark", help="Start no Connect server: every run starts its "
                                     "own Spark JVM (slow; for comparison)."),
    log_dir: str = typer.Option(None, "--log-dir", help="Where the logs of Dagster, the Spark Connect server and the "
                                "warm-up go. Default: logs beside the lake (.laminar/logs), or ./.laminar/logs when "
                                "the lake is in a bucket."),
    warm_up: bool = typer.Option(True, "--warm-up/--no-warm-up", help="Once the UI is up, warm the new Spark "
                                 "Connect server with a scratch run of the demo graph (about a minute in the "
                                 "background), so the first real run is not slowed by a cold JVM."),
    spark_probe_seconds: float = typer.Option(10.0, "--spark-probe-seconds", min=0, help="Ask the Spark Connect "
                                              "server started here for its version this often; one that leaves three "
                                              "questions in a row unanswered (each awaited at most 10 s) is hung, and "
                                              "is killed and started again. 0: never ask."),
) -> None:
    """Start the deployment: a Spark Connect server and `dagster dev` (UI + daemon) on 127.0.0.1.
    Sensors launch runs that connect to the warm Spark; Ctrl-C stops everything."""
    from laminar_assets.deploy.connect_server import ConnectServerOptions
    from laminar_assets.deploy.serve import ServeOptions
    from laminar_assets.deploy.serve import serve as run_serve
    from laminar_assets.engine import SparkOptions
    from laminar_assets.engine.spark import metastore_from_env

    c: CliContext = ctx.obj
    c.instance()  # DAGSTER_HOME with the project's dagster.yaml
    # .laminar/logs beside .laminar/lake; a lake in a bucket keeps its logs on this machine, in ./.laminar/logs
    lake_dir = os.path.join(".laminar", "lake") if storage.is_object_store(c.root) else c.root
    logs = os.path.abspath(log_dir) if log_dir else os.path.join(os.path.dirname(os.path.abspath(lake_dir)), "logs")
    options = ServeOptions(root=c.root, dagster_home=c.dagster_home, ui_port=ui_port, spark_remote=spark_remote,
                           local_spark=local_spark, log_dir=logs, warm_up=warm_up,
                           spark_probe_seconds=spark_probe_seconds, spark=ConnectServerOptions(
                               port=spark_port, log_path=os.path.join(logs, "spark-connect.log"),
                               spark=SparkOptions(driver_memory=driver_memory, jit=jit,
                                                  metastore=metastore_from_env())))

    def ready(d, embedded: str) -> None:
        spark = f"Spark Connect server {d.remote} (log {logs}/spark-connect.log)" if d.spark else \
            f"Spark Connect endpoint {d.remote} (not started here)" if d.remote else \
            "local Spark: every run starts its own JVM (--local-spark)"
        if d.warm_up is not None:
            spark += f"\n  warming Spark up with a scratch run in the background (log {logs}/warm-up.log)"
        console.print(f"[bold]Laminar is up[/bold]\n  Dagster UI and daemon: {d.ui_url}  (log {logs}/dagster.log)"
                      f"\n  {spark}\n  Delta tables: {c.root}\n  DAGSTER_HOME: {c.dagster_home}{lit(embedded)}\n"
                      "Sensors are on: commit to a source (e.g. `laminar generate --batch 2` after the demo) and watch the runs. "
                      "Ctrl-C stops both processes.", markup=True, highlight=False)

    from laminar_assets.deploy.embedded_targets import embedded_folder, start_embedded_targets

    console.print("starting the Spark Connect server and Dagster (about 30 s)...")
    # the exports' targets for the connections nothing defines (as in `laminar demo`, on the same data, so the
    # deliveries go on from the demo's): set in this process's environment, which `dagster dev` and its runs inherit
    with start_embedded_targets(c.exports(), embedded_folder(c.root, machine_folder=os.path.dirname(logs))) as targets:
        embedded = "".join(f"\n  export connection '{t.connection}': {t.where}" for t in targets.targets)
        code = run_serve(options, on_ready=lambda d: ready(d, embedded),
                         # what serve does on its own (a server restarted, a location reloaded), with the time (UTC)
                         # it happened: read after an incident, beside dagster.log's times
                         say=lambda line: console.print(f"{datetime.now(UTC):%H:%M:%S} {line}", markup=False,
                                                        highlight=False, soft_wrap=True))
    if not code:
        console.print("stopped: Dagster and the Spark Connect server are down"
                      + (" (and the exports' embedded targets)" if embedded else ""))
    if code:
        why = _last_exit_line(os.path.join(logs, "dagster.log"))
        raise LaminarError(f"a process of the deployment exited unexpectedly (code {code})"
                           + (f": {why}" if why else "") + f"; see {logs}/")


def _last_exit_line(log: str) -> str:
    """The last line of `dagster dev`'s log saying which of its processes ended (the daemon, the webserver, a code
    server: `dagster dev` then stops the rest), without its timestamp and level; "" when there is none."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log) - 65536))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return ""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", tail)  # its colours
    found = [line for line in plain.splitlines() if "shut down unexpectedly" in line]
    return found[-1].split(" - ", 2)[-1].removeprefix("Exception: ").strip() if found else ""


def next_steps(root: str, local_store: str | None = None) -> str:
    """What the demo's last lines say: where its tables are and what to run next. `local_store`: the emulator
    `python -m laminar_assets.deploy.local_store` started for this command (`LAMINAR_LOCAL_STORE`), whose lake
    lives in its memory and goes when the command ends, so `make ui` would not find it."""
    if local_store:
        deploy = "`make ui-s3` runs the deployment on an emulator of its own" if local_store == "s3" else \
            "`make ui-s3` runs the deployment on a local S3 emulator"
        return (f"\nDelta tables: {root}, in the local {local_store} emulator's memory: they go when this command "
                f"ends. Next: {deploy}; against a real bucket, `laminar --root <bucket URI> serve` with the "
                "store's usual variables (docs/deploying.md).")
    return (f"\nDelta tables: {root}\nNext: `make ui` (or `laminar serve`) starts Spark Connect and the Dagster "
            "UI + daemon on http://127.0.0.1:3000 with the sensors on; they continue from here without "
            "re-running anything. Then `laminar generate --batch 2` commits new data and the sensors bring "
            "every flow up to date.")
