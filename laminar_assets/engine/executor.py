"""Carrying out a plan: read changes, build partial state, merge, commit, advance the watermark.

The watermark protocol (see docs/ARCHITECTURE.md):
  1. take the partition lease; recover an interrupted run from its intent record;
  2. write the intent (`pending`: run seq + target versions) into the watermark file;
  3. commit the partition's new state rows  (Delta txn app_id=<flow>/<partition>, version=seq);
  4. commit the partition's sink rows, derived from the committed state (same txn);
  5. replace the watermark with the target versions and seq.
A crash after 3 is finished on restart from the committed state; a crash before
3 leaves nothing behind and the next run refills (PREVIOUS_ATTEMPT_FAILED).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from py4j.protocol import Py4JError

from laminar_assets.checkpoints import CheckpointStore, PendingRun, Watermark

from .aggregates import EVENT_TS, ROWS, SIGN, AggImpl, implementation, q
from .delta_source import (
    CommitKind, DataFile, SourceHistory, TableInfo, resolve_uri, snapshot_files, source_history, table_info, temporal,
)
from laminar_assets.errors import ConcurrentRunError, InjectedCrash, LaminarError, RunFailedError, StrictRefreshError
from .plan import Mode, PartitionPlan, Reason
from . import quarantine as qr
from .quarantine import FILE, ROW, RULE, VERSION
from .planner import PlannerInput, plan_partition
from .spark_io import (
    CHANGE_TYPE, _arrow_schema_of, new_run_id, nullable, read_files, replace_range, replace_range_with_change_data,
)
from .spec import FlowSpec, RefreshPolicy, StageSpec
from .validate import apply_row_logic, check_source, event_time_column
from .windows import Interval, assign_windows, partition_interval, to_micros

Hook = Callable[[str], None]
STEPS = ("after_intent", "after_read", "after_state_commit", "after_sink_commit", "after_watermark")
_SIGNS = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


class _Escalate(Exception):
    def __init__(self, reason: Reason) -> None:
        self.reason = reason


@dataclass(frozen=True)
class RunResult:
    """What one run did for one (flow, partition): the plan, and measured numbers."""

    plan: PartitionPlan
    run_id: str
    metrics: dict[str, float | int] = field(default_factory=dict, hash=False)
    seconds: dict[str, float] = field(default_factory=dict, hash=False)
    quarantined: dict[str, int] = field(default_factory=dict, hash=False)  # new quarantine rows by rule

    @property
    def mode(self) -> Mode:
        return self.plan.mode

    @property
    def reason(self) -> Reason:
        return self.plan.reason

    @property
    def detail(self) -> str:
        return self.plan.detail

    def to_json(self) -> dict:
        return {"run_id": self.run_id, **self.plan.to_json(), "metrics": self.metrics, "seconds": self.seconds,
                "quarantined": self.quarantined}


@dataclass
class _Inputs:
    infos: dict[str, TableInfo]
    histories: dict[str, SourceHistory]
    dims: dict[str, TableInfo]
    input_schema: dict[str, str]


class Engine:
    """Brings (flow, partition) pairs up to date. A plain library: no Dagster here.

    `root` is the storage root: source, sink and stage tables are resolved under
    it by name (or given as absolute paths), and Laminar keeps its state tables
    and watermarks under `<root>/_laminar/`.
    """

    def __init__(self, spark: SparkSession, root: str, *, hook: Hook | None = None,
                 lease_seconds: float = 6 * 3600) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        self.store = CheckpointStore(self.root, lease_seconds=lease_seconds)
        self.hook = hook or (lambda step: None)
        self._checked: dict[tuple, dict[str, str]] = {}

    # --- locations -------------------------------------------------------
    def table_uri(self, name: str) -> str:
        return resolve_uri(self.root, name)

    def state_uri(self, spec: FlowSpec, input_schema: dict[str, str]) -> str:
        """State of one spec over one input schema: a compatible type change (SCHEMA_CHANGED) refills
        into a fresh table instead of clashing with the old state's column types."""
        import hashlib
        import json

        schema = hashlib.sha256(json.dumps(sorted(input_schema.items())).encode()).hexdigest()[:8]
        return f"{self.root}/_laminar/state/{spec.name}/{spec.spec_hash}-{schema}"

    def quarantine_uri(self, source: str) -> str:
        """The quarantine table of one source (see quarantine.py)."""
        return f"{self.root}/_laminar/quarantine/{qr.table_name(source)}"

    def sink_uri(self, spec: FlowSpec | StageSpec) -> str:
        return self.table_uri(spec.sink)

    @staticmethod
    def app_id(spec, partition: str) -> str:
        return f"laminar/{spec.name}/{partition}"

    # --- public API ------------------------------------------------------
    def plan(self, spec: FlowSpec | StageSpec, partition: str, *, force: bool = False) -> PartitionPlan:
        """What a run would do now; reads, never writes."""
        self._check_partition(spec, partition)
        return self._current(spec, partition, force)[2]

    def _current(self, spec, partition: str, force: bool = False):
        """(watermark, inputs, plan) as a run would see them now, without settling anything on disk."""
        mark = self.store.load(spec.name, partition)
        if mark is not None and mark.pending is not None:
            mark = self._settled(spec, partition, mark, write=False)
        inputs = self._gather(spec, mark)
        return mark, inputs, plan_partition(self._planner_input(spec, partition, mark, inputs, force))

    def _prepared(self, spec, partition: str, run_id: str, force: bool):
        """Under the partition's lease: settle an interrupted run, gather and plan. (mark, inputs, plan)."""
        mark = self.store.load(spec.name, partition)
        if mark is not None and mark.pending is not None:
            mark = self._settled(spec, partition, mark, write=True)
        inputs = self._gather(spec, mark)
        plan = plan_partition(self._planner_input(spec, partition, mark, inputs, force))
        strict = spec.refresh is RefreshPolicy.INCREMENTAL_STRICT and plan.reason is not Reason.FORCED_BY_USER
        if strict and plan.mode is Mode.REFILL:
            raise StrictRefreshError(
                f"flow '{spec.name}' is incremental_strict but partition {partition} needs a refill: "
                f"{plan.detail}. Run an explicit refill (force=True / `laminar refill`) or relax the policy",
                reason=plan.reason.value, flow=spec.name, partition=partition,
            )
        return mark, inputs, plan

    def _sweep_or_fail(self, spec, plan: PartitionPlan, run_id: str) -> dict[str, int]:
        try:
            return self._sweep(spec, plan, run_id)
        except LaminarError:
            raise
        except Exception as exc:
            raise RunFailedError(f"quarantine sweep of '{spec.name}' failed: {_short(exc)}; nothing was written "
                                 "to the partition", flow=spec.name, partition=plan.partition, run_id=run_id) from exc

    def _noop(self, spec, plan: PartitionPlan, mark: Watermark | None, run_id: str, seconds: dict,
              swept: dict[str, int]) -> RunResult:
        """Nothing to compute: record the newer versions the partition is already up to date with."""
        if mark is not None and mark.committed and plan.to_versions != mark.source_versions:
            self.store.save(mark.with_(source_versions=dict(plan.to_versions), last_mode=plan.mode.value,
                                       last_reason=plan.reason.value))
        return RunResult(plan, run_id, {"pending_versions": sum(plan.pending_versions.values()),
                                        "rows_quarantined": sum(swept.values())}, seconds, dict(swept))

    def run(self, spec: FlowSpec | StageSpec, partition: str, *, force: bool = False) -> RunResult:
        """Bring one partition up to date; returns what was done and measured."""
        self._check_partition(spec, partition)
        run_id = new_run_id()
        with self.store.lease(spec.name, partition, run_id):
            started = time.perf_counter()
            mark, inputs, plan = self._prepared(spec, partition, run_id, force)
            gather_s = time.perf_counter() - started
            swept = self._sweep_or_fail(spec, plan, run_id)
            if plan.mode is Mode.NOOP:
                return self._noop(spec, plan, mark, run_id, {"plan": gather_s}, swept)
            try:
                try:
                    result = self._execute(spec, plan, mark, inputs, run_id)
                except _Escalate as esc:
                    plan = plan_partition(self._planner_input(spec, partition, mark, inputs, force, esc.reason))
                    result = self._execute(spec, plan, mark, inputs, run_id)
            except InjectedCrash:
                raise  # a simulated kill: nothing more is written
            except Exception as exc:
                self._record_failure(spec, partition, mark, exc)
                if isinstance(exc, LaminarError):
                    raise
                raise RunFailedError(
                    f"run of '{spec.name}' partition {partition} failed: {_short(exc)}; the watermark did not "
                    "move and the next run refills", flow=spec.name, partition=partition, run_id=run_id,
                ) from exc
            result.seconds["plan"] = gather_s
            for rule, n in swept.items():
                result.quarantined[rule] = result.quarantined.get(rule, 0) + n
            result.metrics["rows_quarantined"] = sum(result.quarantined.values())
            return result

    def run_many(self, spec: FlowSpec | StageSpec, partitions: list[str], *, force: bool = False) -> list[RunResult]:
        """Bring several partitions of a flow up to date in one pass: one Spark job reads and merges
        all of them, one state commit and one sink commit carry every partition's transaction.

        Plans, reasons, results and the commit protocol are those of `run` per partition (each
        partition keeps its own lease, intent, app transaction and watermark); only the Spark work is
        shared, so per-job latency is paid once instead of once per partition. Stages run partition
        by partition. Results come back in the order of `partitions`.
        """
        keys = list(dict.fromkeys(partitions))
        if isinstance(spec, StageSpec) or len(keys) < 2:
            return [self.run(spec, k, force=force) for k in keys]
        for k in keys:
            self._check_partition(spec, k)
        run_id = new_run_id()
        with ExitStack() as leases:
            for k in keys:
                leases.enter_context(self.store.lease(spec.name, k, run_id))
            started = time.perf_counter()
            prepared = {k: self._prepared(spec, k, run_id, force) for k in keys}
            gather_s = (time.perf_counter() - started) / len(keys)
            swept = self._sweep_or_fail(spec, prepared[keys[0]][2], run_id)
            results: dict[str, RunResult] = {}
            todo = []
            for k in keys:
                mark, inputs, plan = prepared[k]
                if plan.mode is Mode.NOOP:
                    results[k] = self._noop(spec, plan, mark, run_id, {"plan": gather_s}, {})
                else:
                    todo.append((k, mark, inputs, plan))
            if todo:
                schemas = {json.dumps(sorted(i.input_schema.items())) for _, _, i, _ in todo}
                try:
                    if len(schemas) > 1:  # a source changed type between plans: no shared state table
                        results.update({k: self._execute(spec, plan, mark, inputs, new_run_id())
                                        for k, mark, inputs, plan in todo})
                    else:
                        results.update(self._execute_many(spec, todo, run_id))
                except InjectedCrash:
                    raise
                except Exception as exc:
                    for k, mark, _, _ in todo:
                        current = self.store.load(spec.name, k)
                        if current is not None and current.pending is None and \
                                current.seq > (mark.seq if mark else 0):
                            continue  # this partition finished before the failure
                        self._record_failure(spec, k, mark, exc)
                    if isinstance(exc, LaminarError):
                        raise
                    raise RunFailedError(
                        f"run of '{spec.name}' partitions {todo[0][0]}..{todo[-1][0]} failed: {_short(exc)}; "
                        "no watermark moved and the next run refills", flow=spec.name, run_id=run_id,
                    ) from exc
                for k, *_ in todo:
                    results[k].seconds["plan"] = gather_s
        first = results[keys[0]]
        for rule, n in swept.items():
            first.quarantined[rule] = first.quarantined.get(rule, 0) + n
        for k in keys:
            results[k].metrics["rows_quarantined"] = sum(results[k].quarantined.values())
        return [results[k] for k in keys]

    def _execute_many(self, spec: FlowSpec, todo: list, run_id: str) -> dict[str, RunResult]:
        """`_execute` for several partitions of one flow with shared Spark jobs and commits."""
        schema = todo[0][2].input_schema
        seqs = {k: self._begin(spec, plan, mark, inputs, run_id) for k, mark, inputs, plan in todo}
        self.hook("after_intent")
        n = len(todo)
        t0 = time.perf_counter()
        metrics: dict[str, dict] = {k: {} for k, *_ in todo}
        quarantined: dict[str, dict] = {k: {} for k, *_ in todo}
        partials, rejects, in_refill = [], {}, F.lit(False)
        impls = group = None
        for k, _mark, inputs, plan in todo:
            partial, impls, group, refill_k, bad, rejects[k] = self._flow_partial(spec, plan, inputs, metrics[k])
            partials.append(partial.withColumn("__part", F.lit(k)))
            in_refill = in_refill | refill_k
        partial = partials[0]
        for p in partials[1:]:
            partial = partial.unionByName(p)
        partial = partial.persist()
        for row in partial.groupBy("__part").agg(*_partial_stats(bad)).collect():  # one row per partition
            metrics[row["__part"]].update(_stats_metrics(row))
        for k, *_ in todo:
            metrics[k].setdefault("rows_read", 0)
            if metrics[k].get("rows_rejected"):
                self._record_rejects(spec, rejects[k], k, run_id, quarantined[k])
        self.hook("after_read")
        read_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        plans = [plan for *_, plan in todo]
        merged = self._flow_merge(spec, plans, partial.where(~bad).drop("__part"), impls, group, in_refill, schema)
        state_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        keys = [k for k, *_ in todo]
        meta = {"laminar.run_id": run_id, "laminar.flow": spec.name, "laminar.partition": ",".join(keys),
                "laminar.mode": ",".join(sorted({p.mode.value for p in plans}))}
        rows = replace_range(
            self.spark, merged, table_uri=self.state_uri(spec, schema), column="window_start",
            rng=[p.interval for p in plans], run_id=run_id, metadata=meta,
            transactions=[(self.app_id(spec, k), seqs[k]) for k in keys],
        )
        merge_s = time.perf_counter() - t2
        partial.unpersist()
        self.hook("after_state_commit")
        t3 = time.perf_counter()
        sink_rows = self._write_sink(spec, keys, [seqs[k] for k in keys], run_id, schema)
        write_s = time.perf_counter() - t3
        self.hook("after_sink_commit")
        t4 = time.perf_counter()
        for k, _mark, inputs, plan in todo:
            self._finish(spec, plan, inputs, seqs[k], metrics[k])
            metrics[k]["batch_partitions"] = n
        self.hook("after_watermark")
        seconds = {"read": read_s / n, "state": state_s / n, "merge": merge_s / n, "write": write_s / n,
                   "watermark": (time.perf_counter() - t4) / n}
        out = {}
        for i, (k, _mark, _inputs, plan) in enumerate(todo):
            # the commits are shared: their row counts are reported once, on the batch's first partition
            metrics[k]["state_rows"], metrics[k]["sink_rows"] = (rows, sink_rows) if i == 0 else (0, 0)
            out[k] = RunResult(plan, run_id, metrics[k], dict(seconds), quarantined[k])
        return out

    def sink_frame(self, spec: FlowSpec | StageSpec, partition: str) -> DataFrame:
        """The sink rows of one partition, as a (lazy) Spark DataFrame."""
        uri = self.sink_uri(spec)
        if not DeltaTable.is_deltatable(uri):
            raise LaminarError(f"sink table of '{spec.name}' does not exist yet", flow=spec.name)
        part = partition_interval(partition, spec.granularity)
        column = "window_start" if isinstance(spec, FlowSpec) else spec.event_time
        info = table_info(spec.sink, uri)
        files = snapshot_files(info, column, [part])
        df = read_files(self.spark, files, info.schema, info.partition_columns)
        c = F.col(column)
        return df.where((c >= F.lit(part.start)) & (c < F.lit(part.end)))

    def preview(self, spec: FlowSpec | StageSpec, partition: str, *, limit: int = 5):
        """A few sink rows of one partition, as pandas (for run metadata and the CLI)."""
        column = "window_start" if isinstance(spec, FlowSpec) else spec.event_time
        return self.sink_frame(spec, partition).orderBy(column).limit(limit).toPandas()

    def finalize(self, spec: FlowSpec, state: DataFrame) -> DataFrame:
        """Sink rows (business columns only) from state rows."""
        impls = [implementation(a) for a in spec.aggregates]
        out = state.selectExpr("window_start", "window_end", *[q(k) for k in spec.keys],
                               *[impl.finalize() for impl in impls])
        for name, expr in spec.post:
            out = out.withColumn(name, F.expr(expr))
        return out

    # --- recovery --------------------------------------------------------
    def _txn(self, uri: str, app: str) -> int | None:
        try:
            return DeltaTable(uri).transaction_version(app)
        except Exception:
            return None

    def _settled(self, spec, partition: str, mark: Watermark, *, write: bool) -> Watermark:
        """Finish or discard the interrupted run recorded in `mark.pending`."""
        p = mark.pending
        app = self.app_id(spec, partition)
        sink_uri = self.sink_uri(spec)
        done_uri = self.state_uri(spec, p.input_schema) if isinstance(spec, FlowSpec) else sink_uri
        if self._txn(done_uri, app) == p.seq:
            if write and isinstance(spec, FlowSpec) and self._txn(sink_uri, app) != p.seq:
                self._write_sink(spec, partition, p.seq, f"{new_run_id()}-recovered", dict(p.input_schema))
            settled = mark.with_(
                seq=p.seq, source_versions=dict(p.target_versions), input_schema=dict(p.input_schema),
                last_mode=p.mode, last_reason=p.reason, pending=None, failed_attempt=None,
                spec_hash=spec.spec_hash if isinstance(spec, FlowSpec) else mark.spec_hash,
            )
        else:
            settled = mark.with_(pending=None, failed_attempt=f"run {p.run_id} stopped before it committed")
        if write:
            self.store.save(settled)
        return settled

    def _record_failure(self, spec, partition: str, mark: Watermark | None, exc: Exception) -> None:
        # Keep the intent record: if the state commit landed, the next run completes it.
        current = self.store.load(spec.name, partition) or mark
        base = current or Watermark(spec.name, partition, spec.spec_hash, {}, 0)
        try:
            self.store.save(base.with_(failed_attempt=_short(exc)))
        except OSError:
            pass

    # --- inputs ----------------------------------------------------------
    def _check_partition(self, spec, partition: str) -> None:
        try:
            partition_interval(partition, spec.granularity)
        except ValueError as exc:
            raise LaminarError(f"bad partition key for '{spec.name}': {exc}", flow=spec.name) from None

    def _gather(self, spec, mark: Watermark | None) -> _Inputs:
        infos, histories, schema = {}, {}, {}
        for src in spec.sources:
            uri = self.table_uri(src)
            info = table_info(src, uri)
            key = (spec.name, spec.spec_hash, uri, info.version)
            if key not in self._checked:  # the analyzer costs a Spark round trip; run_many asks per partition
                if len(self._checked) > 256:
                    self._checked.clear()
                self._checked[key] = check_source(self.spark, spec, info)
            fingerprint = self._checked[key]
            for col, typ in fingerprint.items():
                if col in schema and schema[col] != typ:
                    raise LaminarError(f"sources of '{spec.name}' disagree on the type of {col!r}: "
                                       f"{schema[col]} vs {typ} in '{src}'", flow=spec.name, table=src, column=col)
                schema[col] = typ
            infos[src] = info
            since = mark.source_versions.get(src) if (mark and mark.committed) else None
            histories[src] = source_history(src, uri, since, info.version, spec.event_time, info=info)
        dims = {}
        if isinstance(spec, StageSpec):
            for join in spec.joins:
                dims[join.table] = table_info(join.table, self.table_uri(join.table))
        return _Inputs(infos, histories, dims, schema)

    def _planner_input(self, spec, partition, mark, inputs: _Inputs, force: bool, escalation=None) -> PlannerInput:
        return PlannerInput(
            spec=spec, partition=partition, watermark=mark, histories=inputs.histories,
            dimension_versions={d: i.version for d, i in inputs.dims.items()},
            input_schema=inputs.input_schema, force=force, escalation=escalation,
        )

    # --- execution -------------------------------------------------------
    def _execute(self, spec, plan: PartitionPlan, mark: Watermark | None, inputs: _Inputs, run_id: str) -> RunResult:
        seq = self._begin(spec, plan, mark, inputs, run_id)
        self.hook("after_intent")
        seconds: dict[str, float] = {}
        metrics: dict[str, float | int] = {}
        quarantined: dict[str, int] = {}
        if isinstance(spec, FlowSpec):
            self._execute_flow(spec, plan, inputs, run_id, seq, metrics, seconds, quarantined)
        else:
            self._execute_stage(spec, plan, mark, inputs, run_id, seq, metrics, seconds, quarantined)
        t = time.perf_counter()
        self._finish(spec, plan, inputs, seq, metrics)
        seconds["watermark"] = time.perf_counter() - t
        self.hook("after_watermark")
        return RunResult(plan, run_id, metrics, seconds, quarantined)

    def _begin(self, spec, plan: PartitionPlan, mark: Watermark | None, inputs: _Inputs, run_id: str) -> int:
        """Check the run sequence against the table's transaction and write the intent; returns the seq."""
        app = self.app_id(spec, plan.partition)
        guard_uri = self.state_uri(spec, inputs.input_schema) if isinstance(spec, FlowSpec) else self.sink_uri(spec)
        committed = self._txn(guard_uri, app)
        seq = (mark.seq if mark else 0) + 1
        if (mark is None or not mark.committed) and committed is not None:
            # The watermark is gone (deleted by hand) but the table has run `committed`: this run
            # refills anyway, so it continues the table's sequence instead of clashing with it.
            seq = committed + 1
        if committed is not None and committed >= seq:
            raise ConcurrentRunError(
                f"the table already holds run {committed} of this partition but the watermark says {seq - 1}: "
                "another process wrote it concurrently", flow=spec.name, partition=plan.partition, table=guard_uri,
            )
        pending = PendingRun(seq=seq, run_id=run_id, target_versions=dict(plan.to_versions),
                             mode=plan.mode.value, reason=plan.reason.value, input_schema=dict(inputs.input_schema))
        base = mark or Watermark(spec.name, plan.partition, spec.spec_hash, {}, 0)
        self.store.save(base.with_(pending=pending))
        return seq

    def _finish(self, spec, plan: PartitionPlan, inputs: _Inputs, seq: int, metrics: dict) -> None:
        """Move the watermark to the plan's target versions (both commits have landed)."""
        self.store.save(Watermark(
            flow=spec.name, partition=plan.partition, spec_hash=spec.spec_hash,
            source_versions=dict(plan.to_versions), seq=seq, input_schema=dict(inputs.input_schema),
            last_mode=plan.mode.value, last_reason=plan.reason.value,
        ))
        metrics["versions_read"] = sum(
            (to - (plan.from_versions.get(s) or 0)) if plan.from_versions.get(s) is not None else 0
            for s, to in plan.to_versions.items()
        )
        metrics["pending_versions"] = sum(plan.pending_versions.values())

    def _commit_meta(self, plan: PartitionPlan, run_id: str) -> dict:
        return {"laminar.run_id": run_id, "laminar.flow": plan.flow, "laminar.partition": plan.partition,
                "laminar.mode": plan.mode.value, "laminar.reason": plan.reason.value}

    # --- reading ---------------------------------------------------------
    def _changes(self, spec, plan: PartitionPlan, inputs: _Inputs, metrics: dict) -> list[tuple[str, DataFrame]]:
        """(source, signed changed rows) of the incremental versions, pruned to the partition's event range."""
        frames = []
        for src, versions in plan.incremental_versions.items():
            if not versions:
                continue
            wanted = set(versions)
            adds, cdc, version_of = [], [], {}
            for commit in inputs.histories[src].commits:
                if commit.version not in wanted:
                    continue
                files = commit.adds if commit.kind is CommitKind.APPEND else commit.cdc
                chosen = [f for f in files if f.time_range is None or f.time_range.overlaps(plan.needed)]
                (adds if commit.kind is CommitKind.APPEND else cdc).extend(chosen)
                version_of.update({_basename(f): commit.version for f in chosen})
            metrics["files_read"] = metrics.get("files_read", 0) + len(adds) + len(cdc)
            metrics["bytes_read"] = metrics.get("bytes_read", 0) + sum(f.size for f in adds + cdc)
            frames += [(src, f) for f in self._read_changed(inputs.infos[src], adds, cdc, version_of)]
        return frames

    def _read_changed(self, info: TableInfo, adds: list[DataFile], cdc: list[DataFile],
                      version_of: dict[str, int], *, inserts_only: bool = False) -> list[DataFrame]:
        """Signed rows of added and change-data files, each with the commit version it came from."""
        out = []
        if adds:
            df = read_files(self.spark, adds, info.schema, info.partition_columns, file_column=FILE)
            out.append(df.withColumn(SIGN, F.lit(1)))
        if cdc:
            df = read_files(self.spark, cdc, info.schema, info.partition_columns, change_data=True, file_column=FILE)
            sign = F.coalesce(*[F.when(F.col(CHANGE_TYPE) == k, F.lit(v)) for k, v in _SIGNS.items()], F.lit(0))
            keep = F.col(SIGN) > 0 if inserts_only else F.col(SIGN) != 0
            out.append(df.withColumn(SIGN, sign).where(keep).drop(CHANGE_TYPE))
        return [df.withColumn(VERSION, qr.version_of_file(version_of)).drop(FILE) for df in out]

    def _snapshot(self, spec, plan: PartitionPlan, inputs: _Inputs, events: list[Interval],
                  metrics: dict) -> list[tuple[str, DataFrame]]:
        frames = []
        for src in spec.sources:
            info = table_info(src, self.table_uri(src), plan.to_versions[src])
            files = snapshot_files(info, spec.event_time, events)
            metrics["files_read"] = metrics.get("files_read", 0) + len(files)
            metrics["bytes_read"] = metrics.get("bytes_read", 0) + sum(f.size for f in files)
            if files:
                df = read_files(self.spark, files, info.schema, info.partition_columns)
                frames.append((src, df.withColumn(SIGN, F.lit(1)).withColumn(VERSION, F.lit(info.version).cast("long"))))
        return frames

    def _prepare(self, spec, frame: DataFrame, source: str) -> DataFrame:
        """Source rows with the event time, the first rule each breaks (RULE) and the original row (ROW).
        Rows breaking a rule pass the spec's filter so they reach the quarantine."""
        raw = [c for c in frame.columns if c not in (SIGN, VERSION)]
        df = frame.withColumn(ROW, qr.original_row(raw)).withColumn(RULE, qr.declared_rule(spec, source))
        for name, expr in spec.derived:  # not evaluated on broken rows (ANSI errors, e.g. x / 0)
            df = df.withColumn(name, F.when(F.col(RULE).isNull(), F.expr(expr)))
        df = df.withColumn(EVENT_TS, event_time_column(df, spec.event_time))
        df = df.withColumn(RULE, F.coalesce(F.col(RULE), qr.key_rule(spec)))
        if spec.filter:  # the filter picks among good rows; broken ones go on to the quarantine
            df = df.where(F.expr(spec.filter) | F.col(RULE).isNotNull() | ~qr.assigned(spec))
        return df

    def _record_rejects(self, spec, rejects: list[tuple[str, DataFrame]], partition: str | None, run_id: str,
                        counts: dict[str, int]) -> None:
        """Append rejected rows (RULE, ROW, VERSION, EVENT_TS) to each source's quarantine table."""
        by_source: dict[str, DataFrame] = {}
        for src, df in rejects:
            by_source[src] = df if src not in by_source else by_source[src].unionByName(df)
        for src, df in by_source.items():
            new = qr.record(self.spark, df, uri=self.quarantine_uri(src), flow=spec.name, partition=partition,
                            run_id=run_id)
            for rule, n in new.items():
                counts[rule] = counts.get(rule, 0) + n

    def _sweep(self, spec, plan: PartitionPlan, run_id: str) -> dict[str, int]:
        """Quarantine the rows no partition owns (missing, unparseable or out-of-bounds event time)
        in the source versions this flow has not swept yet. Idempotent; one sweeper at a time."""
        done = self.store.load_sweep(spec.name, spec.spec_hash)
        todo = {s: v for s, v in plan.to_versions.items() if s in spec.sources and done.get(s, -1) < v}
        if not todo:
            return {}
        counts: dict[str, int] = {}
        try:
            lease = self.store.lease(spec.name, "_sweep", run_id)
            lease.__enter__()
        except ConcurrentRunError:  # another run of this flow is sweeping these versions
            return {}
        try:
            done = self.store.load_sweep(spec.name, spec.spec_hash)
            for src, target in todo.items():
                if done.get(src, -1) >= target:
                    continue
                frames = self._unswept(spec, src, done.get(src), target)
                rejects = []
                for frame in frames:
                    rows = self._prepare(spec, frame, src).where(~qr.assigned(spec))
                    rows = rows.withColumn(RULE, F.coalesce(F.col(RULE), qr.unassigned_rule(spec)))
                    rejects.append((src, rows.select(RULE, ROW, VERSION, EVENT_TS)))
                self._record_rejects(spec, rejects, None, run_id, counts)
                done[src] = target
                self.store.save_sweep(spec.name, spec.spec_hash, done)
        finally:
            lease.__exit__(None, None, None)
        return counts

    def _unswept(self, spec, src: str, done: int | None, target: int) -> list[DataFrame]:
        """Rows of `src` added after version `done` up to `target` that may lack a usable event time:
        files whose statistics prove every event time present and in bounds are skipped."""
        uri = self.table_uri(src)
        info = table_info(src, uri, target)
        provable = temporal(info.schema, spec.event_time)
        bounds = spec.bounds

        def may_hold(f: DataFile) -> bool:
            if not provable or f.time_nulls is None or f.time_nulls > 0 or f.time_range is None:
                return True
            return bounds is not None and not (bounds.start <= f.time_range.start and f.time_range.end <= bounds.end)

        history = source_history(src, uri, done, target, spec.event_time, info=info) if done is not None else None
        if history is None or history.expired:
            files = [f for f in snapshot_files(info, spec.event_time, keep_null_files=True) if may_hold(f)]
            if not files:
                return []
            df = read_files(self.spark, files, info.schema, info.partition_columns)
            return [df.withColumn(SIGN, F.lit(1)).withColumn(VERSION, F.lit(target).cast("long"))]
        adds, cdc, version_of = [], [], {}
        for commit in history.commits:
            files = commit.cdc if commit.kind is CommitKind.CHANGE_DATA else commit.adds
            chosen = [f for f in files if may_hold(f)]
            (cdc if commit.kind is CommitKind.CHANGE_DATA else adds).extend(chosen)
            version_of.update({_basename(f): commit.version for f in chosen})
        return self._read_changed(info, adds, cdc, version_of, inserts_only=True)

    # --- flows -----------------------------------------------------------
    def _flow_partial(self, spec: FlowSpec, plan: PartitionPlan, inputs: _Inputs, metrics: dict):
        """Lazy partial states of everything the plan reads (changes and refill snapshot); runs no job."""
        part = plan.interval
        ws = F.col("window_start")
        in_part = (ws >= F.lit(part.start)) & (ws < F.lit(part.end))
        in_refill = F.lit(False)
        for r in plan.refill:
            in_refill = in_refill | ((ws >= F.lit(r.start)) & (ws < F.lit(r.end)))
        sources: list[tuple[str, DataFrame, object]] = []
        for src, frame in self._changes(spec, plan, inputs, metrics):
            sources.append((src, frame, in_part & ~in_refill))
        if plan.refill:
            events = [spec.shape.events_of_starts(r) for r in plan.refill]
            for src, frame in self._snapshot(spec, plan, inputs, events, metrics):
                sources.append((src, frame, in_part & in_refill))
        if not sources:  # nothing to read: an empty frame still gives the state its schema
            sources.append((spec.sources[0], self._empty_source(spec, inputs), F.lit(False)))
        group = ["window_start", "window_end", *spec.keys]
        partials, rejects = [], []
        impls: list[AggImpl] | None = None
        in_range = self._event_range_filter(spec, inputs, plan.needed)
        ts = F.col(EVENT_TS)
        own = (ts >= F.lit(part.start)) & (ts < F.lit(part.end))
        for src, frame, keep in sources:
            if in_range is not None:
                frame = frame.where(in_range)  # pushed down to Parquet row groups
            rows = self._prepare(spec, frame, src).where(qr.assigned(spec))
            rejects.append((src, rows.where(F.col(RULE).isNotNull() & (F.col(SIGN) > 0) & own)
                            .select(RULE, ROW, VERSION, EVENT_TS)))
            df = assign_windows(rows, EVENT_TS, spec.shape, primary_before=part.end).where(keep)
            if impls is None:
                impls = [implementation(a, df.schema[a.column].dataType if a.column else None) for a in spec.aggregates]
            partials.append(df.groupBy(*group, SIGN, RULE).agg(
                F.expr("sum(CASE WHEN __primary THEN 1 ELSE 0 END) AS __in_rows"),
                F.expr(f"sum(CASE WHEN {RULE} IS NOT NULL AND {SIGN} > 0 AND __primary AND {EVENT_TS} >= "
                       f"timestamp_micros({to_micros(part.start)}) AND {EVENT_TS} < "
                       f"timestamp_micros({to_micros(part.end)}) THEN 1 ELSE 0 END) AS __rejected"),
                F.expr(f"{SIGN} * count(1) AS {ROWS}"),
                *[F.expr(e) for impl in impls for e in impl.partial()],
            ))
        partial = partials[0]
        for p in partials[1:]:
            partial = partial.unionByName(p)
        return partial, impls, group, in_refill, F.col(RULE).isNotNull(), rejects

    def _event_range_filter(self, spec, inputs: _Inputs, rng: Interval):
        """`ts in rng` on the raw event-time column when it is a UTC timestamp (rows without one
        belong to the sweep); None when the column is derived or not a timestamp."""
        schema = inputs.infos[spec.sources[0]].schema
        if spec.event_time not in schema.names or spec.event_time in dict(spec.derived):
            return None
        typ = schema.field(spec.event_time).type
        if not (pa.types.is_timestamp(typ) and typ.tz is not None):
            return None
        c = F.col(spec.event_time)
        return (c >= F.lit(rng.start)) & (c < F.lit(rng.end))

    def _flow_merge(self, spec: FlowSpec, plans: list[PartitionPlan], good_partial: DataFrame, impls, group,
                    in_refill, schema: dict[str, str]):
        """Lazy merge of the kept old state of the plans' partitions with the new partial states
        (`in_refill`: the windows whose old state is replaced); runs no job."""
        state_cols = [c for impl in impls for c in impl.state_columns]
        combined = good_partial.select(*group, ROWS, *state_cols)
        kept = [p.partition for p in plans if not p.refill_all]
        if kept:
            old = self._read_state(spec, kept, schema)
            if old is not None:
                combined = old.where(~in_refill).select(*group, ROWS, *state_cols).unionByName(combined)
        extra = [e for impl in impls for e in impl.pre_merge_exprs(group)]
        if extra:
            combined = combined.selectExpr("*", *extra)
        merged = combined.groupBy(*group).agg(F.expr(f"sum({ROWS}) AS {ROWS}"),
                                              *[F.expr(e) for i in impls for e in i.merge()])
        return merged.where(F.col(ROWS) != 0)

    def state_query(self, spec: FlowSpec, partition: str) -> tuple[PartitionPlan, DataFrame]:
        """The plan and the (lazy) Spark query a run would execute now, for `explain`. Writes nothing."""
        _mark, inputs, plan = self._current(spec, partition)
        partial, impls, group, in_refill, bad, _rejects = self._flow_partial(spec, plan, inputs, {})
        return plan, self._flow_merge(spec, [plan], partial.where(~bad), impls, group, in_refill, inputs.input_schema)

    def _execute_flow(self, spec: FlowSpec, plan: PartitionPlan, inputs: _Inputs, run_id: str, seq: int,
                      metrics: dict, seconds: dict, quarantined: dict) -> None:
        t0 = time.perf_counter()
        part = plan.interval
        partial, impls, group, in_refill, bad, rejects = self._flow_partial(spec, plan, inputs, metrics)
        partial = partial.persist()
        metrics.update(_stats_metrics(partial.agg(*_partial_stats(bad)).first()))
        if metrics["rows_rejected"]:
            self._record_rejects(spec, rejects, plan.partition, run_id, quarantined)
        self.hook("after_read")
        seconds["read"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        merged = self._flow_merge(spec, [plan], partial.where(~bad), impls, group, in_refill, inputs.input_schema)
        seconds["state"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        rows = replace_range(
            self.spark, merged, table_uri=self.state_uri(spec, inputs.input_schema), column="window_start", rng=part,
            run_id=run_id, app_id=self.app_id(spec, plan.partition), txn_version=seq,
            metadata=self._commit_meta(plan, run_id),
        )
        metrics["state_rows"] = rows
        seconds["merge"] = time.perf_counter() - t2
        partial.unpersist()
        self.hook("after_state_commit")
        t3 = time.perf_counter()
        metrics["sink_rows"] = self._write_sink(spec, plan.partition, seq, run_id, inputs.input_schema)
        seconds["write"] = time.perf_counter() - t3
        self.hook("after_sink_commit")

    def _empty_source(self, spec, inputs: _Inputs) -> DataFrame:
        from .spark_io import spark_schema

        info = inputs.infos[spec.sources[0]]
        return (self.spark.createDataFrame([], spark_schema(info.schema)).withColumn(SIGN, F.lit(1))
                .withColumn(VERSION, F.lit(None).cast("long")))

    def _read_state(self, spec: FlowSpec, partitions: str | list[str], schema: dict[str, str]) -> DataFrame | None:
        uri = self.state_uri(spec, schema)
        if not DeltaTable.is_deltatable(uri):
            return None
        parts = [partition_interval(k, spec.granularity) for k in ([partitions] if isinstance(partitions, str)
                                                                   else partitions)]
        info = table_info(f"{spec.name} state", uri)
        files = snapshot_files(info, "window_start", parts)
        df = read_files(self.spark, files, info.schema, info.partition_columns)
        ws = F.col("window_start")
        inside = F.lit(False)
        for part in parts:
            inside = inside | ((ws >= F.lit(part.start)) & (ws < F.lit(part.end)))
        return df.where(inside)

    def _write_sink(self, spec: FlowSpec, partition: str | list[str], seq: int | list[int], run_id: str,
                    schema: dict[str, str]) -> int:
        """Finalize the committed state of the partition(s) into the sink (idempotent)."""
        keys = [partition] if isinstance(partition, str) else list(partition)
        seqs = [seq] if isinstance(seq, int) else list(seq)
        out = self.finalize(spec, self._read_state(spec, keys, schema))
        meta = {"laminar.run_id": run_id, "laminar.flow": spec.name, "laminar.partition": ",".join(keys)}
        return replace_range(
            self.spark, out, table_uri=self.sink_uri(spec), column="window_start",
            rng=[partition_interval(k, spec.granularity) for k in keys], run_id=run_id + "-sink",
            transactions=[(self.app_id(spec, k), n) for k, n in zip(keys, seqs)], metadata=meta,
            reset_on_schema_change=True,
        )

    # --- stages ----------------------------------------------------------
    def _execute_stage(self, spec: StageSpec, plan: PartitionPlan, mark, inputs: _Inputs, run_id: str, seq: int,
                       metrics: dict, seconds: dict, quarantined: dict) -> None:
        t0 = time.perf_counter()
        part = plan.interval
        refill = plan.mode is Mode.REFILL
        frames = (self._snapshot(spec, plan, inputs, [part], metrics) if refill
                  else self._changes(spec, plan, inputs, metrics))
        frames = frames or [(spec.sources[0], self._empty_source(spec, inputs))]
        ts = F.col(EVENT_TS)
        prepared = None
        by_source = []
        for src, frame in frames:
            df = self._prepare(spec, frame, src).withColumn("__src", F.lit(src))
            by_source.append(src)
            prepared = df if prepared is None else prepared.unionByName(df)
        prepared = prepared.where(qr.assigned(spec) & (ts >= F.lit(part.start)) & (ts < F.lit(part.end)))
        joined = prepared
        for join in spec.joins:
            dim_info = inputs.dims[join.table]
            dim = read_files(self.spark, snapshot_files(dim_info, None), dim_info.schema,
                             dim_info.partition_columns)
            dim = dim.select(*join.on, *join.columns).withColumn(f"__m_{join.table}", F.lit(True))
            joined = joined.join(dim, list(join.on), "left")
        unmatched = F.lit(None).cast("string")
        for join in reversed(spec.joins):
            if join.how == "inner":
                unmatched = F.when(F.col(f"__m_{join.table}").isNull(), F.lit(f"unmatched_{join.table}")).otherwise(unmatched)
        joined = joined.withColumn(RULE, F.coalesce(F.col(RULE), unmatched)).persist()
        rejected = F.col(RULE).isNotNull() & (F.col(SIGN) > 0)
        stats = joined.agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(F.when(rejected, 1).otherwise(0)).alias("rejected"),
        ).first()
        metrics.update(rows_read=int(stats["rows"] or 0), rows_rejected=int(stats["rejected"] or 0))
        if metrics["rows_rejected"]:
            rejects = [(src, joined.where(rejected & (F.col("__src") == src)).select(RULE, ROW, VERSION, EVENT_TS))
                       for src in dict.fromkeys(by_source)]
            self._record_rejects(spec, rejects, plan.partition, run_id, quarantined)
        good = joined.where(F.col(RULE).isNull())
        cols = list(spec.columns) or [c for c in prepared.columns if not c.startswith("__")] + \
            [c for j in spec.joins for c in j.columns if c not in prepared.columns]
        out = good.select(*cols, EVENT_TS)
        if spec.dedup_key:
            order = [EVENT_TS] + [c for c in cols if c not in spec.dedup_key]
            w = Window.partitionBy(*spec.dedup_key).orderBy(*order)
            out = out.withColumn("__rk", F.row_number().over(w)).where(F.col("__rk") == 1).drop("__rk")
            if not refill and mark is not None:
                out = self._dedup_against_sink(spec, part, out, cols, order)
        out = out.drop(EVENT_TS)
        self.hook("after_read")
        seconds["read"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        common = dict(table_uri=self.sink_uri(spec), column=spec.event_time, rng=part, run_id=run_id,
                      app_id=self.app_id(spec, plan.partition), txn_version=seq,
                      metadata=self._commit_meta(plan, run_id))
        if not refill:
            metrics["sink_rows"] = metrics["rows_inserted"] = replace_range(self.spark, out, append_only=True, **common)
            metrics["rows_deleted"] = 0
        elif plan.reason is Reason.SPEC_CHANGED or not self._sink_schema_matches(spec, out):
            # A new output shape: downstream flows refill anyway, so a plain rewrite is enough.
            metrics["sink_rows"] = replace_range(self.spark, out, reset_on_schema_change=True, **common)
        else:
            written, inserted, deleted = replace_range_with_change_data(self.spark, out, **common)
            metrics.update(sink_rows=written, rows_inserted=inserted, rows_deleted=deleted)
        joined.unpersist()
        seconds["write"] = time.perf_counter() - t1
        self.hook("after_state_commit")
        self.hook("after_sink_commit")

    def _sink_schema_matches(self, spec, out: DataFrame) -> bool:
        uri = self.sink_uri(spec)
        if not DeltaTable.is_deltatable(uri):
            return True
        current = nullable(pa.schema(DeltaTable(uri).schema().to_arrow()))
        wanted = nullable(_arrow_schema_of(out))
        return [(f.name, str(f.type)) for f in current] == [(f.name, str(f.type)) for f in wanted]

    def _dedup_against_sink(self, spec: StageSpec, part: Interval, new: DataFrame, cols, order) -> DataFrame:
        uri = self.sink_uri(spec)
        if not DeltaTable.is_deltatable(uri):
            return new
        info = table_info(spec.sink, uri)
        files = snapshot_files(info, spec.event_time, [part])
        if not files:
            return new
        existing = read_files(self.spark, files, info.schema, info.partition_columns)
        existing = self._prepare_existing(spec, existing, part)
        key = list(spec.dedup_key)
        rank_new = F.struct(*[F.col(c) for c in order])
        e = existing.select(*key, F.struct(*[F.col(c) for c in order]).alias("__old"))
        joined = new.withColumn("__new", rank_new).join(e, key, "left")
        lost = joined.where(F.col("__old").isNotNull() & (F.col("__new") < F.col("__old"))).limit(1).count()
        if lost:
            raise _Escalate(Reason.DEDUP_REPLACED_ROW)
        return joined.where(F.col("__old").isNull()).drop("__new", "__old")

    def _prepare_existing(self, spec: StageSpec, df: DataFrame, part: Interval) -> DataFrame:
        df = df.withColumn(EVENT_TS, event_time_column(df, spec.event_time))
        ts = F.col(EVENT_TS)
        return df.where((ts >= F.lit(part.start)) & (ts < F.lit(part.end)))


def _partial_stats(bad) -> list:
    """Run metrics over partial states (rows read, rejected, retracted; windows and groups kept)."""
    ws = F.col("window_start")
    return [
        F.sum("__in_rows").alias("rows"),
        F.sum("__rejected").alias("rejected"),
        F.sum(F.when(F.col(SIGN) < 0, F.col("__in_rows")).otherwise(0)).alias("retracted"),
        F.countDistinct(F.when(~bad, ws)).alias("windows"),
        F.count(F.when(~bad, F.lit(1))).alias("groups"),
    ]


def _stats_metrics(row) -> dict[str, int]:
    return {"rows_read": int(row["rows"] or 0), "rows_rejected": int(row["rejected"] or 0),
            "rows_retracted": int(row["retracted"] or 0), "windows_touched": int(row["windows"] or 0),
            "partial_groups": int(row["groups"] or 0)}


def _basename(f: DataFile) -> str:
    import os

    return os.path.basename(f.uri)


def _short(exc: BaseException) -> str:
    if isinstance(exc, LaminarError):
        return exc.message
    text = str(exc).strip()
    if isinstance(exc, (PySparkException, Py4JError)):
        text = text.split("\n")[0]
    return text[:400] or type(exc).__name__
