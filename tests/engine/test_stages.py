"""Row-level shared stages: dedup, dimension join (fan-in), and flows that read a stage by version."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from laminar_assets.engine import Agg, DimensionJoin, EngineOptions, FlowSpec, Mode, Reason, StageSpec, Tumbling
from laminar_assets.engine.executor import Engine
from laminar_assets.errors import InjectedCrash, SpecError
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
STAGE = StageSpec(
    name="norm", source="raw", event_time="ts", dedup_key=("trade_id",), filter="qty > 0",
    derived={"notional": "px * qty"},
    joins=(DimensionJoin("symbols", on=("sym",), columns=("sector",)),),
)
SECTORS = FlowSpec(name="sectors", source="norm", event_time="ts", window=Tumbling("10m"), keys=("sector",),
                   aggregates=(Agg.count(), Agg.sum("notional"), Agg.max("px")))


@pytest.fixture(params=["driver-writes", "spark-writes"])
def engine(request, spark, lake) -> Engine:
    """Both ways a stage pass runs: small passes in one task with their rows written through the
    driver (the default for these tiny tables), and large passes' shuffles and Spark write jobs."""
    spark_writes = request.param == "spark-writes"
    large = EngineOptions(driver_write_below_bytes=0, single_task_below_bytes=0)
    return Engine(spark, lake.root, options=large if spark_writes else None)


def raw(rows):
    df = pd.DataFrame(rows, columns=["trade_id", "ts", "sym", "px", "qty"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    return df.astype({"trade_id": "int64", "px": "float64", "qty": "int64"})


def symbols(rows):
    return pd.DataFrame(rows, columns=["sym", "sector"])


def expected_stage(lake) -> pd.DataFrame:
    """Pandas reference: filter, derive, dedup (earliest ts, then smallest other values), inner join."""
    src = lake.read("raw")
    dim = lake.read("symbols")
    src = src[src["qty"] > 0].assign(notional=lambda d: d.px * d.qty)
    src = src.sort_values(["trade_id", "ts", "sym", "px", "qty", "notional"]).drop_duplicates("trade_id")
    out = src.merge(dim, on="sym", how="inner")
    return out[["trade_id", "ts", "sym", "px", "qty", "notional", "sector"]].sort_values("trade_id").reset_index(drop=True)


def actual_stage(lake) -> pd.DataFrame:
    df = lake.read("norm")
    return df[["trade_id", "ts", "sym", "px", "qty", "notional", "sector"]].sort_values("trade_id").reset_index(drop=True)


def assert_stage(lake):
    pd.testing.assert_frame_equal(actual_stage(lake), expected_stage(lake), check_dtype=False)


def setup(lake):
    lake.create("raw", frame=raw([
        (1, "2024-01-01 00:01:00", "AAA", 10.0, 2), (2, "2024-01-01 00:02:00", "BBB", 20.0, 1),
        (2, "2024-01-01 00:02:00", "BBB", 20.0, 1), (3, "2024-01-01 00:15:00", "ZZZ", 5.0, 1),
        (4, "2024-01-01 00:16:00", "AAA", 11.0, 0),
    ]))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))


# A stage's first run, and its refills for a dimension recreated or a source delete, along one pass
# path: the other's first run with a quarantined row is test_a_dimension_column_with_a_dot_or_backtick
# [spark-writes-*], its DIMENSION_CHANGED refill test_dimension_change_refills_stage_and_downstream
# [spark-writes], its refill with deletes test_a_refill_with_deletes_commits_from_one_job_after_the_read
# [spark-writes] (the plan that picks these refills does not depend on the pass path).
ONE_PASS_PATH = pytest.mark.parametrize("engine", ["driver-writes"], indirect=True)


@ONE_PASS_PATH
def test_stage_output_and_unmatched_rows(spark, lake, engine):
    setup(lake)
    r = engine.run(STAGE, PART)
    assert r.reason is Reason.NO_WATERMARK
    assert r.quarantined == {"unmatched_symbols": 1}  # ZZZ has no sector
    assert_stage(lake)
    assert set(lake.read("norm").columns) == {"trade_id", "ts", "sym", "px", "qty", "notional", "sector"}


