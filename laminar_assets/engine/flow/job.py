"""One Spark pass over every partition a flow run touches: partial states, merge, state and sink.

    query     one SQL statement (query.py): every needed file read once, rows tagged with their
              role, signed partial states per (partition, window, keys), merged with the old state of
              the touched partitions only, minus refilled windows
    state     one Spark job writes the merged state, one file per partition (a small pass: one file
              per run of adjacent partitions); one Delta commit
    sink      a small pass: finalized beside the state in the same job (both written by the driver,
              which sums the run metrics from the same rows);
              otherwise one Spark job finalizes the state files just written (a scan, no shuffle);
              one Delta commit

Run metrics come from the same jobs (metrics.py: observed, or summed from collected rows),
not from extra ones. The
state is re-read only when a crashed run is recovered (`flow_state.rederive_sinks`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from ..aggregates.base import EVENT_TS, SIGN, q
from ..output.commit import replace_ranges
from ..output.uncommitted import collect_rows, read_uncommitted, write_uncommitted, write_uncommitted_rows
from ..quarantine import records as qr
from ..quarantine.records import PARTITION_KEY, ROW, RULE, VERSION
from ..run.context import RunContext
from ..run.inputs import RunInputs
from ..run.metrics import RunMetrics
from ..run.plan import ChangedGroups, PartitionPlan, Reason
from ..run.reading import PART, ReadSet, change_markers, read_set, with_partition
from ..run.row_prep import key_values
from ..spark.frames import interpreted, observe
from ..spec.specs import FlowSpec
from ..windows import Interval, from_micros, partition_key, partition_key_column
from .metrics import (
    GONE,
    GOOD,
    GROUP,
    LOST,
    collected_metrics,
    flagged_groups,
    flagged_window_starts,
    good_mask,
    observed_metrics,
)
from .query import PassQuery, copies_query, group_hash_sql, old_state, pass_query
from .state import WS, finalize


class WindowsToRecompute(Exception):
    """Windows a retraction left the state unable to answer exactly, {partition: windows}, and why
    per partition: float state that lost precision (PRECISION_LOSS: those windows are recomputed)
    or groups whose every row holding an extreme was removed (EXTREME_RETRACTED: those groups are
    recomputed alone, `groups`). A partition with both gets PRECISION_LOSS."""

    def __init__(self, spec: FlowSpec, lost: list, gone: list[tuple]) -> None:
        self.windows = _windows(spec, [*lost, *(ws for ws, _ in gone)])
        lost_parts = set(_windows(spec, lost))
        self.reasons = {k: Reason.PRECISION_LOSS if k in lost_parts else Reason.EXTREME_RETRACTED for k in self.windows}
        self.groups: dict[str, tuple[int, ...]] = {}
        for ws, group in gone:
            k = partition_key(ws, spec.granularity)
            if k not in lost_parts:
                self.groups[k] = (*self.groups.get(k, ()), group)
        super().__init__(f"{len(set(lost))} window(s) lost precision, {len(gone)} group(s) lost an extreme")


@dataclass
class PassResult:
    """What one pass measured, per partition; `state_rows`/`sink_rows` are the pass's totals."""

    metrics: dict[str, RunMetrics] = field(default_factory=dict)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    state_rows: int = 0
    sink_rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # read (the first Spark job), state, write


def state_query(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], inputs: RunInputs) -> DataFrame:
    """The merged state the plans produce, lazily (what a run writes; what `explain` prints)."""
    built, _, _ = _build(ctx, spec, plans, inputs, slots=False, sink=False)
    return built.merged.where(GOOD).select([q(c) for c in built.state]).run(ctx.spark)


def recompute(ctx: RunContext, spec: FlowSpec, plan: PartitionPlan, inputs: RunInputs) -> DataFrame:
    """Sink rows of a refill plan's windows, from the snapshot alone (the equivalence check)."""
    return finalize(spec, state_query(ctx, spec, [plan], inputs)).drop(PART)


def _build(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], inputs: RunInputs, *, slots: bool,
           sink: bool) -> tuple[PassQuery, ReadSet, bool]:
    reads = read_set(spec, plans, inputs)
    old = old_state(ctx, spec, plans, inputs)
    read_bytes = reads.total_bytes * spec.shape.copies + old[1]
    # small inputs: one task, no shuffle; a small state comes through the driver, its sink beside it
    # (the sink's columns in the same statement, unless a key or post column could clash with ours)
    single = _bounded(spec, read_bytes, ctx.options.single_task_below_bytes)
    small = _bounded(spec, read_bytes, ctx.options.driver_write_below_bytes)
    sink = sink and small and not any(c.startswith("__") for c in [*spec.keys, *dict(spec.post)])
    # per-partition metrics of a pass written with its sink are summed from its rows: no slot column
    return pass_query(ctx, spec, plans, reads, inputs, single=single, old=old, slots=slots and not sink,
                      sink=sink), reads, small


