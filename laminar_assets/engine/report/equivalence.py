"""The equivalence check: recompute a sample of a partition's windows from the source snapshot at
the watermark version and compare them with the sink (exact for integers, 1e-9 relative for floats,
identical for HLL distinct counts).

A KLL quantile depends on the order its sketch saw the values once a window holds more than k of
them, so a merged sketch and a recomputed one may answer with neighbouring values. The sink's
quantile passes when its rank in the recomputed sketch is within twice KLL's rank error of the
quantile asked for (each sketch is within the error once): for k = 200, ±3.3%.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, FloatType

from ..aggregates.algebra import implementation
from ..delta.arrow_reads import read_arrow
from ..delta.tables import read_in_driver, snapshot_files, table_info
from ..flow.job import state_query
from ..flow.state import finalize
from ..run.plan import Mode, PartitionPlan, Reason
from ..run.reading import PART, read_set
from ..spark.frames import interpreted, to_arrow
from ..spec.specs import FlowSpec
from ..windows import Interval, in_ranges, partition_interval, partition_key, partition_key_column, to_utc


@dataclass(frozen=True)
class EquivalenceResult:
    partition: str
    versions: dict
    windows_checked: int
    mismatches: tuple[dict, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return not self.mismatches


def check_equivalence(engine, spec: FlowSpec, partition: str, *, sample: int = 8, rel: float = 1e-9) -> EquivalenceResult | None:
    """None when the partition has no committed watermark (nothing to compare yet)."""
    return check_equivalence_many(engine, spec, [partition], sample=sample, rel=rel)[partition]


def check_equivalence_many(engine, spec: FlowSpec, partitions: list[str], *, sample: int = 8,
                           rel: float = 1e-9) -> dict[str, EquivalenceResult | None]:
    """Check several partitions in one recompute and one comparison per set of watermark versions
    (a range run commits all its partitions at the same versions, so usually one of each)."""
    marks = {p: engine.store.load(spec.name, p) for p in partitions}
    out: dict[str, EquivalenceResult | None] = {p: None for p, m in marks.items() if m is None or not m.committed}
    groups: dict[tuple, list[str]] = {}
    for p, mark in marks.items():
        if p not in out:
            groups.setdefault(tuple(sorted(mark.source_versions.items())), []).append(p)
    for keys in groups.values():
        out.update(_check_group(engine, spec, keys, [marks[k] for k in keys], sample, rel))
    return {p: out[p] for p in partitions}


def kll_rank_error(k: int) -> float:
    """KLL's normalized rank error for sketch size k (DataSketches' two-sided bound, 99% confidence)."""
    return 2.446 / k ** 0.9433


def _quantile_differs(s, r, sketch, agg):
    """The sink's quantile `s` is wrong when the recomputed sketch ranks it further than twice the rank
    error from the quantile q asked for, i.e. outside [quantile(q - tol), quantile(q + tol)] of that
    sketch (Spark takes only constant ranks, so the range is asked for instead of the value's rank)."""
    lo, hi = _quantile_bounds(sketch, agg)
    within = (s >= lo) & (s <= hi)
    return ~(s.isNull() & r.isNull()) & (s.isNull() | r.isNull() | (~s.eqNullSafe(r) & ~within))


def _chosen_windows(engine, spec: FlowSpec, partitions: list[str], sample: int) -> dict[str, list]:
    """Half the sample from windows the sink has (wrong values), half from every possible window start
    of the partition (rows missing from, or extra in, the sink); everything when the sample covers it."""
    def ranked(partition, values):
        return sorted(values, key=lambda ws: hashlib.sha256(f"{partition}{ws}".encode()).hexdigest())

    parts = {p: partition_interval(p, spec.granularity) for p in partitions}
    every = {p: [i.start + n * spec.shape.slide for n in range(int((i.end - i.start) / spec.shape.slide))]
             for p, i in parts.items()}
    sampled = [p for p in partitions if sample < len(every[p])]
    present: dict[str, list] = {p: [] for p in sampled}
    for ws in _sink_window_starts(engine, spec, [parts[p] for p in sampled]) if sampled else ():
        for p in sampled:
            if parts[p].start <= ws < parts[p].end:
                present[p].append(ws)
                break
    return {p: every[p] if p not in present else
            sorted(set(ranked(p, present[p])[: (sample + 1) // 2]) | set(ranked(p, every[p])[: sample // 2]))
            for p in partitions}


def _sink_window_starts(engine, spec: FlowSpec, ranges: list[Interval]) -> set[datetime]:
    """The window starts the sink holds within `ranges` (UTC). Read with deltalake's dataset from the files
    the Delta log's statistics leave (one small column of an aggregated table): no Spark job."""
    info = table_info(cast(str, spec.sink), engine.ctx.layout.sink_uri(spec))  # set by Spec.__post_init__
    files = snapshot_files(info, "window_start", ranges)
    if not files:
        return set()
    column = pc.field("window_start")
    within = None
    for r in ranges:
        one = (column >= pa.scalar(r.start, pa.timestamp("us", "UTC"))) & \
              (column < pa.scalar(r.end, pa.timestamp("us", "UTC")))
        within = one if within is None else within | one
    # small files whole, by the driver (one GET each in a bucket); else the column alone through deltalake
    rows = read_in_driver(info, files, max_bytes=engine.ctx.options.driver_read_below_bytes)
    starts = (rows.select(["window_start"]).filter(within) if rows is not None
              else read_arrow(info.uri, info.delta(), columns=["window_start"], filter=within))
    return {to_utc(ws) for ws in pc.unique(starts.column("window_start")).to_pylist()}


def _check_group(engine, spec: FlowSpec, partitions: list[str], marks, sample: int, rel: float) -> dict:
    chosen = _chosen_windows(engine, spec, partitions, sample)
    plans: list[PartitionPlan] = []
    picked_ranges: list[Interval] = []
    for p, mark in zip(partitions, marks):
        part = partition_interval(p, spec.granularity)
        refill = tuple(Interval(ws, ws + spec.shape.slide) for ws in sorted(chosen[p]))
        picked_ranges.extend(refill)
        plans.append(PartitionPlan(flow=spec.name, partition=p, interval=part,
                                   needed=spec.shape.events_of_starts(part), mode=Mode.REFILL,
                                   reason=Reason.FORCED_BY_USER, detail="equivalence check",
                                   spec_hash=spec.spec_hash, to_versions=dict(mark.source_versions),
                                   refill=refill, refill_all=True))
    # the sources' snapshots from the process's pool (as the run's: the run just gave them back, so the check
    # lists each log once instead of opening it), given back when the comparison is done
    inputs = engine.gather(spec, list(marks), pooled=True)
    try:
        quantiles = {a.output: a for a in spec.aggregates if a.kind == "approx_percentile" and a.name not in spec.hidden}
        sketches = {name: implementation(a).state_columns[0] for name, a in quantiles.items()}
        recomputed = finalize(spec, state_query(engine.ctx, spec, plans, inputs), keep=tuple(sketches.values())).drop(PART)
        keys = ["window_start", "window_end", *spec.keys]
        values = [c for c in recomputed.columns if c not in keys and c not in sketches.values()]
        floats = {f.name for f in recomputed.schema.fields if isinstance(f.dataType, (FloatType, DoubleType))}
        small = read_set(spec, plans, inputs).total_bytes < engine.ctx.options.interpreted_below_bytes
        sink = engine.sink_tables(spec, partitions)
        with interpreted(engine.spark, small):  # one job
            if sink is not None:  # the sink's rows are read by the driver: Spark only recomputes
                recomputed_rows = to_arrow(recomputed.select(*keys, *values, *[
                    b.alias(f"{n}__{c}") for c in sketches for b, n in zip(_quantile_bounds(
                        F.col(sketches[c]), quantiles[c]), ("lo", "hi"))]))
                rows = _compare_in_driver(pa.concat_tables(list(sink.values())), recomputed_rows, picked_ranges,
                                          keys, values, floats, set(quantiles), rel)
            else:
                rows = _compare_in_spark(engine, spec, partitions, recomputed, picked_ranges, keys, values, floats,
                                         quantiles, sketches, rel)
    finally:
        inputs.release()
    found: dict[str, list[dict]] = {p: [] for p in partitions}
    for d in rows:
        p = partition_key(d["window_start"], spec.granularity)
        if len(found[p]) < 20:
            found[p].append({"window_start": str(_naive(d["window_start"])), "window_end": str(_naive(d["window_end"])),
                             "keys": {k: d[k] for k in spec.keys}, "columns": d["__cols"],
                             "sink": {c: d[f"s__{c}"] for c in d["__cols"]},
                             "recomputed": {c: d[f"r__{c}"] for c in d["__cols"]}})
    return {p: EquivalenceResult(p, dict(m.source_versions), len(chosen[p]), tuple(found[p]))
            for p, m in zip(partitions, marks)}


def _naive(ts: datetime) -> datetime:
    """UTC without a zone: how Spark's collect() gives timestamps (the session's zone is UTC)."""
    return to_utc(ts).replace(tzinfo=None) if ts.tzinfo is not None else ts


def _quantile_bounds(sketch, agg):
    """The values at ranks q - tol and q + tol of the recomputed sketch: a sink quantile between them
    is within twice KLL's rank error of the one asked for (see `_quantile_differs`)."""
    tol = 2 * kll_rank_error(agg.precision or 200)
    q = float(agg.quantile)
    return (F.call_function("kll_sketch_get_quantile_double", sketch, F.lit(max(q - tol, 0.0))),
            F.call_function("kll_sketch_get_quantile_double", sketch, F.lit(min(q + tol, 1.0))))


def _compare_in_driver(sink: pa.Table, recomputed: pa.Table, ranges: list[Interval], keys: list[str],
                       values: list[str], floats: set[str], quantiles: set[str], rel: float) -> list[dict]:
    """The rows of a full outer join of the sink's rows in `ranges` with the recomputed ones on `keys`
    where a value differs, as `_compare_in_spark` returns them. A key holding a null joins nothing
    (as in SQL). Floats: equal within `rel` (both NaN: equal; one NaN: different; an infinity equals
    only the same infinity)."""
    starts = [ws for ws in sink.column("window_start").to_pylist()]
    wanted = [any(r.start <= to_utc(ws) < r.end for r in ranges) if ws is not None else False for ws in starts]
    sink = sink.filter(pa.array(wanted, pa.bool_())).select(keys + values)

    def by_key(table: pa.Table, side: str) -> dict:
        out: dict = {}
        for n, row in enumerate(table.to_pylist()):
            key = tuple(row[k] for k in keys)
            out.setdefault(key if None not in key else (f"__null_{side}__", n), []).append(row)
        return out

    s_rows, r_rows = by_key(sink, "s"), by_key(recomputed, "r")
    found = []
    for key in dict.fromkeys([*s_rows, *r_rows]):
        for s in s_rows.get(key, [None]):
            for r in r_rows.get(key, [None]):
                cols = [c for c in values if _differs(None if s is None else s[c], None if r is None else r[c],
                                                      c in floats, r if c in quantiles else None, c, rel)]
                if cols:
                    either = s if s is not None else r
                    found.append({**{k: either[k] for k in keys}, "__cols": cols,
                                  **{f"s__{c}": None if s is None else s[c] for c in values},
                                  **{f"r__{c}": None if r is None else r[c] for c in values}})
    return found


def _differs(s, r, is_float: bool, recomputed_row: dict | None, column: str, rel: float) -> bool:
    if s is None or r is None:
        return (s is None) != (r is None)
    if recomputed_row is not None:  # a KLL quantile: within the recomputed sketch's rank-error band
        lo, hi = recomputed_row[f"lo__{column}"], recomputed_row[f"hi__{column}"]
        return not (s == r or (lo is not None and hi is not None and lo <= s <= hi))
    if is_float:
        if math.isnan(s) or math.isnan(r):
            return math.isnan(s) != math.isnan(r)
        if math.isinf(s) or math.isinf(r):  # a relative tolerance of an infinity would accept anything
            return s != r
        return abs(s - r) > max(abs(r) * rel, 1e-12)
    return s != r


def _compare_in_spark(engine, spec: FlowSpec, partitions: list[str], recomputed, ranges: list[Interval],
                      keys: list[str], values: list[str], floats: set[str], quantiles: dict, sketches: dict,
                      rel: float) -> list[dict]:
    """`_compare_in_driver` as one Spark job, for sinks the driver does not read itself."""
    actual = engine.sink_frames(spec, partitions).where(in_ranges("window_start", ranges))
    joined = actual.alias("s").join(recomputed.alias("r"), keys, "full_outer").select(
        *keys, *[F.col(f"s.{c}").alias(f"s__{c}") for c in values], *[F.col(f"r.{c}").alias(f"r__{c}") for c in values],
        *[F.col(f"r.{sk}").alias(f"k__{c}") for c, sk in sketches.items()],
    )
    conds = []
    for c in values:
        s, r = F.col(f"s__{c}"), F.col(f"r__{c}")
        if c in quantiles:
            diff = _quantile_differs(s, r, F.col(f"k__{c}"), quantiles[c])
        elif c in floats:
            both_nan = F.isnan(s) & F.isnan(r)
            infinite = (F.abs(s) == F.lit(float("inf"))) | (F.abs(r) == F.lit(float("inf")))
            off = F.when(infinite, s != r).otherwise(F.abs(s - r) > F.greatest(F.abs(r) * F.lit(rel), F.lit(1e-12)))
            diff = ~(s.isNull() & r.isNull()) & ~both_nan & (s.isNull() | r.isNull() | (F.isnan(s) != F.isnan(r)) | off)
        else:
            diff = ~s.eqNullSafe(r)
        conds.append(F.when(diff, F.lit(c)))
    mismatched = joined.withColumn("__cols", F.array_compact(F.array(*conds))).where(F.size("__cols") > 0)
    # at most 20 per partition: one partition's many mismatches must not crowd out another's
    rank = F.row_number().over(Window.partitionBy(partition_key_column("window_start", spec.granularity))
                               .orderBy("window_start", *spec.keys))
    return [row.asDict() for row in mismatched.withColumn("__n", rank).where(F.col("__n") <= 20).collect()]