def test_stage_incremental_appends_dedup_and_downstream_flow(spark, lake, engine):
    setup(lake)
    engine.run(STAGE, PART)
    engine.run(SECTORS, PART)
    lake.append("raw", frame=raw([(1, "2024-01-01 00:01:00", "AAA", 10.0, 2), (5, "2024-01-01 00:03:00", "AAA", 12.0, 3)]))
    r = engine.run(STAGE, PART)
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert r.metrics["sink_rows"] == 1  # the duplicate of trade 1 is not appended again
    assert_stage(lake)
    d = engine.run(SECTORS, PART)
    assert (d.mode, d.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    expected = full_recompute(spark, SECTORS, lake.table("norm").to_pyarrow_table())
    assert_frames_match(lake.read("sectors"), expected, SECTORS.keys)


def test_earlier_duplicate_replaces_kept_row(spark, lake, engine):
    setup(lake)
    engine.run(STAGE, PART)
    lake.append("raw", frame=raw([(2, "2024-01-01 00:00:30", "BBB", 19.0, 1)]))
    r = engine.run(STAGE, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.DEDUP_REPLACED_ROW)
    assert_stage(lake)


def test_dimension_change_refills_stage_and_downstream(spark, lake, engine):
    setup(lake)
    engine.run(STAGE, PART)
    engine.run(SECTORS, PART)
    from deltalake import write_deltalake

    write_deltalake(lake.path("symbols"), symbols([("AAA", "tech"), ("BBB", "utilities"), ("ZZZ", "misc")]),
                    mode="overwrite")
    r = engine.run(STAGE, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.DIMENSION_CHANGED)
    assert r.plan.from_versions["symbols"] == 0 and r.plan.to_versions["symbols"] == 1
    assert_stage(lake)
    assert r.metrics["rows_deleted"] == 1 and r.metrics["rows_inserted"] == 2  # BBB re-sectored, ZZZ now joins
    d = engine.run(SECTORS, PART)
    # the stage published exact change data: the flow merges it, its max too (a window whose max lost
    # every row holding it is recomputed alone)
    assert d.reason in (Reason.RETRACTABLE_CHANGES, Reason.EXTREME_RETRACTED) and not d.plan.refill_all
    expected = full_recompute(spark, SECTORS, lake.table("norm").to_pyarrow_table())
    assert_frames_match(lake.read("sectors"), expected, SECTORS.keys)


@ONE_PASS_PATH
def test_dimension_recreated_at_the_same_version_refills_stage(spark, lake, engine):
    import shutil

    from deltalake import write_deltalake

    setup(lake)
    engine.run(STAGE, PART)
    shutil.rmtree(lake.path("symbols"))
    write_deltalake(lake.path("symbols"), symbols([("AAA", "tech"), ("BBB", "utilities")]))  # version 0 again
    r = engine.run(STAGE, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.DIMENSION_CHANGED) and "recreated" in r.plan.detail
    assert_stage(lake)


@ONE_PASS_PATH
def test_source_delete_refills_stage(spark, lake, engine):
    setup(lake)
    engine.run(STAGE, PART)
    lake.delete("raw", "trade_id = 1")
    r = engine.run(STAGE, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert_stage(lake)


@pytest.mark.parametrize("step", ["after_intent", "after_read", "after_sink_commit"])
def test_stage_crash_then_rerun(spark, lake, step):
    setup(lake)
    Engine(spark, lake.root).run(STAGE, PART)
    lake.append("raw", frame=raw([(6, "2024-01-01 00:04:00", "BBB", 1.0, 1)]))

    def hook(current):
        if current == step:
            raise InjectedCrash(step)

    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=hook).run(STAGE, PART)
    Engine(spark, lake.root).run(STAGE, PART)
    assert_stage(lake)


VOLUME = FlowSpec(name="volume", source="norm", event_time="ts", window=Tumbling("10m"), keys=("sector",),
                  aggregates=(Agg.count(), Agg.sum("notional"), Agg.avg("px")))


def test_stage_correction_keeps_retractable_downstream_incremental(spark, lake, engine):
    setup(lake)
    engine.run(STAGE, PART)
    engine.run(VOLUME, PART)
    lake.update("raw", {"px": "99.0"}, "trade_id = 1")
    r = engine.run(STAGE, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert (r.metrics["rows_deleted"], r.metrics["rows_inserted"]) == (1, 1)
    assert_stage(lake)
    # delta-rs's own change data reader sees exactly our delete and insert
    import pyarrow as pa
    from deltalake import DeltaTable

    cdf = pa.table(DeltaTable(lake.path("norm")).load_cdf(starting_version=2).read_all()).to_pandas()
    assert sorted(zip(cdf["_change_type"], cdf["px"])) == [("delete", 10.0), ("insert", 99.0)]
    d = engine.run(VOLUME, PART)
    assert (d.mode, d.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)
    expected = full_recompute(spark, VOLUME, lake.table("norm").to_pyarrow_table())
    assert_frames_match(lake.read("volume"), expected, VOLUME.keys)


def test_change_data_commits_write_checkpoints_at_the_tables_interval(spark, lake, engine):
    """A stage's refills commit change data through Laminar's own log writer; like delta-rs after its
    commits, it checkpoints at the table's interval, so opening the table never replays all of its
    history (`delta.checkpointInterval` set to 2 here; Delta's default is 100)."""
    import json
    import os

    from deltalake import DeltaTable

    setup(lake)
    engine.run(STAGE, PART)
    DeltaTable(lake.path("norm")).alter.set_table_properties({"delta.checkpointInterval": "2"})
    for trade_id in (1, 2):  # both rows are in the stage's output: each refill deletes and inserts
        lake.update("raw", {"px": "px + 1"}, f"trade_id = {trade_id}")
        r = engine.run(STAGE, PART)
        assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
        assert r.metrics["rows_deleted"] == 1
    log = os.path.join(lake.path("norm"), "_delta_log")

    def has_change_data(version: int) -> bool:
        with open(os.path.join(log, f"{version:020d}.json"), encoding="utf-8") as fh:
            return any("cdc" in json.loads(line) for line in fh)

    due = [v for v in range(DeltaTable(lake.path("norm")).version() + 1) if (v + 1) % 2 == 0 and has_change_data(v)]
    assert due, sorted(os.listdir(log))
    for v in due:
        assert f"{v:020d}.checkpoint.parquet" in os.listdir(log), sorted(os.listdir(log))
    assert_stage(lake)


def test_a_refill_diffs_duplicate_rows_as_a_multiset(spark, lake, engine):
    """Without a dedup key a stage keeps identical rows; a refill's change data deletes and inserts
    each copy (EXCEPT ALL both ways), and rows whose count did not change are not in it."""
    import pyarrow as pa
    from deltalake import DeltaTable

    plain = StageSpec(name="plain", source="raw", event_time="ts")
    lake.create("raw", frame=raw([(1, "2024-01-01 00:01:00", "AAA", 10.0, 2)] * 2 +
                                 [(2, "2024-01-01 00:02:00", "BBB", 20.0, 1)] * 3))
    engine.run(plain, PART)
    lake.update("raw", {"px": "99.0"}, "trade_id = 1")
    r = engine.run(plain, PART)
    assert (r.mode, r.metrics["rows_deleted"], r.metrics["rows_inserted"], r.metrics["sink_rows"]) == (Mode.REFILL, 2, 2, 5)
    cdf = pa.table(DeltaTable(lake.path("plain")).load_cdf(starting_version=2).read_all()).to_pandas()
    assert sorted(zip(cdf["_change_type"], cdf["trade_id"], cdf["px"])) == [
        ("delete", 1, 10.0), ("delete", 1, 10.0), ("insert", 1, 99.0), ("insert", 1, 99.0)]
    out = lake.read("plain").sort_values(["trade_id", "px"]).reset_index(drop=True)
    assert list(zip(out["trade_id"], out["px"])) == [(1, 99.0)] * 2 + [(2, 20.0)] * 3


def test_an_append_is_one_spark_job_with_its_counts_quarantine_and_dedup_verdict(spark, lake, engine):
    """Appends to incremental partitions read, join, dedup against the kept rows and write in one Spark
    job: its observations give the run's counts and say which partitions a new row would replace a
    kept one in (only those refill). A row breaking a rule still reaches the quarantine."""
    from tests.engine.test_one_pass import Jobs

    setup(lake)
    keys = [PART, "2024-01-01-01:00"]
    lake.append("raw", frame=raw([(10, "2024-01-01 01:05:00", "AAA", 3.0, 1)]))
    engine.run_many(STAGE, keys)
    lake.append("raw", frame=raw([(1, "2024-01-01 00:01:00", "AAA", 10.0, 2),  # kept already: dropped
                                  (5, "2024-01-01 00:03:00", "AAA", 12.0, 3)]))
    results, jobs = Jobs(spark).count(lambda: engine.run_many(STAGE, keys))
    r = {x.plan.partition: x for x in results}[PART]
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert (r.metrics["rows_read"], r.metrics["rows_rejected"], r.metrics["sink_rows"]) == (2, 0, 1)
    # the write, plus Spark's broadcasts of the two small sides (the dimension and the kept rows);
    # with the rows cached, counted and the verdict collected first it was six
    assert jobs <= 3, jobs
    assert_stage(lake)

    lake.append("raw", frame=raw([(6, "2024-01-01 00:04:00", "BBB", 1.0, 1),
                                  (7, "2024-01-01 00:05:00", "ZZZ", 1.0, 1)]))  # unknown symbol: quarantined
    r = engine.run(STAGE, PART)
    assert (r.mode, r.metrics["rows_read"], r.metrics["rows_rejected"], r.metrics["sink_rows"]) == (Mode.INCREMENTAL, 2, 1, 1)
    assert r.quarantined == {"unmatched_symbols": 1}
    assert_stage(lake)

    lake.append("raw", frame=raw([(11, "2024-01-01 01:06:00", "BBB", 4.0, 1),
                                  (10, "2024-01-01 01:00:30", "AAA", 2.0, 1)]))  # earlier than the kept trade 10
    results = {x.plan.partition: x for x in engine.run_many(STAGE, keys)}
    assert (results[keys[1]].mode, results[keys[1]].reason) == (Mode.REFILL, Reason.DEDUP_REPLACED_ROW)
    assert results[PART].mode is Mode.NOOP
    assert_stage(lake)


def test_a_refill_with_deletes_commits_from_one_job_after_the_read(spark, lake, engine, request):
    """A refill that deletes rows: the rows are read once (cached); a small pass then brings its
    change data and its new rows to the driver in one Spark job, where a large one writes them in
    two. Both commit the same rows and change data."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from tests.engine.test_one_pass import Jobs

    setup(lake)
    engine.run(STAGE, PART)
    lake.update("raw", {"px": "px + 1"}, "trade_id = 2")
    lake.delete("raw", "trade_id = 1")
    r, jobs = Jobs(spark).count(lambda: engine.run(STAGE, PART))
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert (r.metrics["rows_deleted"], r.metrics["rows_inserted"]) == (2, 1)
    # the dimension's broadcast and the read; the quarantine's two (trade 3's symbol is unknown: its
    # recorded rows' broadcast, its write); then the commit: one job (small), or the change data and the rows
    small = request.node.callspec.params["engine"] == "driver-writes"
    assert jobs <= (5 if small else 6), jobs
    norm = DeltaTable(lake.path("norm"))
    cdf = pa.table(norm.load_cdf(starting_version=norm.version()).read_all()).to_pandas()
    assert sorted(zip(cdf["_change_type"], cdf["trade_id"], cdf["px"])) == [
        ("delete", 1, 10.0), ("delete", 2, 20.0), ("insert", 2, 21.0)]
    assert_stage(lake)


def test_an_append_to_a_partition_that_kept_no_rows(spark, lake, engine):
    """A partition whose every row was rejected has a watermark but no rows in the output: an append
    there is still incremental, with nothing to dedup against (found in review: the dedup verdict
    was read from an observation no job had filled)."""
    setup(lake)
    late = "2024-01-01-01:00"
    lake.append("raw", frame=raw([(20, "2024-01-01 01:05:00", "ZZZ", 1.0, 1)]))  # unknown symbol: rejected
    engine.run_many(STAGE, [PART, late])
    lake.append("raw", frame=raw([(21, "2024-01-01 01:06:00", "AAA", 2.0, 1)]))
    [r] = engine.run_many(STAGE, [late])
    assert (r.mode, r.reason, r.metrics["sink_rows"]) == (Mode.INCREMENTAL, Reason.APPEND_ONLY, 1)
    assert_stage(lake)


def test_per_partition_counts_of_a_batched_stage_run(spark, lake, engine):
    """A batch over three partitions counts each partition's rows read and rejected apart, in the
    refill path (no watermark yet) and in the append-only path (the counts are observed by
    partition slot, so a batch's partitions must not swap or merge their numbers)."""
    setup(lake)  # 00:00: 5 rows, of which 1 unmatched symbol (ZZZ) and 1 filtered out (qty 0)
    keys = [PART, "2024-01-01-01:00", "2024-01-01-02:00"]
    lake.append("raw", frame=raw([(10, "2024-01-01 01:05:00", "AAA", 3.0, 1),
                                  (11, "2024-01-01 02:05:00", "ZZZ", 3.0, 1), (12, "2024-01-01 02:06:00", "ZZZ", 3.0, 1),
                                  (13, "2024-01-01 02:07:00", "BBB", 3.0, 1)]))
    first = {r.plan.partition: r for r in engine.run_many(STAGE, keys)}
    assert {k: r.mode for k, r in first.items()} == {k: Mode.REFILL for k in keys}
    counts = {k: (r.metrics["rows_read"], r.metrics["rows_rejected"]) for k, r in first.items()}
    singles = {}
    for k in keys:  # the same partitions refilled one at a time count the same rows
        [single] = engine.run_many(STAGE, [k], force=True)
        singles[k] = (single.metrics["rows_read"], single.metrics["rows_rejected"])
    assert counts == singles
    assert counts[keys[1]] == (1, 0) and counts[keys[2]] == (3, 2), counts

    lake.append("raw", frame=raw([(20, "2024-01-01 00:20:00", "AAA", 1.0, 1), (21, "2024-01-01 00:21:00", "BBB", 1.0, 1),
                                  (22, "2024-01-01 02:20:00", "ZZZ", 1.0, 1)]))
    again = {r.plan.partition: r for r in engine.run_many(STAGE, keys)}  # 01:00 is within the file's time range
    assert {k: (r.mode, r.metrics["rows_read"], r.metrics["rows_rejected"]) for k, r in again.items()} == {
        keys[0]: (Mode.INCREMENTAL, 2, 0), keys[1]: (Mode.INCREMENTAL, 0, 0), keys[2]: (Mode.INCREMENTAL, 1, 1)}
    assert_stage(lake)


@pytest.mark.parametrize("change", [
    dict(derived={"notional": "px * qty", "SECTOR": "upper(sym)"}),  # a derived column, other case
    dict(derived={"notional": "px * qty", "sector": "upper(sym)"}),  # a derived column, same name
    dict(joins=(DimensionJoin("symbols", on=("sym",), columns=("sector",)),
                DimensionJoin("symbols2", on=("sym",), columns=("Sector",)))),  # two joins adding it
], ids=["derived-case", "derived-same", "two-joins"])
def test_a_dimension_column_beside_another_of_its_name_is_refused(lake, engine, change):
    """The join adds `sector` beside a column Spark would call the same: the run failed with
    AMBIGUOUS_REFERENCE deep in the pass; now the source check names the join's columns."""
    setup(lake)
    lake.create("symbols2", frame=symbols([("AAA", "tech")]))
    bad = dataclasses.replace(STAGE, **change)
    with pytest.raises(SpecError) as info:
        engine.run(bad, PART)
    assert info.value.field.startswith("joins[") and info.value.field.endswith("].columns")
    assert "sector" in str(info.value).lower() and info.value.facts["table"] == "raw"
    assert not lake.table_exists("norm")



def _replace_symbols(lake, frame: pd.DataFrame) -> None:
    from deltalake import write_deltalake

    write_deltalake(lake.path("symbols"), frame, mode="overwrite", schema_mode="overwrite")


def test_one_dimension_joined_twice(spark, lake, engine):
    """Two joins of one table (inner for the sector, left for the region): each join has its own
    match marker (they shared `__m_<table>` and the pass failed with AMBIGUOUS_REFERENCE)."""
    setup(lake)
    _replace_symbols(lake, pd.DataFrame([("AAA", "tech", "us"), ("BBB", "energy", None)],
                                        columns=["sym", "sector", "region"]))
    twice = dataclasses.replace(STAGE, joins=(DimensionJoin("symbols", on=("sym",), columns=("sector",)),
                                              DimensionJoin("symbols", on=("sym",), columns=("region",), how="left")))
    r = engine.run(twice, PART)
    assert r.quarantined == {"unmatched_symbols_on_sym": 1}  # ZZZ: no sector
    want = expected_stage(lake).merge(lake.read("symbols")[["sym", "region"]], on="sym", how="left")
    got = lake.read("norm").sort_values("trade_id").reset_index(drop=True)
    assert list(got["region"]) == ["us", None]  # trade 1 (AAA), trade 2 (BBB: no region)
    pd.testing.assert_frame_equal(got[list(want.columns)], want.sort_values("trade_id").reset_index(drop=True),
                                  check_dtype=False)


@pytest.mark.parametrize("column", ["sector.name", "sec`tor"])
def test_a_dimension_column_with_a_dot_or_backtick(spark, lake, engine, column):
    """Dimension columns are quoted when the join selects them (a backtick failed with
    INVALID_ATTRIBUTE_NAME_SYNTAX, a dot read a struct field)."""
    setup(lake)
    _replace_symbols(lake, pd.DataFrame([("AAA", "tech"), ("BBB", "energy")], columns=["sym", column]))
    odd = dataclasses.replace(STAGE, joins=(DimensionJoin("symbols", on=("sym",), columns=(column,)),))
    r = engine.run(odd, PART)
    assert r.quarantined == {"unmatched_symbols": 1}  # ZZZ
    got = lake.read("norm").sort_values("trade_id").reset_index(drop=True)
    assert list(zip(got["sym"], got[column])) == [("AAA", "tech"), ("BBB", "energy")]


# --- deletes and updates recompute the keys they touch (#49) -------------------------------------

@pytest.fixture(params=["driver-writes", "spark-writes"])
def key_engine(request, spark, lake) -> Engine:
    """`engine`, with keys refilled alone however small the output (the default leaves outputs under
    4 MiB to whole-partition refills)."""
    large = dict(driver_write_below_bytes=0, single_task_below_bytes=0) if request.param == "spark-writes" else {}
    return Engine(spark, lake.root, options=EngineOptions(key_refill_min_bytes=0, **large))


def _trades(first: int, n: int, minute: int = 0, hour: int = 0):
    return raw([(i, f"2024-01-01 {hour:02d}:{(minute + i) % 60:02d}:00", "AAA" if i % 2 else "BBB", 10.0 + i, 1)
                for i in range(first, first + n)])


def _files(lake, name: str) -> set[str]:
    return set(lake.table(name).file_uris())


def _cdf(lake, name: str, since: int) -> list[tuple]:
    import pyarrow as pa
    from deltalake import DeltaTable

    cdf = pa.table(DeltaTable(lake.path(name)).load_cdf(starting_version=since).read_all()).to_pandas()
    return sorted(zip(cdf["_change_type"], cdf["trade_id"], cdf["px"]))


def test_a_correction_recomputes_only_its_keys_and_rewrites_only_their_files(spark, lake, key_engine):
    lake.create("raw", frame=_trades(1, 20))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run(STAGE, PART)
    lake.append("raw", frame=_trades(21, 20))
    key_engine.run(STAGE, PART)
    second = _files(lake, "norm")
    version = lake.table("norm").version()
    lake.update("raw", {"px": "99.0"}, "trade_id = 3")
    r = key_engine.run(STAGE, PART)
    assert (r.mode, r.reason, r.metrics["refilled_keys"]) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE, 1)
    assert "1 key(s) of 40 output row(s) recomputed" in r.detail
    assert (r.metrics["rows_deleted"], r.metrics["rows_inserted"]) == (1, 1)
    assert r.metrics["refilled_share"] == 0.0
    assert_stage(lake)
    assert _cdf(lake, "norm", version + 1) == [("delete", 3, 13.0), ("insert", 3, 99.0)]
    after = _files(lake, "norm")
    holding = {f for f in second if 3 in set(pd.read_parquet(f)["trade_id"])}
    assert len(holding) == 1 and second - after == holding, "only the file holding trade 3 is rewritten"


def test_a_delete_hands_the_key_to_its_later_duplicate(spark, lake, key_engine):
    """Dedup keeps a key's earliest row; deleting it keeps the next one, read from the snapshot."""
    lake.create("raw", frame=_trades(1, 10))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    lake.append("raw", frame=raw([(7, "2024-01-01 00:30:00", "AAA", 70.0, 3), (8, "2024-01-01 00:40:00", "BBB", 80.0, 2)]))
    key_engine.run(STAGE, PART)
    lake.delete("raw", "trade_id = 7 AND px = 17.0")
    r = key_engine.run(STAGE, PART)
    assert r.metrics["refilled_keys"] == 1 and (r.metrics["rows_deleted"], r.metrics["rows_inserted"]) == (1, 1)
    assert_stage(lake)
    assert actual_stage(lake).set_index("trade_id").loc[7, "px"] == 70.0


def test_an_update_moving_a_row_to_another_hour_and_a_null_key(spark, lake, key_engine):
    nxt = "2024-01-01-01:00"
    lake.create("raw", frame=pd.concat([_trades(1, 10), _trades(11, 10, hour=1)], ignore_index=True))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run_many(STAGE, [PART, nxt])
    lake.update("raw", {"ts": "ts + INTERVAL 1 HOUR"}, "trade_id = 2")  # 00:02 -> 01:02, beside trade 12's hour
    lake.update("raw", {"trade_id": "NULL"}, "trade_id = 4")  # a NULL key is quarantined, its old row goes
    rs = key_engine.run_many(STAGE, [PART, nxt])
    # the first hour: trades 2 and 4, and the NULL key of 4's update (a key its rows leave out)
    assert [r.metrics.get("refilled_keys") for r in rs] == [3, 1]
    out = actual_stage(lake)
    expected = expected_stage(lake)
    expected = expected[expected["trade_id"].notna()].reset_index(drop=True)
    pd.testing.assert_frame_equal(out, expected, check_dtype=False)
    assert 4 not in set(out["trade_id"]) and out.set_index("trade_id").loc[2, "ts"].hour == 1


def test_many_changed_keys_recompute_the_partition(spark, lake, key_engine):
    lake.create("raw", frame=_trades(1, 10))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run(STAGE, PART)
    lake.update("raw", {"px": "px + 1"}, "trade_id > 3")
    r = key_engine.run(STAGE, PART)
    assert (r.mode, r.plan.refill_all, "refilled_keys" in r.metrics) == (Mode.REFILL, True, False)
    assert "7 key(s) changed of 10 output row(s), the partition is recomputed" in r.detail
    assert_stage(lake)


def test_a_small_output_is_recomputed_whole_by_default(spark, lake):
    setup(lake)
    engine = Engine(spark, lake.root)
    engine.run(STAGE, PART)
    lake.delete("raw", "trade_id = 1")
    r = engine.run(STAGE, PART)
    assert r.plan.refill and not r.plan.refill_groups and "under key_refill_min_bytes" in r.detail
    assert_stage(lake)


def test_keys_in_a_file_reaching_another_partition_recompute_the_partition(spark, lake, key_engine):
    """A user compacted the output across hours: its file cannot be rewritten for one hour's keys."""
    nxt = "2024-01-01-01:00"
    lake.create("raw", frame=pd.concat([_trades(1, 10), _trades(11, 10, hour=1)], ignore_index=True))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run_many(STAGE, [PART, nxt])
    lake.append("raw", frame=_trades(21, 5))
    key_engine.run(STAGE, PART)
    lake.table("norm").optimize.compact()
    lake.update("raw", {"px": "0.5"}, "trade_id = 3")
    r = key_engine.run(STAGE, PART)
    assert r.plan.refill_all and r.reason is Reason.NON_APPEND_ON_NON_RETRACTABLE
    assert_stage(lake)
    assert key_engine.run(STAGE, nxt).mode is Mode.NOOP


def test_a_bounded_batch_escalates_at_the_versions_it_reads(spark, lake):
    """A batch bounded to one version per run: a duplicate that replaces a kept row makes its
    partition recompute, at the version the batch reads; a later version stays for the next run."""
    nxt = "2024-01-01-01:00"
    bounded = dataclasses.replace(STAGE, max_versions_per_run=1)
    engine = Engine(spark, lake.root)
    lake.create("raw", frame=pd.concat([_trades(1, 5), _trades(11, 5, hour=1)], ignore_index=True))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    engine.run_many(bounded, [nxt, PART])
    # v1: trade 3 again, earlier than the kept row (replaces it), and a row of the next hour
    lake.append("raw", frame=raw([(3, "2024-01-01 00:00:30", "AAA", 3.0, 1), (30, "2024-01-01 01:30:00", "AAA", 1.0, 1)]))
    lake.append("raw", frame=raw([(31, "2024-01-01 00:50:00", "BBB", 2.0, 1)]))  # v2
    rs = engine.run_many(bounded, [nxt, PART])
    assert rs[1].reason is Reason.DEDUP_REPLACED_ROW and rs[1].plan.to_versions["raw"] == 1
    assert rs[1].metrics["pending_versions"] == 1
    for _ in range(3):
        engine.run_many(bounded, [nxt, PART])
    assert_stage(lake)


def test_more_changed_keys_than_a_refill_names_stay_in_spark(spark, lake, key_engine):
    """Past the most keys a refill would name, only their count reaches the driver, and the
    partition is recomputed whole."""
    from laminar_assets.engine.run.plan import ChangedGroups
    from laminar_assets.engine.stage.keys import changed_keys

    lake.create("raw", frame=_trades(1, 10))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run(STAGE, PART)
    lake.update("raw", {"px": "px + 1"}, "trade_id IN (2, 5, 6)")
    plan = key_engine.plan(STAGE, PART)
    inputs = key_engine.gather(STAGE, [key_engine.store.load(STAGE.name, PART)])
    assert changed_keys(key_engine.ctx, STAGE, [plan], inputs, most=2) == {PART: ChangedGroups(3, None)}
    found = changed_keys(key_engine.ctx, STAGE, [plan], inputs, most=3)[PART]
    assert found.count == 3 and len(set(found.hashes)) == 3
    assert sorted(found.values) == [(2,), (5,), (6,)]  # the trade ids, for skipping files by statistics


def test_a_key_refill_reads_only_the_files_that_may_hold_its_keys(spark, lake, key_engine, monkeypatch):
    """Trade ids grow with time, so each file holds a range of them: a correction of one trade reads
    the source snapshot file and the output file whose statistics hold its id, not their neighbours."""
    from laminar_assets.engine.stage import keys as stage_keys

    lake.create("raw", frame=_trades(1, 20))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run(STAGE, PART)
    for first in (21, 41):
        lake.append("raw", frame=_trades(first, 20))
        key_engine.run(STAGE, PART)
    outputs = _files(lake, "norm")
    assert len(outputs) >= 3
    lake.update("raw", {"px": "99.0"}, "trade_id = 45")
    opened: list[int] = []
    real = stage_keys.read_source
    monkeypatch.setattr(stage_keys, "read_source", lambda spark_, files, *a, **kw: (opened.append(len(files)),
                                                                                     real(spark_, files, *a, **kw))[1])
    r = key_engine.run(STAGE, PART)
    assert (r.mode, r.metrics["refilled_keys"]) == (Mode.REFILL, 1)
    # 3 source files and 3 output files without the statistics test
    assert r.metrics["files_read"] == 1, "of the 3 snapshot files, only the one the update wrote (trades 41-60)"
    ids = [pd.read_parquet(f)["trade_id"] for f in outputs]
    may_hold = [f for f in ids if f.min() <= 45 <= f.max()]  # Spark's writes may interleave ids over files
    assert opened and max(opened) == len(may_hold) < len(outputs), "output files whose ids exclude 45 are not opened"
    assert_stage(lake)
    assert _cdf(lake, "norm", lake.table("norm").version()) == [("delete", 45, 55.0), ("insert", 45, 99.0)]


def test_a_partition_in_one_output_file_is_rewritten_by_key_without_searching_its_files(spark, lake, monkeypatch):
    """One output file inside the hour is the only one that may hold the keys' rows: the refill
    reads it once, with no Spark job to find it. A changed key the output does not hold (its row
    appended and updated since the last run) leaves the file in place."""
    from laminar_assets.engine.stage import keys as stage_keys

    key_engine = Engine(spark, lake.root, options=EngineOptions(key_refill_min_bytes=0))  # the driver writes one file
    lake.create("raw", frame=_trades(1, 10))
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run(STAGE, PART)
    assert len(_files(lake, "norm")) == 1
    searched: list[bool] = []
    real = stage_keys.read_source
    monkeypatch.setattr(stage_keys, "read_source", lambda spark_, files, *a, **kw: (
        searched.append("file_name" in kw), real(spark_, files, *a, **kw))[1])
    version = lake.table("norm").version()
    lake.update("raw", {"px": "99.0"}, "trade_id = 3")
    r = key_engine.run(STAGE, PART)
    assert (r.metrics["refilled_keys"], r.metrics["rows_deleted"], r.metrics["rows_inserted"]) == (1, 1, 1)
    assert searched == [False], "the one file is read once, for its rows, not searched"
    assert _cdf(lake, "norm", version + 1) == [("delete", 3, 13.0), ("insert", 3, 99.0)]
    assert_stage(lake)
    before = _files(lake, "norm")
    lake.append("raw", frame=raw([(12, "2024-01-01 00:40:00", "BBB", 7.0, 1)]))
    lake.update("raw", {"px": "8.0"}, "trade_id = 12")  # a key the output does not hold yet
    r = key_engine.run(STAGE, PART)
    assert (r.metrics.get("refilled_keys"), r.metrics["rows_deleted"], r.metrics["rows_inserted"]) == (1, 0, 1), r.detail
    assert before < _files(lake, "norm"), "a file holding none of the keys stays; the new row is appended"
    assert_stage(lake)


def test_a_row_in_the_hours_last_millisecond_does_not_stop_a_key_refill(spark, lake, key_engine):
    """File statistics round a maximum up to the millisecond: 00:59:59.9995 reads as 01:00:00. The
    file still holds only this hour's rows, so its keys are recomputed alone (not the partition)."""
    lake.create("raw", frame=_trades(1, 8))
    lake.append("raw", frame=raw([(9, "2024-01-01 00:59:59.999500", "BBB", 20.0, 1)]))  # one output file holds both
    lake.create("symbols", frame=symbols([("AAA", "tech"), ("BBB", "energy")]))
    key_engine.run(STAGE, PART)
    lake.update("raw", {"px": "99.0"}, "trade_id = 1")
    r = key_engine.run(STAGE, PART)
    assert r.metrics.get("refilled_keys") == 1, r.detail
    assert_stage(lake)
