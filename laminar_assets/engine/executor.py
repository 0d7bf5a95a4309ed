"""`Engine`: bring (flow, partition) pairs up to date. One run reads top to bottom here:

    read every watermark          its tag with it; a partition a live run holds refuses the run (protocol.Claims)
    settle interrupted runs       protocol.settle (+ flow_state.rederive_sinks), each partition claimed first
    gather the inputs once        inputs.gather: each source opened once, its log read once
    plan every partition          planner.plan_partition (pure), NOOPs recorded without Spark
    sweep partition-less rows     sweep.sweep
    one pass per target version   flow_job / stage_job.run_pass: one read, one state and one sink commit
    finish every watermark        protocol.finish_all (one write per block of partitions, each watermark in it
                                  conditional on the run's last write of it)

`run(p)` is `run_many([p])`. A plain library: no Dagster here.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore, Watermark
from laminar_assets.errors import (
    CatalogNameError,
    ConcurrentRunError,
    InjectedCrash,
    LaminarError,
    RunFailedError,
    StorageError,
    StoreUnavailableError,
    StrictRefreshError,
)
from laminar_assets.storage import ObjectStoreOptions, Store

from .catalog import CatalogOptions, CatalogReport, CatalogTable, TableCatalog, looks_like_name, make_catalog
from .delta import catalog_names, integrity
from .delta.layout import Layout
from .delta.log import CommitKind
from .delta.tables import checkout_table
from .export import Connection, DeliveryResult, Exporter, dead_letters
from .flow import job as flow_job
from .flow import state as flow_state
from .output import uncommitted
from .output.owner import check_owner
from .report import sink_read
from .run import outcomes, protocol, unchanged
from .run.context import STEPS, EngineOptions, RunContext  # noqa: F401  (STEPS: tests crash at each)
from .run.inputs import RunInputs, gather, partition_bytes, partition_rows, planner_input
from .run.metrics import RunMetrics
from .run.plan import Mode, PartitionPlan, Reason
from .run.planner import MAX_REFILL_GROUPS, plan_partition
from .run.result import RunResult
from .run.retyped_reads import refuse_retyped_reads
from .run.sweep import SweepResult, sweep
from .run.validate import CheckedSource, checked_source
from .spark.frames import interpreted, new_run_id
from .spark.session import use_object_store
from .spec.exports import ExportSpec
from .spec.specs import FlowSpec, RefreshPolicy, Spec
from .stage import job as stage_job
from .stage import keys as stage_keys
from .windows import EPOCH, Interval, check_partition, describe_duration, later

log = logging.getLogger(__name__)

# What a later run can cure: Spark, Delta and file-system failures (a lost executor, a full disk, a
# conflicting writer). A pass failing with one of them records a failed attempt, so the partition
# refills next time. Anything else is a bug: it propagates as it is, and the interrupted run's intent
# is settled by the next run like a crash.
CURABLE = (OSError, DeltaError, PySparkException, Py4JError)
JOBS = {"flow": flow_job, "stage": stage_job}  # the job that carries out a pass of each kind of spec


class Engine:
    """Brings (flow, partition) pairs up to date over the Delta tables under `root`.

    Source, sink and stage tables are resolved under `root` by name (or given as absolute
    paths); Laminar keeps its state tables and watermarks under `<root>/_laminar/`."""

    def __init__(self, spark: SparkSession, root: str, *, hook: Callable[[str], None] | None = None,
                 options: EngineOptions | None = None, store: ObjectStoreOptions | Store | None = None,
                 connections: Mapping[str, Connection] | None = None,
                 catalog: CatalogOptions | TableCatalog | None = None) -> None:
        """`root`: a local folder or an object-store URI (s3://bucket/prefix). `store`: how this engine
        reaches its root's object store (options, or a `Store`), mounted at the root for this process's
        file I/O and set as the Spark session's settings for the root's bucket; default: a store mounted
        there before, else the AWS environment. Two engines with different roots and stores live side by
        side. An unreachable store, refused credentials or a missing bucket fail here, in one line,
        before anything is read or written (and the store is not mounted).
        `connections`: the exports' targets by name (else LAMINAR_CONNECTION_<NAME>_URL, see `deliver`).
        `catalog`: where the tables this engine writes are registered after each run (`CatalogOptions`, e.g.
        the schema of the session's Hive metastore), and where sources named `schema.table` are found; None:
        no catalog (sources are paths)."""
        options = options or EngineOptions()
        root = storage.resolve_root(root)
        if store is not None:
            storage.mount(root, store, check=True)
        else:
            storage.check_reachable(root)
        self.storage: Store = storage.store_for(root)
        self._buckets: set[str] = set()  # buckets whose Spark settings this engine set (its root's, its sources')
        if self.storage.object_store:
            storage.copies.kept()  # a wrong LAMINAR_CACHE_* setting: one line here, not a failure in each reader
            use_object_store(spark, root)
            self._buckets.add(root.split("/", 3)[2])
        self.ctx = RunContext(spark, Layout(root), CheckpointStore(root, lease_seconds=options.lease_seconds),
                              options, hook or (lambda step: None))
        self.connections = dict(connections or {})
        self.catalog: TableCatalog | None = make_catalog(spark, catalog) if isinstance(catalog, CatalogOptions) \
            else catalog

    spark = property(lambda self: self.ctx.spark)
    root = property(lambda self: self.ctx.layout.root)
    store = property(lambda self: self.ctx.store)
    layout = property(lambda self: self.ctx.layout)

    # --- what a run would do ----------------------------------------------
    def gather(self, spec: Spec, marks: list[Watermark | None], *, pooled: bool = False,
               listed: dict[str, dict[int, str]] | None = None) -> RunInputs:
        """The run's inputs: every source opened once, its schema checked, its log read once. `pooled`: the
        snapshots come from the process's pool on an object store (give them back: `RunInputs.release`);
        `listed`: the logs' commit files as `unchanged.check` listed them."""
        return gather(self.ctx.layout, spec, marks, lambda info, dims: self._check(spec, info, dims), pooled=pooled,
                      listed=listed)

    def plan(self, spec: Spec, partition: str, *, force: bool = False) -> PartitionPlan:
        """What a run would do now; reads, never writes."""
        return self.plans(spec, [partition], force=force)[0]

    def plans(self, spec: Spec, partitions: list[str], *, force: bool = False) -> list[PartitionPlan]:
        """What a run of these partitions would do now; reads, never writes."""
        keys = self._keys(spec, partitions)
        self._resolve_sources(spec, record=False)
        marks = {k: self._settled_view(spec, k) for k in keys}
        inputs = self.gather(spec, list(marks.values()))
        return list(self._plan_all(spec, marks, inputs, force).values())

    def state_query(self, spec: FlowSpec, partition: str) -> tuple[PartitionPlan, DataFrame]:
        """The plan and the (lazy) Spark query of the state a run would write now (for `explain`)."""
        self._resolve_sources(spec, record=False)
        mark = self._settled_view(spec, partition)
        inputs = self.gather(spec, [mark])
        plan = self._plan_all(spec, {partition: mark}, inputs, False)[partition]
        return plan, flow_job.state_query(self.ctx, spec, [plan], inputs)

    # --- running ------------------------------------------------------------
    def _reach_sources(self, spec: Spec) -> None:
        """Spark's settings for the bucket of each source outside the root (its store: `storage.store_for`),
        once per bucket: the root's bucket got them when the engine was made."""
        for uri in (self.ctx.layout.table_uri(s) for s in spec.sources):
            if storage.is_object_store(uri):
                bucket = storage.normalized(uri).split("/", 3)[2]
                if bucket not in self._buckets:
                    use_object_store(self.spark, uri)
                    self._buckets.add(bucket)

    def run(self, spec: Spec, partition: str, *, force: bool = False) -> RunResult:
        """Bring one partition up to date; returns what was done and measured."""
        return self.run_many(spec, [partition], force=force)[0]

    def run_many(self, spec: Spec, partitions: list[str], *, force: bool = False) -> list[RunResult]:
        """Bring several partitions of a flow or stage up to date in one pass: each source is read
        once, every file once, and one state commit and one sink commit carry every partition's app
        transaction. Leases, intents, watermarks and recovery stay per partition. A partition with
        nothing to do is a NOOP without any Spark job. Results come back in the order given.

        A store that stops answering fails the run within its time bounds (`ObjectStoreOptions`) with
        one `StoreUnavailableError` naming the endpoint and the object, whichever client met it
        (boto3, deltalake, pyarrow, Spark's s3a); no watermark moved past what the tables hold, so the
        next run picks the work up (retryable)."""
        keys = self._keys(spec, partitions)
        self._resolve_sources(spec)  # a source's catalog name that does not resolve: refused, nothing written
        run_id = new_run_id()
        try:
            results = self._run_many(spec, keys, run_id, force)
        except InjectedCrash:
            raise
        except Exception as exc:
            found = protocol.store_unavailable(exc)
            if found is None or found is exc:
                raise
            raise StoreUnavailableError(
                f"{found.message}; run {run_id} of '{spec.name}' stopped, and what it did not finish is picked "
                "up by the next run", **{**found.facts, "flow": spec.name, "run_id": run_id}) from exc
        if self.catalog is not None:
            mark = self.ctx.store.load(spec.name, keys[0])
            self.catalog.register(self.catalog_tables(spec, mark.input_schema if mark else None))
        return results

    # --- the catalog -----------------------------------------------------------------
    def _resolve_sources(self, spec: Spec, *, record: bool = True) -> None:
        """With a catalog, each source or joined table (a dimension, a joined fact table) written as a catalog
        name (`raw.trades`) is read at the location the catalog gives it (resolved once per engine); one it does
        not know is refused before anything is read or written. Without a catalog such a name is a path under
        the root, as before. `record`: keep where each name was found in the lake (`catalog_names`), for the
        readers without a catalog; False for what only reads (plans, explain)."""
        if self.catalog is None:
            return
        roles = {**{t: "joined table" for t in spec.dimension_tables}, **{s: "source" for s in spec.sources}}
        named = [t for t in roles if looks_like_name(t)]
        found = dict(self.ctx.layout.names)
        for name in (n for n in named if n not in found):
            where = self.catalog.resolve(name)
            if where is None:
                raise CatalogNameError(f"{roles[name]} '{name}' of '{spec.name}' is not a table of the catalog "
                                       f"({self.catalog.description}); nothing was read or written: register it "
                                       f"there, or name the {roles[name]} by its path", flow=spec.name, source=name)
            found[name] = where
        if found != self.ctx.layout.names:
            self.ctx.layout = replace(self.ctx.layout, names=found)
        if record and named:  # for the readers that have no catalog (sensors, status): where each name was found
            catalog_names.record(self.root, {n: found[n] for n in named})

    def catalog_tables(self, spec: Spec, input_schema: dict[str, str] | None = None) -> list[CatalogTable]:
        """The tables Laminar writes for `spec`, as a catalog registers them: its sink (a stage's output) by the
        spec's name (a flow renamed, its sink kept, renames the entry), a flow's current state table as
        `<flow>__state` (`input_schema`: the run's; None: a watermark's) and its sources' quarantine tables as
        `<source>__quarantine`."""
        layout, tags = self.ctx.layout, dict(spec.tags)
        about = spec.description or f"{spec.described_as} '{spec.name}' over {', '.join(spec.sources)}, kept up to " \
                                    "date by Laminar"
        out = [CatalogTable(_catalog_name(spec.name), layout.sink_uri(spec), spec.catalog_kind,
                            about, spec.owners, tags, spec.name)]
        if spec.keeps_state:
            if input_schema is None:
                marks = (self.ctx.store.load(spec.name, k) for k in self.ctx.store.partitions(spec.name))
                input_schema = next((m.input_schema for m in marks if m is not None and m.input_schema), None)
            if input_schema is not None:
                out.append(CatalogTable(_catalog_name(f"{spec.name}__state"), layout.state_uri(spec, input_schema),
                                        "state", f"Laminar's partial aggregates of flow '{spec.name}' (its own "
                                        f"bookkeeping: read {spec.sink} instead)", spec.owners, tags, spec.name))
        for src in spec.sources:
            uri = layout.quarantine_uri(src)
            out.append(CatalogTable(_catalog_name(f"{os.path.basename(uri)}__quarantine"), uri, "quarantine",
                                    f"rows of source '{src}' that broke a rule of a flow reading it (column `flow`)"))
        return out

    def catalog_name(self, spec: Spec) -> str | None:
        """The name a query engine finds `spec`'s sink by (`laminar.vwap_1m`); None without a catalog."""
        if self.catalog is None:
            return None
        return f"{self.catalog.schema}.{_catalog_name(spec.name)}"

    def sync_catalog(self, specs: list[Spec], exports: Sequence[ExportSpec] = ()) -> CatalogReport:
        """Register every table Laminar wrote for `specs` and `exports` (a webhook export's dead letters as
        `<export>__dead_letters`), and report the schema's entries none of them claims (a removed flow's
        tables: left in place, never dropped). Tables not written yet are skipped."""
        if self.catalog is None:
            raise LaminarError("this engine has no catalog: give it one (Engine(catalog=CatalogOptions(...)), "
                               "LaminarResource.catalog_schema or LAMINAR_CATALOG)")
        for spec in specs:
            self._resolve_sources(spec)
        tables: dict[str, CatalogTable] = {}
        for spec in specs:
            for t in self.catalog_tables(spec):
                tables.setdefault(t.name, t)
        for export in exports:
            if export.kind == "webhook":
                uri = dead_letters.table_uri(self.root, export.name)
                tables.setdefault(_catalog_name(f"{export.name}__dead_letters"), CatalogTable(
                    _catalog_name(f"{export.name}__dead_letters"), uri, "dead_letters",
                    f"rows webhook export '{export.name}' could not deliver"))
        return self.catalog.sync(list(tables.values()))

    def _stop_waiting(self, exc: BaseException) -> None:
        """When `exc` says a store does not answer, fail that store's further calls at once (the run's
        clean-up: records, leases, uncommitted files), so the run ends within one call's time bounds."""
        found = protocol.store_unavailable(exc)
        if found is None:
            return
        uri = found.facts.get("uri")
        (storage.store_for(uri) if uri else self.storage).not_answering()

    def _run_many(self, spec: Spec, keys: list[str], run_id: str, force: bool) -> list[RunResult]:
        found = unchanged.check(self.ctx, spec, keys, force)
        if found is not None and found.plans is not None:  # nothing moved: no lease, no table opened
            return self._unchanged(spec, keys, found, run_id)
        # a sink another flow or nobody Laminar knows created: refused, nothing written
        sink = self._checked_sink(spec, keys)
        try:
            self._reach_sources(spec)
            # the watermarks as read, with their tags: the run's writes of them are conditional on these (`Claims`)
            read = found.tagged if found is not None and found.tagged else self._load_tagged(spec, keys)
            protocol.refuse_held(self.ctx.store, spec, {k: m for k, (m, _tag) in read.items()})  # nothing written yet
        except BaseException:
            if sink is not None:
                sink[1]()
            raise
        claims = protocol.Claims(self.ctx.store, spec, run_id, {k: tag for k, (_m, tag) in read.items()})
        marks: dict[str, Watermark | None] = {}
        results: dict[str, RunResult] = {}
        inputs: RunInputs | None = None
        ended: BaseException | None = None
        # every write of the run's files is tracked: what no commit took is removed when the run ends
        with uncommitted.scope():
            try:
                started = time.perf_counter()
                marks.update(self._settle(spec, keys, run_id, claims, {k: m for k, (m, _tag) in read.items()}))
                inputs = self.gather(spec, list(marks.values()), pooled=True, listed=found.listed if found else None)
                if sink is not None:
                    inputs.hold(self.ctx.layout.sink_uri(spec), *sink)
                    sink = None
                inputs.limit_to(spec, keys)
                plans = self._plan_all(spec, marks, inputs, force)
                self._refuse_strict(spec, plans)
                plan_s = (time.perf_counter() - started) / len(keys)
                swept = self._sweep(spec, plans[keys[0]], run_id, inputs)
                todo = [k for k in keys if plans[k].mode is not Mode.NOOP]
                noops = [plans[k] for k in keys if plans[k].mode is Mode.NOOP]
                protocol.record_noops(self.ctx, noops, marks, claims, source_ids=inputs.source_ids(),
                                      source_tags=lambda p: unchanged.tags_at(found, p.to_versions))
                for p in noops:
                    results[p.partition] = RunResult(p, run_id, RunMetrics(pending_versions=sum(p.pending_versions.values())),
                                                     {"plan": plan_s})
                for group in _by_target(plans, todo):  # partitions that share target versions share a pass
                    results.update(self._execute(spec, {k: plans[k] for k in group}, marks, inputs, run_id, force,
                                                 claims, found))
            except InjectedCrash as exc:
                ended = exc
                raise  # a simulated kill writes nothing more
            except Exception as exc:  # counted for `laminar status` / `check`, then raised unchanged
                ended = exc
                self._stop_waiting(exc)
                if not isinstance(exc, ConcurrentRunError):  # another run moves those partitions: not a failure of theirs
                    protocol.record_failed_run(self.ctx, spec, [k for k in keys if k not in results], marks, claims, exc)
                raise
            except BaseException as exc:  # a KeyboardInterrupt: the holds are cleared as for any failure
                ended = exc
                raise
            finally:
                claims.end(ended)  # what the run still holds (claimed to settle, nothing to do since)
                if inputs is not None:
                    inputs.release()  # the sources' snapshots: the next run moves them forward
                if sink is not None:  # the run ended before its inputs held the sink's handle
                    sink[1]()
        for k in keys:
            results[k].seconds["plan"] = plan_s
        # The sweep belongs to no partition: credit it to the first partition that did work, so a NOOP
        # partition does not report its rows beside one that read rows. When every partition is a
        # NOOP (a commit holding only partition-less rows), the first one carries them: not lost.
        first = next((k for k in keys if plans[k].mode is not Mode.NOOP), keys[0])
        if swept.sources:
            results[first] = replace(results[first], sweep=swept)
        for rule, n in swept.counts.items():
            results[first].quarantined[rule] = results[first].quarantined.get(rule, 0) + n
        for r in results.values():
            r.metrics.rows_quarantined = sum(r.quarantined.values())
        self._record_outcomes(spec, run_id, [results[k] for k in keys], marks, inputs)
        snapshots = {t: (i.version, i.tag) for t, i in {**inputs.infos, **inputs.dims}.items()
                     if i.tag is not None} if inputs is not None else None
        unchanged.remember(self.ctx, spec, found, [results[k].plan for k in keys], snapshots)
        return [results[k] for k in keys]

    def _unchanged(self, spec: Spec, keys: list[str], found: unchanged.Check, run_id: str) -> list[RunResult]:
        """The results of a run that found nothing moved (`run.unchanged`): NOOPs, and their outcome record."""
        started = time.perf_counter()
        assert found.plans is not None  # `check` found nothing moved: the NOOP plans
        results = [RunResult(found.plans[k], run_id, RunMetrics(pending_versions=0, rows_quarantined=0)) for k in keys]
        for r in results:
            r.seconds["plan"] = (time.perf_counter() - started) / len(keys)
        self._record_outcomes(spec, run_id, results, found.marks, RunInputs({}, {}, {}, {}))
        return results

    def check_sink(self, spec: Spec, partitions: Sequence[str] = ()) -> None:
        """Refuse (`SpecError`) a sink that is not this spec's output: an existing table it did not
        create (a source, a dimension, another flow's output) or a folder of other files. Reads only (on an
        object store the process's handle of the sink, moved forward: `tables.checkout_table`)."""
        held = self._checked_sink(spec, partitions)
        if held is not None:
            held[1]()

    def _checked_sink(self, spec: Spec, partitions: Sequence[str]) -> tuple[DeltaTable, Callable[[], None]] | None:
        """`check_sink`, keeping the sink's handle checked out for the run (None: no sink yet): its commit starts
        from it instead of proving the log's latest version again (a listing on an object store). A commit that
        landed since makes the run's commit of the same version fail and list again, as any concurrent one."""
        uri = self.ctx.layout.sink_uri(spec)
        try:
            table, release = checkout_table(uri, name=spec.name)
        except TableNotFoundError:
            table, release = None, None
        try:
            check_owner(uri, spec.name, apps=[self.ctx.layout.app_id(spec, k) for k in partitions], table=table)
        except BaseException:
            if release is not None:
                release()
            raise
        return (table, release) if table is not None and release is not None else None

    def _record_outcomes(self, spec: Spec, run_id: str, results: list[RunResult], marks: dict, inputs: RunInputs) -> None:
        """Keep what the run did for the hit and fallback rates; a record that cannot be written costs a
        sample of the statistics, not the run (its results are committed)."""
        done = [outcomes.outcome_of(spec, r, inputs.histories_after(marks.get(r.plan.partition))) for r in results]
        for r, o in zip(results, done):  # the run's own numbers, for its asset metadata
            r.metrics.refilled_share = o.refilled_share
            r.metrics.refilled_windows, r.metrics.change_rows = o.refilled_windows, o.change_rows  # None: not known
        try:
            outcomes.record(self.ctx.store.root, spec, run_id, done)
        except (StorageError, OSError) as exc:
            log.warning("%s: run %s's outcome record was not written (%s); `laminar status` rates miss this run",
                        spec.name, run_id, exc)

    def _execute(self, spec: Spec, plans: dict[str, PartitionPlan], marks: dict, inputs: RunInputs, run_id: str,
                 force: bool, claims: protocol.Claims, found: unchanged.Check | None = None) -> dict[str, RunResult]:
        ctx = self.ctx
        try:
            seqs = protocol.begin_all(ctx, spec, plans, marks, inputs.input_schema, claims, opened=inputs.opened,
                                      source_ids=inputs.source_ids(), open_table=inputs.own_table)
            ctx.hook("after_intent")
            t0 = time.perf_counter()
            outcome = self._pass(spec, plans, marks, inputs, seqs, run_id, force)
            pass_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            protocol.finish_all(ctx, spec, plans, inputs.input_schema, seqs, claims, source_ids=inputs.source_ids(),
                                source_tags=lambda p: unchanged.tags_at(found, p.to_versions))
            ctx.hook("after_watermark")
        except InjectedCrash:
            raise  # a simulated kill: nothing more is written
        except (LaminarError, *CURABLE) as exc:
            self._stop_waiting(exc)
            moved = [k for k in plans if _finished(ctx, spec, k, marks[k])]
            stuck = [k for k in plans if k not in moved]
            protocol.record_failures(ctx, spec, stuck, protocol.short(exc), claims)
            if isinstance(exc, LaminarError):
                raise
            done = f"; partition(s) {', '.join(moved)} finished before the failure" if moved else ""
            raise RunFailedError(f"run of '{spec.name}' failed: {protocol.short(exc)}; the watermark of partition(s) "
                                 f"{', '.join(stuck)} did not move and the next run refills them{done}",
                                 flow=spec.name, run_id=run_id) from exc
        n = len(plans)
        seconds = {k: v / n for k, v in outcome.seconds.items()}
        seconds.update(other=max(pass_s - sum(outcome.seconds.values()), 0.0) / n,
                       watermark=(time.perf_counter() - t1) / n)
        out = {}
        for i, (k, p) in enumerate(plans.items()):
            metrics = RunMetrics.of(outcome.metrics.get(k, {}))
            refilled: dict[str, Any] = {f"refilled_{spec.refill_unit}": len(p.refill_groups)} if p.refill_groups else {}
            metrics.update(versions_read=_versions_read(p), pending_versions=sum(p.pending_versions.values()),
                           batch_partitions=n, **refilled)
            if isinstance(outcome, flow_job.PassResult):  # shared commits: their row counts once
                metrics.update(state_rows=outcome.state_rows if i == 0 else 0, sink_rows=outcome.sink_rows if i == 0 else 0)
            out[k] = RunResult(plans[k], run_id, metrics, dict(seconds), dict(outcome.quarantined.get(k, {})))
        return out

    def _pass(self, spec, plans, marks, inputs, seqs, run_id, force):
        """One pass; a pass that finds windows it must recompute after all (precision lost, a
        duplicate replaced) plans those partitions again (in `plans`) and runs once more."""
        job = JOBS[spec.kind]
        target = dict(next(iter(plans.values())).to_versions)  # the versions the pass reads, shared by its plans
        escalated: dict[str, dict] = {}  # what earlier attempts found, kept when a later one finds more
        for _attempt in range(4):  # a small pass counts ties exactly, its re-plan may not: one more
            try:
                return job.run_pass(self.ctx, spec, list(plans.values()), seqs, inputs, run_id)
            except flow_job.WindowsToRecompute as lost:
                again = {k: _escalation(escalated.get(k), lost.reasons[k], w, lost.groups.get(k))
                         for k, w in lost.windows.items()}
            except stage_job.DedupReplaced as dup:  # or OutputReset: SCHEMA_CHANGED
                again = {k: dict(escalation=Reason(dup.reason)) for k in dup.partitions}
            for k, kw in again.items():
                escalated[k] = kw
                plans[k] = _at_target(spec, plan_partition(planner_input(spec, k, marks[k], inputs, force=force, **kw)),
                                      target, inputs, run_id)
        raise RunFailedError(f"run of '{spec.name}' kept finding windows to recompute", flow=spec.name, run_id=run_id)

    # --- steps ----------------------------------------------------------------
    def _load_tagged(self, spec: Spec, keys: list[str]) -> dict[str, tuple[Watermark | None, str | None]]:
        """Every watermark with its tag: one listing and only those that changed since this process read or
        wrote them (one read for a single partition)."""
        if len(keys) > 1:
            return self.ctx.store.load_listed_tagged(spec.name, keys)
        return {k: self.ctx.store.load_tagged(spec.name, k) for k in keys}

    def _settle(self, spec: Spec, keys: list[str], run_id: str, claims: protocol.Claims,
                read: dict[str, Watermark | None]) -> dict[str, Watermark | None]:
        """Finish or discard interrupted runs (re-deriving sinks in one job), each partition claimed first."""
        marks, settled = {}, {}
        rederive: list[tuple[str, int, dict]] = []
        pending = [k for k in keys if (was := read[k]) is not None and was.pending is not None]
        claims.claim_all({k: read[k] for k in pending})
        for k in keys:
            mark = read[k]
            if k in pending:
                assert mark is not None  # pending: it has a watermark
                s = protocol.settle(self.ctx, spec, k, mark.with_(holder=None))
                settled[k] = s
                if s.rederive_sink:
                    assert s.input_schema is not None  # settle gives it with rederive_sink
                    rederive.append((k, s.seq, s.input_schema))
                mark = s.mark
            marks[k] = mark
        if rederive:  # settle asks it only of a spec that keeps state
            flow_state.rederive_sinks(self.ctx, spec.aggregation_for("re-deriving a sink from state"), rederive,
                                      f"{run_id}-recovered")
        for k, ok in zip(settled, claims.write_many([(k, s.mark, True) for k, s in settled.items()])):
            if not ok:
                raise claims.taken(k)
        return marks

    def _settled_view(self, spec: Spec, key: str) -> Watermark | None:
        mark = self.ctx.store.load(spec.name, key)
        return protocol.settle(self.ctx, spec, key, mark).mark if mark and mark.pending else mark

    def _plan_all(self, spec, marks: dict, inputs: RunInputs, force: bool) -> dict[str, PartitionPlan]:
        if not force:  # a column read under another type family: refused before anything is read
            refuse_retyped_reads(spec, marks, inputs)
        plans = {k: plan_partition(planner_input(spec, k, m, inputs, force=force)) for k, m in marks.items()}
        opts = self.ctx.options
        ratio, extremes_how = opts.refill_ratio, opts.extreme_refill
        if not spec.keeps_state:  # cost estimates only where state merges; a stage's deletes: by key
            return self._scope_keys(spec, plans, marks, inputs, force)
        for k, p in plans.items():
            if p.mode is not Mode.INCREMENTAL:
                continue
            extremes: dict[str, Any] = {}
            if extremes_how != "merge" and spec.held_extremes and _retracts(p, inputs):
                groups, size = flow_state.state_extent(self.ctx, spec, k, inputs.input_schema)
                extremes = dict(extreme_refill=extremes_how, state_groups=groups, state_bytes=size,
                                partition_rows=partition_rows(spec, inputs, k, p.to_versions),
                                pass_seconds=opts.pass_seconds, scan_bytes_per_second=opts.scan_bytes_per_second)
            if ratio is not None or extremes:
                plans[k] = plan_partition(planner_input(
                    spec, k, marks[k], inputs, force=force, partition_bytes=partition_bytes(spec, inputs, k, p.to_versions),
                    refill_ratio=ratio, refill_min_bytes=opts.refill_min_bytes, **extremes))
        scoped = {k: p for k, p in plans.items() if p.reason is Reason.NON_APPEND_ON_NON_RETRACTABLE
                  and opts.group_refill_share is not None and spec.refresh is not RefreshPolicy.INCREMENTAL_STRICT}
        if scoped:  # which groups the deletes and updates touch: one Spark job over their change rows
            try:
                found = flow_job.changed_groups(self.ctx, spec, list(scoped.values()), inputs)
            except CURABLE as exc:
                raise RunFailedError(f"finding the groups the deletes and updates of '{spec.name}' touch failed: "
                                     f"{protocol.short(exc)}; nothing was written", flow=spec.name) from exc
            for k in scoped:
                plans[k] = plan_partition(planner_input(
                    spec, k, marks[k], inputs, force=force, changed_groups=found[k].hashes,
                    group_refill_share=opts.group_refill_share,
                    state_groups=flow_state.state_groups(self.ctx, spec, k, inputs.input_schema)))
                if plans[k].refill_groups:  # their key values let the refill skip files by statistics
                    plans[k] = replace(plans[k], group_keys=found[k].values)
        return plans

    def _scope_keys(self, spec, plans: dict[str, PartitionPlan], marks: dict, inputs: RunInputs,
                    force: bool) -> dict[str, PartitionPlan]:
        """A stage's deletes and updates recompute the dedup keys they touch (one Spark job over their
        change rows finds them), where the output partition is large enough to make that cheaper."""
        opts = self.ctx.options
        if opts.group_refill_share is None or spec.refresh is RefreshPolicy.INCREMENTAL_STRICT \
                or stage_keys.key_hash_sql(spec) is None:
            return plans
        uri = self.ctx.layout.sink_uri(spec)
        scoped, rows = {}, {}
        for k, p in plans.items():
            if p.reason is not Reason.NON_APPEND_ON_NON_RETRACTABLE or not p.refill:
                continue
            try:
                held, size, why = stage_keys.output_size(spec, uri, k)
            except (*CURABLE, LaminarError) as exc:  # an unreadable output: its partition refills whole
                log.warning("%s: the output of %s could not be sized (%s); it is recomputed whole", spec.name, k, exc)
                continue
            if held is None:
                why = "its files' statistics give no row counts"
            elif size < opts.key_refill_min_bytes:
                why = f"its output ({size:,} bytes) is under key_refill_min_bytes ({opts.key_refill_min_bytes:,})"
            if why:
                plans[k] = replace(p, detail=f"{p.detail}; {why}: recomputed whole")
                continue
            scoped[k], rows[k] = p, held
        if scoped:
            try:
                found = stage_keys.changed_keys(self.ctx, spec, list(scoped.values()), inputs, most=MAX_REFILL_GROUPS)
            except CURABLE as exc:
                raise RunFailedError(f"finding the keys the deletes and updates of '{spec.name}' touch failed: "
                                     f"{protocol.short(exc)}; nothing was written", flow=spec.name) from exc
            for k in scoped:
                n, keys, values = found[k].count, found[k].hashes, found[k].values
                if keys is None:
                    plans[k] = replace(plans[k], detail=f"{plans[k].detail}; {n:,} key(s) changed, more than "
                                                        f"{MAX_REFILL_GROUPS:,}: recomputed whole")
                    continue
                plans[k] = plan_partition(planner_input(
                    spec, k, marks[k], inputs, force=force, changed_groups=keys,
                    group_refill_share=opts.group_refill_share, state_groups=rows[k]))
                if plans[k].refill_groups:  # their values let the refill skip files by statistics
                    plans[k] = replace(plans[k], group_keys=values)
        return plans

    def _refuse_strict(self, spec: Spec, plans: dict[str, PartitionPlan]) -> None:
        if spec.refresh is not RefreshPolicy.INCREMENTAL_STRICT:
            return
        for k, plan in plans.items():
            if plan.mode is Mode.REFILL and plan.reason is not Reason.FORCED_BY_USER:
                raise StrictRefreshError(
                    f"flow '{spec.name}' is incremental_strict but partition {k} needs a refill: "
                    f"{plan.detail}. Run an explicit refill (force=True / `laminar refill`) or relax the policy",
                    reason=plan.reason.value, flow=spec.name, partition=k)

    def _sweep(self, spec: Spec, plan: PartitionPlan, run_id: str, inputs: RunInputs) -> SweepResult:
        try:
            return sweep(self.ctx, spec, plan, run_id, opened=inputs.infos, histories=inputs.histories)
        except CURABLE as exc:
            raise RunFailedError(f"quarantine sweep of '{spec.name}' failed: {protocol.short(exc)}; nothing was "
                                 "written to the partition", flow=spec.name, partition=plan.partition,
                                 run_id=run_id) from exc

    def _check(self, spec: Spec, info, dims) -> CheckedSource:
        return checked_source(self.ctx.spark, spec, info, dims)

    def _keys(self, spec: Spec, partitions: list[str]) -> list[str]:
        return checked_keys(spec, partitions, future_horizon=self.ctx.options.future_horizon)

    def integrity(self, spec: Spec) -> list[integrity.TableIntegrity]:
        """Whether every file the latest snapshot of each table Laminar writes for `spec` names exists
        (its sink or output, its state tables, its sources' quarantine tables)."""
        return integrity.check_spec(self.ctx.layout, spec)

    def deliver(self, export: ExportSpec, source: Spec, *, partitions=(), full: bool = False) -> DeliveryResult:
        """Deliver `export` (reading `source`'s table) to its target: see `export.Exporter.deliver` (no Spark)."""
        return Exporter(self.root, connections=self.connections, hook=self.ctx.hook).deliver(
            export, source, partitions=partitions, full=full)

    # --- reading results --------------------------------------------------------
    def sink_frame(self, spec: Spec, partition: str) -> DataFrame:
        """The sink rows of one partition, as a (lazy) Spark DataFrame."""
        return self.sink_frames(spec, [partition])

    def sink_frames(self, spec: Spec, partitions: list[str]) -> DataFrame:
        """The sink rows of several partitions from one table open, as one (lazy) Spark DataFrame."""
        return sink_read.sink_frame(self.ctx, spec, partitions)[0]

    def sink_tables(self, spec: Spec, partitions: list[str], *, max_bytes: int | None = None):
        """The sink rows of each partition as Arrow tables read by the driver, without a Spark job;
        None when Spark must read them (see `sink_read.sink_table`). `max_bytes`: of Parquet files
        (default: the engine's `driver_write_below_bytes`)."""
        limit = self.ctx.options.driver_write_below_bytes if max_bytes is None else max_bytes
        if self.spark.conf.get("spark.sql.session.timeZone") not in sink_read.UTC_NAMES:
            return None  # Spark would show times in another zone (a session setting): let it fetch them
        return sink_read.sink_table(self.ctx, spec, partitions, max_bytes=limit)

    def preview(self, spec: Spec, partition: str, *, limit: int = 5):
        """A few sink rows of one partition (the first by time), as pandas (for run metadata and the CLI). A
        partition under `driver_write_below_bytes` is read by the driver (`sink_tables`: a GET per file, no Spark
        job: the step that shows the preview ends sooner, and the steps after it start sooner), else by Spark."""
        tables = self.sink_tables(spec, [partition])
        if tables is not None:
            return sink_read.first_rows(tables[partition], sink_read.time_column(spec), limit)
        df, size = sink_read.sink_frame(self.ctx, spec, [partition])
        with interpreted(self.spark, size < self.ctx.options.interpreted_below_bytes):
            return df.orderBy(sink_read.time_column(spec)).limit(limit).toPandas()


def _catalog_name(name: str) -> str:
    """A table's name in a catalog schema: lower case, anything but letters, digits and _ as _."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def checked_keys(spec: Spec, partitions: list[str], *, first: datetime | None = None,
                 future_horizon: timedelta | None = EngineOptions.future_horizon) -> list[str]:
    """The partitions, once each, after checking every key before anything is read or written. A key
    that is not a partition of the spec's partitioning (an hourly key ending in ':30'), that its windows'
    arithmetic cannot hold (year 9999), before `first` (default: the spec's `start`) or starting after now
    + `future_horizon` is refused with an error naming the spec and the key: a run of it would leave the
    watermark of a partition no orchestrator offers."""
    keys = list(dict.fromkeys(partitions))
    if not keys:
        raise LaminarError(f"no partitions given for '{spec.name}'", flow=spec.name)
    first = first or spec.start_time
    reach = _window_reach(spec)
    until = later(datetime.now(UTC), future_horizon) if future_horizon is not None else None
    for k in keys:
        try:
            part = check_partition(k, spec.granularity, reach)
        except ValueError as exc:
            raise LaminarError(f"bad partition key for '{spec.name}': {exc}; nothing was run", flow=spec.name,
                               partition=k) from None
        if first is not None and part.start < first:
            raise LaminarError(f"partition {k} of '{spec.name}' is before its first partition ({first:%Y-%m-%d %H:%M} "
                               "UTC); nothing was run: choose a later one, or set the start earlier", flow=spec.name,
                               partition=k)
        if until is not None and part.start > until:
            assert future_horizon is not None  # `until` is from it
            raise LaminarError(f"partition {k} of '{spec.name}' starts more than {describe_duration(future_horizon)} after "
                               f"now (after {until:%Y-%m-%d %H:%M} UTC: future_horizon); nothing was run", flow=spec.name,
                               partition=k)
    return keys


def _window_reach(spec: Spec) -> timedelta:
    """How far the spec's windows reach beyond a partition: the event times it reads after the
    partition's end, the window starts before its start (a hopping flow's; zero for a stage)."""
    part = Interval(EPOCH, EPOCH + spec.granularity.step)
    return max(spec.events_needed(part).end - part.end, part.start - spec.output_times_of(part).start)


def _finished(ctx: RunContext, spec: Spec, key: str, mark: Watermark | None) -> bool:
    """`protocol.finished_since`, False when the watermark cannot be read (the store that failed the
    pass may not answer either): such a partition is reported as not finished, and the next run settles it."""
    try:
        return protocol.finished_since(ctx, spec, key, mark)
    except (LaminarError, OSError):
        return False


def _by_target(plans: dict[str, PartitionPlan], keys: list[str]) -> list[list[str]]:
    groups: dict[tuple, list[str]] = {}
    for k in keys:
        groups.setdefault(tuple(sorted(plans[k].to_versions.items())), []).append(k)
    return list(groups.values())


def _at_target(spec: Spec, plan: PartitionPlan, target: dict[str, int], inputs: RunInputs, run_id: str) -> PartitionPlan:
    """An escalated plan at the versions its pass reads: a whole refill is planned at the latest
    versions, but a bounded pass reads an earlier snapshot, and its watermark must name what it read
    (the versions after it are the next run's). Fails the run when that snapshot is gone (vacuumed):
    the next run refills at the latest version."""
    if plan.to_versions == target:
        return plan
    for src, version in target.items():
        hist = inputs.histories.get(src)
        gone = hist.snapshot_readable(version) if hist is not None and version < hist.latest_version else None
        if gone:
            raise RunFailedError(f"run of '{spec.name}' must recompute partition {plan.partition} at version {version} "
                                 f"of '{src}', which is no longer readable ({gone})", flow=spec.name,
                                 partition=plan.partition, run_id=run_id)
    pending = {src: inputs.histories[src].latest_version - v for src, v in target.items() if src in inputs.histories}
    return replace(plan, to_versions=dict(target), pending_versions=pending)


def _versions_read(plan: PartitionPlan) -> int:
    """Source versions the run moved past its watermark; a source that went back (recreated, restored) counts 0,
    not a negative number (its refill reads the snapshot at the new version)."""
    return sum(max(to - was, 0) if (was := plan.from_versions.get(s)) is not None else 0
               for s, to in plan.to_versions.items())


def _retracts(plan: PartitionPlan, inputs: RunInputs) -> bool:
    """Whether the plan merges a commit that deletes or updates rows."""
    for src, versions in plan.incremental_versions.items():
        wanted = set(versions)
        if any(c.version in wanted and c.kind is not CommitKind.APPEND for c in inputs.histories[src].commits):
            return True
    return False


def _escalation(before: dict | None, reason: Reason, windows: tuple, groups: tuple[int, ...] | None) -> dict:
    """The planner's escalation for windows (and, for EXTREME_RETRACTED, only their `groups`) a pass
    found, added to what an earlier attempt of the run found."""
    if before is not None and before.get("escalation_scope"):
        if Reason.PRECISION_LOSS in (reason, before["escalation"]):
            reason, groups = Reason.PRECISION_LOSS, None
        elif groups is not None and before.get("escalation_groups") is not None:
            groups = (*before["escalation_groups"], *groups)
        else:
            groups = None
        windows = (*before["escalation_scope"], *windows)
    return dict(escalation=reason, escalation_scope=tuple(windows), escalation_groups=groups)
