"""The quarantine sweep: rows no partition owns (no usable, an out-of-bounds, or an event time outside the partitions).

A row with a usable event time is quarantined by the run of its partition. A row
without one belongs to no partition, so each flow's *sweep* records it: once per
new source version, under its own lease, at the start of any run of the flow.
Files whose statistics prove every event time present and in bounds are not read,
so on clean data the sweep costs no Spark job; and when every new file proves so,
it takes no lease either: its progress moves with one conditional write, which
fails if another sweeper moved it meanwhile (then it sweeps under the lease).

The sweep reads the commits since the version it swept last. When it has swept
nothing yet, or that history can no longer be read (log entries cleaned up, files
vacuumed, files holding a column under another type than the source has now: retyped
and restored, found in the log or by Spark's failed read), it sweeps what exists: the
source's latest snapshot, so it never fails on every run over one commit. Rows recorded
already are skipped (`quarantine.record`), so no row is recorded twice; rows added
and removed again within the lost history are gone and cannot be recorded.
"""

from __future__ import annotations

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from laminar_assets.errors import ConcurrentRunError

from ..aggregates.algebra import EVENT_TS, SIGN
from ..delta.log import CommitSummary, DataFile, file_exists
from ..delta.tables import SourceHistory, TableInfo, snapshot_files, source_history, table_info, temporal
from ..quarantine import records as qr
from ..quarantine.records import PARTITION_KEY, ROW, RULE, VERSION
from ..spark.failures import type_mismatch
from ..spark.frames import interpreted
from ..spark.read import CHANGE_TYPE, read_source
from ..windows import Interval
from .context import RunContext
from .fact_joins import without_joins
from .plan import PartitionPlan, Reason
from .reading import DVER, SNAP, SRC
from .result import SweepResult
from .row_prep import prepare


def sweep(ctx: RunContext, spec, plan: PartitionPlan, run_id: str, *,
          opened: dict[str, TableInfo] | None = None, histories: dict[str, SourceHistory] | None = None) -> SweepResult:
    """Quarantine the partition-less rows of the source versions up to `plan.to_versions` the flow
    has not swept yet (a snapshot sweep: up to the latest version, `opened`); returns what it did.
    Idempotent; one sweeper per flow at a time. `opened`: sources the run opened (`RunInputs.infos`);
    `histories`: the commits the run read (`RunInputs.histories`), not read again when they cover the sweep's."""
    # the progress this process last read or wrote: when it leaves versions to sweep, the lease is taken
    # straight away (the progress is read again under it); else the progress is read first, without it
    known = ctx.store.swept(spec.name, spec.spec_hash)
    todo = {s: v for s, v in plan.to_versions.items() if s in spec.sources and (known or {}).get(s, -1) < v}
    if known is None or not todo:
        done = ctx.store.load_sweep(spec.name, spec.spec_hash)
        todo = {s: v for s, v in plan.to_versions.items() if s in spec.sources and done.get(s, -1) < v}
    if not todo:
        return SweepResult()
    offered = qr.offered_events(spec, ctx.options.future_horizon)  # rows outside: event_time_outside_partitions
    clean = _clean_advance(ctx, spec, todo, offered, opened, histories)
    if clean is not None:
        return clean
    try:
        lease = ctx.store.lease(spec.name, "_sweep", run_id)
        lease.__enter__()
    except ConcurrentRunError:  # another run of this flow is sweeping these versions
        return SweepResult()
    counts: dict[str, int] = {}
    sources: dict[str, str] = {}
    reason: Reason | None = None
    try:
        done = ctx.store.load_sweep(spec.name, spec.spec_hash)
        for src, target in todo.items():
            if done.get(src, -1) >= target:
                continue
            latest = (opened or {}).get(src) or table_info(src, ctx.layout.table_uri(src))
            frame, size, swept, how, why = _unswept(ctx, spec, latest, done.get(src), target, offered,
                                                    read=(histories or {}).get(src))
            try:
                new = _record(ctx, spec, src, frame, size, run_id, offered)
            except (PySparkException, Py4JError) as exc:
                # A commit's file holds a column under another type than the log told (the backstop of
                # `SourceHistory.retyped`): sweep the latest snapshot, or this sweep fails on every run
                mismatch = type_mismatch(exc) if why is None else None
                if mismatch is None:
                    raise
                frame, size, swept, how, why = _unswept(ctx, spec, latest, None, target, offered, unreadable=mismatch)
                new = _record(ctx, spec, src, frame, size, run_id, offered)
            sources[src] = how
            reason = reason or why
            for rule, n in new.items():
                counts[rule] = counts.get(rule, 0) + n
            done[src] = swept
            ctx.store.save_sweep(spec.name, spec.spec_hash, done)
    finally:
        lease.__exit__(None, None, None)
    return SweepResult(counts, sources, reason)