def changed_groups(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan],
                   inputs: RunInputs) -> dict[str, ChangedGroups]:
    """The groups (hashes of window start and keys, and the keys' values) the deletes and updates each
    plan takes touch, per partition: one Spark job over their change rows only (rows whose group is
    new count too). Both sides of an update count, so a row moved across windows or keys marks both."""
    markers = change_markers(spec, plans, inputs)
    copies = copies_query(ctx.spark, spec, markers, read_set(spec, markers, inputs), inputs)
    keys = [q(c) for c in spec.keys]
    found = copies.select([f"unix_micros({WS}) AS {_WS_US}", f"{group_hash_sql(spec)} AS {GROUP}", *keys],
                          group=[WS, group_hash_sql(spec), *keys]).run(ctx.spark).collect()
    hashes: dict[str, list] = {p.partition: [] for p in plans}
    values: dict[str, list] = {p.partition: [] for p in plans}
    for row in found:
        k = partition_key(from_micros(row[_WS_US]), spec.granularity)
        if k in hashes:
            hashes[k].append(row[GROUP])
            values[k].append(tuple(row)[2:])
    return {k: ChangedGroups(len(v), tuple(v), key_values(values[k]) if spec.keys else ()) for k, v in hashes.items()}


# Window starts come to the driver as UTC microseconds: a collected TIMESTAMP is a naive datetime in
# the driver's local time zone, which the engine's window math would read as UTC.
_WS_US = "__ws_us"


def run_pass(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], seqs: dict[str, int],
             inputs: RunInputs, run_id: str) -> PassResult:
    """Carry out `plans` (sharing target versions and input schema) in one pass; raises
    `WindowsToRecompute` before committing anything when a window must be recomputed instead."""
    out = PassResult()
    keys = [p.partition for p in plans]
    per_part = len(plans) <= ctx.options.metrics_partitions
    built, reads, small = _build(ctx, spec, plans, inputs, slots=per_part, sink=True)
    # small inputs: interpreted expressions (compiling each query's new code costs more than it saves)
    with interpreted(ctx.spark, reads.total_bytes < ctx.options.interpreted_below_bytes):
        t0 = time.perf_counter()
        state_uri = ctx.layout.state_uri(spec, inputs.input_schema)
        state_files, sink, row = _write_outputs(ctx, spec, plans, built, state_uri, run_id, small,
                                                plans if per_part else [])
        per_part = per_part or sink is not None  # collected metrics: every partition's
        _collect_metrics(out, row, plans, per_part)
        for k in keys:
            out.metrics[k].update(files_read=reads.files.get(k, 0), bytes_read=reads.bytes.get(k, 0))
        if any(m.get("rows_rejected") for m in out.metrics.values()):
            # a reject's event time lies in its copy's window: at most a window's size past its partition
            within = [Interval(p.interval.start, p.interval.end + spec.shape.size) for p in plans]
            counts = _quarantine(ctx, spec, built.copies.run(ctx.spark), run_id, small=small, within=within)
            for k in keys:
                out.quarantined[k] = counts.get(k, {})
        ctx.hook("after_read")
        t1 = time.perf_counter()
        txns = [(ctx.layout.app_id(spec, k), seqs[k]) for k in keys]
        meta = {"laminar.run_id": run_id, "laminar.flow": spec.name, "laminar.partition": ",".join(keys),
                "laminar.mode": ",".join(sorted({p.mode.value for p in plans})),
                "laminar.reason": ",".join(sorted({p.reason.value for p in plans}))}
        read = {m: sum(out.metrics[k].get(m, 0) for k in keys) for m in ("rows_read", "rows_rejected")}
        ranges = [p.interval for p in plans]
        out.state_rows = replace_ranges(ctx.spark, state_files, table_uri=state_uri, column=WS, ranges=ranges,
                                        transactions=txns, metadata=meta, run_id=run_id, owner=spec.name,
                                        opened=inputs.opened.pop(state_uri, None),
                                        driver_write_below_bytes=ctx.options.driver_write_below_bytes)
        ctx.hook("after_state_commit")
        t2 = time.perf_counter()
        if sink is None:
            # Finalized from the state files just written (one scan of the touched partitions' state, no
            # shuffle): cheaper than caching the merge, whose plan Spark must build twice.
            state = with_partition(read_uncommitted(ctx.spark, state_files, state_uri), spec, WS)
            small = sum(a.size for a in state_files.adds) < ctx.options.driver_write_below_bytes
            sink = write_uncommitted(finalize(spec, state, partitioned=True), ctx.layout.sink_uri(spec), run_id + "-sink",
                                     by=PART, through_driver=small,
                                     partitions_per_file=ctx.options.partitions_per_file)  # Spark job
        metrics = {**read, "state_rows": out.state_rows, "sink_rows": sink.rows}  # what `laminar_system.runs` shows
        out.sink_rows = replace_ranges(ctx.spark, sink, table_uri=ctx.layout.sink_uri(spec), column=WS, ranges=ranges,
                                       transactions=txns, metadata={**meta, "laminar.metrics": json.dumps(metrics)},
                                       run_id=run_id + "-sink", reset_on_schema_change=True, owner=spec.name,
                                       opened=inputs.own_table(ctx.layout.sink_uri(spec)),
                                       driver_write_below_bytes=ctx.options.driver_write_below_bytes)
        out.seconds = {"read": t1 - t0, "state": t2 - t1, "write": time.perf_counter() - t2}
        ctx.hook("after_sink_commit")
    return out


