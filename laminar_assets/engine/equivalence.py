"""The equivalence check: recompute a sample of a partition's windows from the source snapshot at
the watermark version and compare them with the sink (exact for integers, 1e-9 relative for floats,
identical for sketch estimates)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pyspark.sql import functions as F
from pyspark.sql.types import FloatType, DoubleType

from .flow_job import recompute
from .plan import Mode, PartitionPlan, Reason
from .spec import FlowSpec
from .windows import Interval, partition_interval


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
    mark = engine.store.load(spec.name, partition)
    if mark is None or not mark.committed:
        return None
    part = partition_interval(partition, spec.granularity)
    sink = engine.sink_frame(spec, partition)
    # Half the sample from windows the sink has (wrong values), half from every possible window start
    # of the partition (rows missing from, or extra in, the sink); everything when the sample covers it.
    def ranked(values):
        return sorted(values, key=lambda ws: hashlib.sha256(f"{partition}{ws}".encode()).hexdigest())

    every = [part.start + i * spec.shape.slide for i in range(int((part.end - part.start) / spec.shape.slide))]
    if sample >= len(every):
        chosen = every
    else:
        present = [r["window_start"] for r in sink.select("window_start").distinct().collect()]
        present = [p.replace(tzinfo=part.start.tzinfo) if p.tzinfo is None else p for p in present]
        chosen = sorted(set(ranked(present)[: (sample + 1) // 2]) | set(ranked(every)[: sample // 2]))
    refill = tuple(Interval(ws, ws + spec.shape.slide) for ws in sorted(chosen))
    plan = PartitionPlan(flow=spec.name, partition=partition, interval=part, needed=spec.shape.events_of_starts(part),
                         mode=Mode.REFILL, reason=Reason.FORCED_BY_USER, detail="equivalence check",
                         spec_hash=spec.spec_hash, to_versions=dict(mark.source_versions), refill=refill,
                         refill_all=True)
    inputs = engine.gather(spec, [mark])
    recomputed = recompute(engine.ctx, spec, plan, inputs)
    ws = F.col("window_start")
    picked = F.lit(False)
    for r in refill:
        picked = picked | ((ws >= F.lit(r.start)) & (ws < F.lit(r.end)))
    actual = sink.where(picked)
    keys = ["window_start", "window_end", *spec.keys]
    values = [c for c in recomputed.columns if c not in keys]
    joined = actual.alias("s").join(recomputed.alias("r"), keys, "full_outer").select(
        *keys, *[F.col(f"s.{c}").alias(f"s__{c}") for c in values], *[F.col(f"r.{c}").alias(f"r__{c}") for c in values],
    )
    floats = {f.name for f in recomputed.schema.fields if isinstance(f.dataType, (FloatType, DoubleType))}
    conds = []
    for c in values:
        s, r = F.col(f"s__{c}"), F.col(f"r__{c}")
        if c in floats:
            diff = ~(s.isNull() & r.isNull()) & (s.isNull() | r.isNull() |
                                                 (F.abs(s - r) > F.greatest(F.abs(r) * F.lit(rel), F.lit(1e-12))))
        else:
            diff = ~s.eqNullSafe(r)
        conds.append(F.when(diff, F.lit(c)))
    mismatched = joined.withColumn("__cols", F.array_compact(F.array(*conds))).where(F.size("__cols") > 0)
    rows = mismatched.limit(20).collect()
    out = []
    for row in rows:
        d = row.asDict()
        out.append({"window_start": str(d["window_start"]), "window_end": str(d["window_end"]),
                    "keys": {k: d[k] for k in spec.keys}, "columns": d["__cols"],
                    "sink": {c: d[f"s__{c}"] for c in d["__cols"]},
                    "recomputed": {c: d[f"r__{c}"] for c in d["__cols"]}})
    return EquivalenceResult(partition, dict(mark.source_versions), len(chosen), tuple(out))