def _clean_advance(ctx: RunContext, spec, todo: dict[str, int], offered: Interval,
                   opened: dict[str, TableInfo] | None, histories: dict[str, SourceHistory] | None) -> SweepResult | None:
    """The sweep of commits that hold no row to record, without its lease: when the progress this process
    last read or wrote is where the run's own history of every source starts, and every file those commits
    insert proves by its statistics each event time present and in bounds, the progress moves to `todo` with
    one conditional write (`CheckpointStore.advance_sweep`). A sweeper that moved it meanwhile makes the
    write fail and the caller sweeps under the lease, as before. None: not proven, or not written."""
    known = ctx.store.swept(spec.name, spec.spec_hash)
    if known is None or not opened or not histories:
        return None
    for src, target in todo.items():
        done, read, latest = known.get(src), histories.get(src), opened.get(src)
        if done is None or read is None or latest is None or read.from_version is None \
                or read.from_version > done or read.latest_version != target:
            return None
        may_hold = _may_hold(spec, latest, offered)
        if any(may_hold(f) for c in read.after(done).commits for f in _inserted_files(c)):
            return None
    if not ctx.store.advance_sweep(spec.name, spec.spec_hash, {**known, **todo}):
        return None
    return SweepResult({}, {src: f"commits {known[src] + 1}..{target}" for src, target in todo.items()}, None)


def _may_hold(spec, latest: TableInfo, offered: Interval):
    """Whether a file may hold a row no partition owns: False only when its statistics prove every event
    time present and inside the bounds and `offered`."""
    provable = temporal(latest.schema, spec.event_time)
    inside = offered.intersect(spec.bounds) if spec.bounds is not None else offered

    def may_hold(f: DataFile) -> bool:
        if not provable or f.time_nulls is None or f.time_nulls > 0 or f.time_range is None:
            return True
        return inside is None or not (inside.start <= f.time_range.start and f.time_range.end <= inside.end)

    return may_hold


def _record(ctx: RunContext, spec, src: str, frame: DataFrame | None, size: int, run_id: str,
            offered: Interval) -> dict[str, int]:
    """Record the rows of `frame` no partition owns (no usable event time, or one outside the bounds or
    `offered`) in `src`'s quarantine; new rows by rule."""
    if frame is None:
        return {}
    rows = prepare(spec, without_joins(spec, frame)).where(qr.swept(spec, offered))
    rows = rows.withColumn(RULE, F.coalesce(F.col(RULE), qr.unassigned_rule(spec, offered)))
    rows = rows.withColumn(PARTITION_KEY, F.lit(None).cast("string"))
    # small reads: interpreted expressions, as a pass's (flow/job.py): the sweep's job reads, groups and
    # anti-joins a few rows, and compiling its new code cost more JVM time than the job itself
    with interpreted(ctx.spark, size < ctx.options.interpreted_below_bytes):
        new = qr.record(ctx.spark, rows.select(PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS),
                        uri=ctx.layout.quarantine_uri(src), flow=spec.name, run_id=run_id,
                        through_driver=size < ctx.options.driver_write_below_bytes,
                        driver_below_bytes=ctx.options.driver_write_below_bytes)
    return dict(new.get(None, {}))