def _write_outputs(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], built: PassQuery, state_uri: str,
                   run_id: str, small: bool, slotted: list[PartitionPlan]) -> tuple:
    """Write the merged state in one Spark job; returns (state files, sink files or None, metrics), not
    committed yet. A small pass collects every merged row, writes state and sink from them and sums its
    metrics in Arrow; otherwise Spark writes the state, the metrics are observed in that job and the sink
    (None) is still to be written from the state files. Raises `WindowsToRecompute` before anything is
    written (collected) or after discarding the state files (observed)."""
    merged = built.merged.run(ctx.spark)
    if built.sink is not None:
        rows = collect_rows(merged)
        metrics = collected_metrics(rows, plans, spec.granularity)
        if metrics["lost"] or metrics["gone"]:
            raise WindowsToRecompute(spec, flagged_window_starts(rows, LOST),
                                     flagged_groups(rows) if metrics["gone"] else [])
        state_files, sink = write_uncommitted_rows(rows.filter(good_mask(rows)), [
            (state_uri, run_id, list(built.state)), (ctx.layout.sink_uri(spec), run_id + "-sink", list(built.sink))],
            by=PART, partitions_per_file=ctx.options.partitions_per_file)
        return state_files, sink, metrics
    obs = Observation()
    merged = observe(merged, obs, *[F.expr(m) for m in observed_metrics(slotted)])
    state_files = write_uncommitted(merged.where(GOOD).selectExpr(*[q(c) for c in built.state]), state_uri, run_id,
                                    by=PART, through_driver=small, partitions_per_file=ctx.options.partitions_per_file)
    if obs.get.get("lost") or obs.get.get("gone"):
        state_files.discard()
        group = [GROUP] if GROUP in built.merged.columns else []
        flagged = merged.where(f"({LOST} OR {GONE}) AND {GOOD}").selectExpr(
            f"unix_micros({WS}) AS {_WS_US}", LOST, GONE, *group).distinct().collect()
        raise WindowsToRecompute(spec, [from_micros(r[_WS_US]) for r in flagged if r[LOST]],
                                 [(from_micros(r[_WS_US]), r[GROUP]) for r in flagged if r[GONE]])
    return state_files, None, obs.get


def _bounded(spec: FlowSpec, size: int, limit: int) -> bool:
    """Whether a pass reading `size` bytes (each row's window copies counted, plus the old state it
    merges) is under `limit`: the one-task (`EngineOptions.single_task_below_bytes`) and driver-write
    (`driver_write_below_bytes`) bounds. A fact join reads its joined table whole and can multiply
    rows beyond any such bound: never."""
    return not spec.joins and size < limit


def _collect_metrics(out: PassResult, row: dict, plans: list[PartitionPlan], per_part: bool) -> None:
    names = {"rows": "rows_read", "rejected": "rows_rejected", "retracted": "rows_retracted",
             "groups": "partial_groups", "windows": "windows_touched"}
    for i, p in enumerate(plans):
        # element 0: the pass's total; element i + 1: partition i's slot. Without a breakdown (too
        # many partitions) the pass's totals go on the first partition.
        at = i + 1 if per_part else (0 if i == 0 else None)
        out.metrics[p.partition] = RunMetrics.of({v: _element(row.get(k), at) for k, v in names.items()})


def _element(values: list | None, at: int | None) -> int:
    return int(values[at] or 0) if values is not None and at is not None and at < len(values) else 0


def _windows(spec: FlowSpec, starts: list) -> dict[str, tuple[Interval, ...]]:
    out: dict[str, list[Interval]] = {}
    for start in sorted(set(starts)):
        iv = Interval(start, start + spec.shape.slide)
        out.setdefault(partition_key(iv.start, spec.granularity), []).append(iv)
    return {k: tuple(v) for k, v in out.items()}


def _quarantine(ctx: RunContext, spec: FlowSpec, copies: DataFrame, run_id: str, *,
                small: bool, within: list[Interval]) -> dict[str | None, dict[str, int]]:
    """Append the rows that broke a rule (each in its own partition's copy) to their sources'
    quarantine tables; returns the new rows by partition and rule (None: rows without a partition, as
    `records.record` counts them)."""
    rejected = copies.where(F.col("__primary") & F.col(RULE).isNotNull() & (F.col(SIGN) > 0))
    rejected = rejected.withColumn(PARTITION_KEY, partition_key_column(EVENT_TS, spec.granularity))
    counts: dict[str | None, dict[str, int]] = {}
    for src in spec.sources:
        mine = rejected.where(F.col("__src") == F.lit(src)).select(PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS)
        for part, by_rule in qr.record(ctx.spark, mine, uri=ctx.layout.quarantine_uri(src), flow=spec.name,
                                       run_id=run_id, through_driver=small, within=within,
                                       driver_below_bytes=ctx.options.driver_write_below_bytes).items():
            for rule, n in by_rule.items():
                counts.setdefault(part, {})[rule] = counts.setdefault(part, {}).get(rule, 0) + n
    return counts
