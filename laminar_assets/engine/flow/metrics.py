"""A flow pass's run metrics, from the job that computes its merged rows.

Every merged row carries what its partials read (`__in_rows`, `__rejected`, `__retracted`,
`__groups`), whether a retraction left its float state untrustworthy (`__lost`) and whether it
removed every row holding an extreme (`__gone`). The metrics
are aggregates over those rows, computed one of two ways, both in the job that writes the output:

    observed    a large pass, written by Spark: `observed_metrics` are `DataFrame.observe`
                aggregates, per partition through the `__slot` column (up to
                `EngineOptions.metrics_partitions` partitions)
    collected   a small pass, whose rows come to the driver anyway: `collected_metrics` sums
                them in Arrow. No observation in the plan: Catalyst has about a hundred fewer
                aggregate expressions to analyse and optimize, and the task none to update per
                row (rounds of the benchmark's two flows: ~15% of a round)

Both give the same layout: metric name -> [pass total, partition 1, partition 2, ...]; `lost` and
`gone` are counts of kept groups.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..aggregates.base import ROWS
from ..run.plan import PartitionPlan
from ..run.reading import PART
from ..windows import Granularity, partition_id
from .state import WS

BAD, LOST, GONE, SLOT, GROUP = "__bad", "__lost", "__gone", "__slot", "__group"
IN_ROWS, REJECTED, RETRACTED, GROUPS = "__in_rows", "__rejected", "__retracted", "__groups"
GOOD = f"NOT {BAD} AND {ROWS} != 0"  # state rows: no broken rule, rows left after retractions
_SUMMED = {"rows": IN_ROWS, "rejected": REJECTED, "retracted": RETRACTED, "groups": GROUPS}


def observed_metrics(plans: list[PartitionPlan]) -> list[str]:
    """Aggregates over merged rows: one array per metric, the pass's total first, then one element
    per partition (by `SLOT`) when `plans` is given.

    SQL text, one expression per metric rather than one per metric and partition: each expression
    is a few Py4J round trips in local mode. Windows are counted with a DataSketches HLL sketch:
    exact for small counts, a few hundred bytes per aggregate; `approx_count_distinct` at 1% error
    carried 16k registers per aggregate and task and cost a second per run in the observation alone."""
    # Slots rounded up to a power of two: runs over a similar number of partitions share the code
    # of these aggregates instead of compiling their own (see stable_sql.py).
    slots = (1 << (len(plans) - 1).bit_length()) if plans else 0
    conds = ["true", *[f"{SLOT} = {i}" for i in range(1, slots + 1)]]
    metrics = {name: f"sum(CASE WHEN {{c}} THEN {col} END)" for name, col in _SUMMED.items()}
    metrics["windows"] = f"hll_sketch_estimate(hll_sketch_agg(CASE WHEN {{c}} AND {GROUPS} > 0 THEN unix_micros({WS}) END, 12))"
    out = [f"array({', '.join(m.format(c=c) for c in conds)}) AS `{name}`" for name, m in metrics.items()]
    return [*out, *[f"sum(CASE WHEN {c} AND {GOOD} THEN 1 ELSE 0 END) AS {n}" for n, c in (("lost", LOST), ("gone", GONE))]]


def good_mask(rows: pa.Table) -> pa.ChunkedArray:
    """`GOOD` over merged rows collected as Arrow."""
    return pc.and_(pc.invert(rows[BAD]), pc.not_equal(rows[ROWS], 0))


def collected_metrics(rows: pa.Table, plans: list[PartitionPlan], granularity: Granularity) -> dict:
    """`observed_metrics`' values from the merged rows themselves (every row, kept or not), with a
    breakdown for every partition of `plans`. Windows are counted exactly."""
    slot = {partition_id(p.partition, granularity): i + 1 for i, p in enumerate(plans)}
    out: dict = {name: [0] * (len(plans) + 1) for name in [*_SUMMED, "windows"]}
    sums = rows.select([PART, *_SUMMED.values()]).group_by(PART).aggregate([(c, "sum") for c in _SUMMED.values()])
    touched = rows.filter(pc.greater(rows[GROUPS], 0)).select([PART, WS])
    counts = touched.group_by(PART).aggregate([(WS, "count_distinct")])
    for table, columns in ((sums, {n: f"{c}_sum" for n, c in _SUMMED.items()}), (counts, {"windows": f"{WS}_count_distinct"})):
        parts = table[PART].to_pylist()
        for name, column in columns.items():
            for part, value in zip(parts, table[column].to_pylist()):
                out[name][0] += value or 0
                if part in slot:
                    out[name][slot[part]] += value or 0
    for name, column in (("lost", LOST), ("gone", GONE)):
        out[name] = pc.sum(pc.and_(rows[column], good_mask(rows))).as_py() or 0
    return out


def flagged_window_starts(rows: pa.Table, column: str) -> list:
    """Starts of the kept windows with a group flagged in `column` (`LOST` or `GONE`), from
    collected merged rows."""
    return pc.unique(rows.filter(pc.and_(rows[column], good_mask(rows)))[WS]).to_pylist()


def flagged_groups(rows: pa.Table) -> list[tuple]:
    """(window start, group hash) of the kept groups that lost an extreme (`GONE`), from collected
    merged rows."""
    gone = rows.filter(pc.and_(rows[GONE], good_mask(rows))).select([WS, GROUP])
    return list(zip(gone[WS].to_pylist(), gone[GROUP].to_pylist()))