def _unswept(ctx: RunContext, spec, latest: TableInfo, done: int | None, target: int, offered: Interval, *,
             unreadable: str | None = None,
             read: SourceHistory | None = None) -> tuple[DataFrame | None, int, int, str, Reason | None]:
    """Rows of a source added after version `done` up to `target` that may lack a usable event time
    (or have one outside the bounds or `offered`), the bytes of the files they come from, the version
    swept up to, how, and why a snapshot was read. `latest`: the source at its latest version, swept
    whole when the commits cannot be read (or when `unreadable` says why a read of them failed). `read`:
    the run's history of the source, used when it holds every commit in (done, target]."""
    src, uri = latest.name, latest.uri
    may_hold = _may_hold(spec, latest, offered)

    def tagged(df: DataFrame, version) -> DataFrame:
        return (df.withColumn(SRC, F.lit(src)).withColumn(DVER, F.lit(None).cast("long"))
                .withColumn(SNAP, F.lit(False)).withColumn(VERSION, F.lit(version).cast("long")))

    def snapshot(why: Reason, detail: str):
        files = [f for f in snapshot_files(latest, spec.event_time, keep_null_files=True) if may_hold(f)]
        how = f"snapshot at version {latest.version} ({detail})"
        if not files:
            return None, 0, latest.version, how, why
        frame = tagged(read_source(ctx.spark, files, latest).withColumn(SIGN, F.lit(1)), latest.version)
        return frame, sum(f.size for f in files), latest.version, how, why

    if unreadable is not None:
        return snapshot(Reason.SCHEMA_CHANGED_HISTORY, unreadable)
    if done is None:
        return snapshot(Reason.NO_WATERMARK, "first sweep of this flow")
    info = latest if latest.version == target else table_info(src, uri, target)
    if read is not None and read.from_version is not None and read.from_version <= done \
            and read.latest_version == target:
        history = read.after(done)  # read by this run moments ago: its commits and their files' existence
    else:
        history = source_history(src, uri, done, target, spec.event_time, info=info)
    if history.expired:
        return snapshot(Reason.CHECKPOINT_EXPIRED, history.expired)
    reads = [(commit, [f for f in _inserted_files(commit) if may_hold(f)]) for commit in history.commits]
    # the history found every file an incremental read of its commits opens (`readable`: looked for, or in
    # the latest snapshot, see `source_history`): only the others
    checked = {f.uri for c in history.commits for f in c.readable}
    gone = next(((c, f) for c, files in reads for f in files if f.uri not in checked and not file_exists(f.uri)),
                None)
    if gone is not None:
        return snapshot(Reason.CHECKPOINT_EXPIRED,
                        f"commit {gone[0].version} of '{src}' refers to files that were vacuumed ({gone[1].uri})")
    to_read = [(commit, files) for commit, files in reads if files]  # (not `read`: the history passed in)
    retyped = dict(history.with_retyped(info, ("*",)).retyped)  # the sweep keeps the whole row
    unreadable = next((retyped[c.version] for c, _files in to_read if c.version in retyped), None)
    if unreadable is not None:
        return snapshot(Reason.SCHEMA_CHANGED_HISTORY, unreadable)
    frames, size = [], 0
    for commit, files in to_read:
        size += sum(f.size for f in files)
        df = read_source(ctx.spark, files, info, change_data=bool(commit.cdc))
        if commit.cdc:  # inserted rows only: a deleted row was recorded when it was added
            df = df.where(F.col(CHANGE_TYPE).isin("insert", "update_postimage")).drop(CHANGE_TYPE)
        frames.append(tagged(df.withColumn(SIGN, F.lit(1)), commit.version))
    how = f"commits {done + 1}..{target}"
    if not frames:
        return None, 0, target, how, None
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out, size, target, how, None


def _inserted_files(commit: CommitSummary) -> list[DataFile]:
    """The files of a commit that may hold rows it inserted: its change data, else its added files
    (rewrites without change data may add rows too, e.g. an update that nulls the event time); a file
    whose deletion vector changed adds no row (its rows were swept when it was added)."""
    return list(commit.cdc or [a for a in commit.adds if a.dv_change is None])
