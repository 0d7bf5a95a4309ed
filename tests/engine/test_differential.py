"""Incremental runs over random Delta histories equal a full recompute (correctness rule 1)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Hopping, Mode, Reason, Tumbling
from laminar_assets.engine.spec.kinds import KINDS
from laminar_assets.engine.sql.views import compile_sql
from tests.conftest import Lake, shard_size, shards
from tests.lake_invariants import assert_lake_intact, assert_no_orphans
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

# One aggregate of each kind the engine knows (`spec.kinds.KINDS`), so a new kind is in this test from its first
# day (test_the_flows_cover_every_aggregate_kind); `sql` (any other Spark aggregate, refill-only) is the SQL flow's.
ONE_OF_EACH_KIND = {
    "count": Agg.count(), "sum": Agg.sum("qty"), "avg": Agg.avg("px"), "var_samp": Agg.var_samp("px"),
    "stddev_samp": Agg.stddev_samp("px"), "min": Agg.min("px"), "max": Agg.max("qty"), "first": Agg.first("px"),
    "last": Agg.last("px"), "approx_count_distinct": Agg.approx_count_distinct("qty"),
    "approx_percentile": Agg.approx_percentile("px", 0.5), "count_distinct": Agg.count_distinct("qty"),
    "min_by": Agg.min_by("px", "qty"), "max_by": Agg.max_by("qty", "px"), "top_k": Agg.top_k("px", 2),
    "approx_top_k": Agg.approx_top_k("sym", 2),
}
ALL_KINDS = (*ONE_OF_EACH_KIND.values(), Agg.count("px", name="n_px"), Agg.sum("px"))
RETRACTABLE = (
    Agg.count(), Agg.count("px", name="n_px"), Agg.sum("qty"), Agg.sum("px"), Agg.avg("px"),
    Agg.var_samp("px"), Agg.stddev_samp("px"),
)
NON_RETRACTABLE = (
    Agg.count(), Agg.min("px"), Agg.max("qty"), Agg.first("px"), Agg.last("qty"),
    Agg.approx_count_distinct("sym"), Agg.approx_percentile("qty", 0.9), Agg.count_distinct("sym"),
    Agg.top_k("qty", 3),
)
FLOWS = (
    FlowSpec(name="tumble_all", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
             aggregates=ALL_KINDS),
    FlowSpec(name="tumble_retract", source="trades", event_time="ts", window=Tumbling("15m"), keys=("sym",),
             aggregates=RETRACTABLE, filter="qty IS NULL OR qty >= 1"),
    FlowSpec(name="hop_retract", source="trades", event_time="ts", window=Hopping("20m", "10m"), keys=("sym",),
             aggregates=RETRACTABLE, derived={"notional": "px * qty"}),
    FlowSpec(name="hop_other", source="trades", event_time="ts", window=Hopping("30m", "10m"), keys=(),
             aggregates=NON_RETRACTABLE),
    # Defined in SQL and refill-only (PERCENTILE does not merge): checked against Spark running the view's
    # own SELECT, not against the spec it compiled to.
    *compile_sql("""
        CREATE MATERIALIZED VIEW sql_refill_only AS
        SELECT sym, HOP(ts, INTERVAL '10' MINUTE, INTERVAL '20' MINUTE),
               PERCENTILE(px, 0.5) AS median_px,
               MAX_BY(qty, named_struct('p', px, 'q', qty)) AS qty_at_max_px, COUNT(*) AS n,
               SUM(px * qty) / COUNT(qty) AS notional_per_trade,
               RANK() OVER (PARTITION BY HOP(ts, INTERVAL '10' MINUTE, INTERVAL '20' MINUTE)
                            ORDER BY COUNT(*) DESC, sym) AS busiest
        FROM trades WHERE qty IS NULL OR qty <> 4
        GROUP BY sym, HOP(ts, INTERVAL '10' MINUTE, INTERVAL '20' MINUTE)""", origin="test_differential"),
)
PARTITIONS = ("2023-12-31-23:00", "2024-01-01-00:00", "2024-01-01-01:00")

# Prices near 1e2 with the odd 1e13 among them: retracting the large one must not leave the rounding
# error of 1e13 in a window's float sum or variance (the engine refills it: PRECISION_LOSS).
price = st.one_of(st.none(), st.floats(1.0, 1000.0, allow_nan=False).map(lambda x: round(x, 3)),
                  st.sampled_from([1e13, 3.5e13]))
row = st.tuples(
    st.integers(0, 119 * 60 + 59).map(lambda s: f"2024-01-01 {s // 3600:02d}:{(s // 60) % 60:02d}:{s % 60:02d}"),
    st.sampled_from(["a", "b", "c"]),
    price,
    st.one_of(st.none(), st.integers(0, 5)),
)
bad_row = st.sampled_from([(None, "a", 1.0, 1), ("2024-01-01 00:30:00", None, 2.0, 2)])
op = st.one_of(
    st.tuples(st.just("append"), st.lists(row, min_size=1, max_size=8)),
    st.tuples(st.just("append"), st.lists(st.one_of(row, bad_row), min_size=1, max_size=4)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("update"), st.integers(0, 5)),
    st.tuples(st.just("compact"), st.none()),
    st.tuples(st.just("cleanup"), st.none()),
    st.tuples(st.just("vacuum"), st.none()),
    st.tuples(st.just("run"), st.lists(st.booleans(), min_size=len(FLOWS) * len(PARTITIONS),
                                       max_size=len(FLOWS) * len(PARTITIONS))),
    st.tuples(st.just("run_many"), st.lists(st.booleans(), min_size=len(FLOWS) * len(PARTITIONS),
                                            max_size=len(FLOWS) * len(PARTITIONS))),
)
# None: never refill for cost; a tiny ratio: refill (REFILL_CHEAPER) whenever anything changed.
# The tests' tables are tiny, so passes run in one task and interpreted; LARGE_PASS_PATH makes them
# combine map-side, shuffle by partition and compile, as passes over large inputs do.
LARGE_PASS_PATH = dict(single_task_below_bytes=0, interpreted_below_bytes=0, driver_write_below_bytes=0)
options = st.sampled_from([EngineOptions(refill_ratio=None), EngineOptions(refill_ratio=0.3, refill_min_bytes=0),
                           EngineOptions(refill_ratio=1e-6, refill_min_bytes=0),
                           EngineOptions(refill_ratio=None, **LARGE_PASS_PATH)])
EXAMPLES = int(os.environ.get("LAMINAR_DIFFERENTIAL_EXAMPLES", "5"))


def _apply(lake: Lake, kind: str, arg) -> None:
    if kind == "append":
        lake.append("trades", arg)
    elif kind == "delete":
        lake.delete("trades", f"qty = {arg}")
    elif kind == "update":
        lake.update("trades", {"px": "px + 1.5", "ts": "ts - INTERVAL 20 MINUTES"}, f"qty = {arg}")
    elif kind == "compact":
        lake.compact("trades")
    elif kind == "cleanup":
        dt = lake.table("trades")
        dt.create_checkpoint()
        dt.cleanup_metadata()
    elif kind == "vacuum":  # files of earlier commits disappear under the same engine (one process)
        lake.table("trades").vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)


def _run_history(spark, cdf: bool, first_rows, ops, options: EngineOptions | None = None,
                 root: str | None = None, flows: tuple = FLOWS) -> dict[str, list]:
    """`root`: where the lake lives (default: a new local folder; a bucket of a local S3 server).
    `flows`: the flows run (a run op's choices index `FLOWS`; flows not given are skipped)."""
    folder = tempfile.mkdtemp(prefix="laminar-diff-")
    try:
        lake = Lake(root or os.path.join(folder, "lake"))
        lake.create("trades", first_rows, cdf=cdf, **{"delta.logRetentionDuration": "interval 0 seconds"})
        engine = Engine(spark, lake.root, options=options or EngineOptions(refill_ratio=None))
        seen: dict[str, list] = {f.name: [] for f in flows}

        def run(flow, partitions, together):
            results = engine.run_many(flow, partitions) if together else [engine.run(flow, p) for p in partitions]
            seen[flow.name] += [(r.mode, r.reason) for r in results]

        for kind, arg in ops:
            if kind in ("run", "run_many"):
                for i, flow in enumerate(FLOWS):
                    if flow not in flows:
                        continue
                    chosen = [p for j, p in enumerate(PARTITIONS) if arg[i * len(PARTITIONS) + j]]
                    if chosen:
                        run(flow, chosen, kind == "run_many")
            else:
                _apply(lake, kind, arg)
            assert_lake_intact(lake.root)  # every file a table names exists, after every step
        for flow in flows:
            run(flow, list(PARTITIONS), True)
        assert_no_orphans(lake.root, [f.sink for f in flows])
        snapshot = lake.table("trades").to_pyarrow_table()
        for flow in flows:
            expected = full_recompute(spark, flow, snapshot)  # a SQL flow: its own SELECT run by Spark
            actual = lake.read(flow.sink) if lake.table_exists(flow.sink) else expected.iloc[0:0]
            assert_frames_match(actual, expected, flow.keys)
        return seen
    finally:
        shutil.rmtree(folder, ignore_errors=True)


SHARDS = 2


def test_the_flows_cover_every_aggregate_kind():
    covered = {a.kind for flow in FLOWS for a in flow.aggregates}
    assert covered == set(KINDS), f"aggregate kinds no flow here computes: {sorted(set(KINDS) - covered)}"


@shards(SHARDS)
def test_incremental_equals_full_recompute(spark, shard):
    """EXAMPLES random histories in all, in shards the test processes take one by one (seeds 0, 1)."""

    @seed(shard)
    @settings(max_examples=shard_size(EXAMPLES, SHARDS, shard), deadline=None, suppress_health_check=list(HealthCheck))
    @given(cdf=st.booleans(), first_rows=st.lists(row, min_size=1, max_size=10),
           ops=st.lists(op, min_size=2, max_size=7), options=options)
    def history(cdf, first_rows, ops, options):
        seen = _run_history(spark, cdf, first_rows, ops, options)
        assert all(mode is not Mode.INCREMENTAL for mode, _ in seen["sql_refill_only"])  # nothing of it merges
        # With a change data feed, a retractable flow needs a refill for deletes/updates only when a
        # retraction cost a window its precision, or when a refill was the cheaper way.
        if cdf:
            allowed = {Reason.NO_WATERMARK, Reason.CHECKPOINT_EXPIRED, Reason.PRECISION_LOSS, Reason.REFILL_CHEAPER}
            for mode, reason in seen["hop_retract"] + seen["tumble_retract"]:
                assert mode is not Mode.REFILL or reason in allowed, reason

    history()


# The pass path (how rows are combined) does not touch storage, so the bucket runs only one of them;
# nor do a flow's window and aggregates, so the bucket runs one flow of each way a run changes its sink
# (every aggregate merged, a retraction, a refill of a SQL view): STORAGE_FLOWS. Hopping windows and
# retracting flows in a bucket: tests/engine/test_stateful_s3.py's random histories.
STORAGE_FLOWS = tuple(f for f in FLOWS if f.name in ("tumble_all", "hop_retract", "sql_refill_only"))


@pytest.mark.parametrize("large,where", [(False, "local"), (True, "local"), (False, "s3")],
                         ids=["tiny-pass-path", "large-pass-path", "tiny-pass-path-s3"])
def test_fixed_history_exercises_every_path(spark, large, where, request):
    """A hand-picked history that hits append, retract, refill, compaction and expiry paths, along
    the path of tiny passes (rows shuffled once, interpreted) and of large ones (combined, compiled),
    with the lake in a local folder and in a bucket.

    Along the tiny path in a folder each partition runs alone; along the large path and in a bucket
    each flow runs its three partitions in one pass (half the CPU): the large path shuffles by
    partition only when a pass holds several, and a bucket's commits then carry several partitions.
    Partitions run alone along the large path and in a bucket: the random histories above (their
    `run` ops, LARGE_PASS_PATH among their options) and tests/engine/test_stateful_s3.py."""
    together = large or where == "s3"
    run_all = ("run_many" if together else "run", [True] * (len(FLOWS) * len(PARTITIONS)))
    one = [False] * (len(FLOWS) * len(PARTITIONS))
    one[1] = True  # tumble_all, 2024-01-01-00:00
    ops = [
        run_all,
        ("append", [("2024-01-01 00:05:00", "a", 10.0, 1), ("2024-01-01 01:55:00", "b", 20.0, 2)]),
        ("run", one),
        ("append", [("2024-01-01 00:01:00", "a", 11.0, 3)]),  # late row
        ("update", 1),
        ("delete", 2),
        run_all,
        ("compact", None),
        ("append", [("2024-01-01 00:59:59", "c", 5.0, 4), (None, "c", 1.0, 1)]),
        ("cleanup", None),  # drops commits after the watermarks: CHECKPOINT_EXPIRED
        ("append", [("2024-01-01 01:00:00", "c", 6.0, 4)]),
        run_all,
    ]
    first = [("2024-01-01 00:00:00", "a", 1.0, 1), ("2024-01-01 00:10:00", "b", 2.0, 2),
             ("2024-01-01 01:10:00", "c", 3.0, 3), ("2024-01-01 00:20:00", "a", None, 2)]
    options = EngineOptions(refill_ratio=None, **(LARGE_PASS_PATH if large else {}))
    if where == "s3":
        from tests.object_store import using

        server = request.getfixturevalue("s3_server")
        with using(server):
            seen = _run_history(spark, True, first, ops, options, root=server.bucket(), flows=STORAGE_FLOWS)
    else:
        seen = _run_history(spark, True, first, ops, options)
    reasons = {r for runs in seen.values() for _, r in runs}
    for expected in (Reason.NO_WATERMARK, Reason.APPEND_ONLY, Reason.RETRACTABLE_CHANGES,
                     Reason.NON_APPEND_ON_NON_RETRACTABLE, Reason.CHECKPOINT_EXPIRED, Reason.NO_NEW_VERSIONS,
                     Reason.QUERY_NOT_INCREMENTALIZABLE):
        assert expected in reasons, (expected, reasons)
