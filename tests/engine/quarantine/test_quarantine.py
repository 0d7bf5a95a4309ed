"""Quarantine: rows breaking a rule go to `_laminar/quarantine/<source>` once each, with the rule,
the source version and the original row; the good rows are aggregated exactly as a full recompute."""

from __future__ import annotations

import dataclasses
import json
import os

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Hopping, RowRule, SpecError, Tumbling
from laminar_assets.engine.quarantine.records import recorded_files, summarize
from laminar_assets.engine.windows import partition_interval
from laminar_assets.errors import InjectedCrash
from tests.arrow_python_files import forbid_python_files
from tests.engine.test_crash_safety import crash_at
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
NEXT = "2024-01-01-01:00"
RULES = (RowRule("positive_qty", "qty > 0"), RowRule("known_sym", "sym IN ('a', 'b')"))
FLOW = FlowSpec(name="q", source="trades", event_time="ts", window=Hopping("20m", "10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("qty"), Agg.max("px")), rules=RULES,
                event_time_bounds=("2023-01-01T00:00:00+00:00", "2030-01-01T00:00:00+00:00"))
BASE = [
    ("2024-01-01 00:01:00", "a", 10.0, 1),
    ("2024-01-01 00:02:00", "a", 11.0, -5),   # positive_qty
    ("2024-01-01 00:03:00", "zz", 12.0, 1),   # known_sym
    ("2024-01-01 00:04:00", None, 13.0, 1),   # known_sym (NULL is broken), before key_missing
    (None, "b", 14.0, 1),                      # event_time_missing (the sweep's)
    ("1999-01-01 00:00:00", "b", 15.0, 1),    # event_time_out_of_bounds (the sweep's)
    ("2024-01-01 01:05:00", "b", 16.0, 0),    # positive_qty, next partition
    ("2024-01-01 01:06:00", "b", 17.0, 2),
]


@pytest.fixture(params=["driver-writes", "spark-writes"])
def engine(request, spark, lake) -> Engine:
    """Both ways rejected rows are written: through the driver (what these tiny reads choose) and
    by Spark's write job (what large reads use)."""
    spark_writes = request.param == "spark-writes"
    return Engine(spark, lake.root, options=EngineOptions(driver_write_below_bytes=0) if spark_writes else None)


def quarantine(lake, source="trades"):
    path = os.path.join(lake.root, "_laminar", "quarantine", source)
    if not DeltaTable.is_deltatable(path):
        return []
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: (r["rule"], r["row"]))


def check_sink(spark, lake, flow=FLOW, until="2024-01-01 02:00"):
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    expected = expected[(expected["window_start"] >= "2024-01-01") & (expected["window_start"] < until)]
    assert_frames_match(lake.read(flow.sink), expected.reset_index(drop=True), flow.keys)


def test_each_broken_row_is_quarantined_once_with_rule_version_and_row(spark, lake, engine, monkeypatch):
    lake.create("trades", BASE)
    first = engine.run(FLOW, PART)
    second = engine.run(FLOW, NEXT)
    assert first.quarantined == {"positive_qty": 1, "known_sym": 2, "event_time_missing": 1,
                                 "event_time_out_of_bounds": 1}
    assert second.quarantined == {"positive_qty": 1}  # the sweep already recorded the partition-less rows
    rows = quarantine(lake)
    assert [(r["flow"], r["rule"], r["partition"], r["source_version"]) for r in rows] == [
        ("q", "event_time_missing", None, 0), ("q", "event_time_out_of_bounds", None, 0),
        ("q", "known_sym", PART, 0), ("q", "known_sym", PART, 0),
        ("q", "positive_qty", PART, 0), ("q", "positive_qty", NEXT, 0),
    ]
    originals = [json.loads(r["row"]) for r in rows]
    assert {"sym": "b", "px": 14.0, "qty": 1} in originals  # null fields are left out
    assert {"ts": "2024-01-01T00:02:00.000000Z", "sym": "a", "px": 11.0, "qty": -5} in originals
    with monkeypatch.context() as guarded:  # what `laminar quarantine` prints, read through no Python file
        forbid_python_files(guarded)
        summary = summarize(os.path.join(lake.root, "_laminar", "quarantine", "trades"), examples=1)
    assert [(s["flow"], s["rule"], s["rows"], s["min_version"], s["max_version"], len(s["examples"]))
            for s in summary] == [("q", "event_time_missing", 1, 0, 0, 1), ("q", "event_time_out_of_bounds", 1, 0, 0, 1),
                                  ("q", "known_sym", 2, 0, 0, 1), ("q", "positive_qty", 2, 0, 0, 1)]
    check_sink(spark, lake)


def test_a_runs_swept_rows_are_credited_to_a_partition_that_did_work(lake, engine):
    lake.create("trades", BASE)
    engine.run_many(FLOW, [PART, NEXT])
    lake.append("trades", [(None, "a", 20.0, 1), ("2024-01-01 01:30:00", "a", 21.0, 1)])
    idle, busy = engine.run_many(FLOW, [PART, NEXT])  # the new version touches NEXT only
    assert idle.plan.mode.value == "NOOP" and busy.plan.mode.value != "NOOP"
    assert idle.quarantined == {} and idle.metrics["rows_quarantined"] == 0
    assert busy.quarantined == {"event_time_missing": 1} and busy.metrics["rows_quarantined"] == 1


def test_reruns_and_refills_record_nothing_twice(spark, lake, engine):
    lake.create("trades", BASE)
    engine.run(FLOW, PART)
    before = quarantine(lake)
    again = engine.run(FLOW, PART, force=True)
    assert again.metrics["rows_rejected"] == 3 and again.quarantined == {}
    assert quarantine(lake) == before


def test_incremental_bad_rows_carry_their_commit_version(spark, lake, engine):
    lake.create("trades", BASE[:1])
    engine.run(FLOW, PART)
    lake.append("trades", [("2024-01-01 00:11:00", "a", 9.0, -1), ("2024-01-01 00:12:00", "b", 9.5, 3)])
    lake.append("trades", [(None, "a", 1.0, 1)])
    r = engine.run(FLOW, PART)
    assert r.mode.value == "INCREMENTAL"
    assert r.quarantined == {"positive_qty": 1, "event_time_missing": 1}
    versions = {r["rule"]: r["source_version"] for r in quarantine(lake)}
    assert versions == {"positive_qty": 1, "event_time_missing": 2}
    check_sink(spark, lake, until="2024-01-01 01:00")


def test_crash_after_quarantine_write_does_not_duplicate(spark, lake):
    lake.create("trades", BASE)
    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=crash_at("after_read")).run(FLOW, PART)
    assert len(quarantine(lake)) == 5  # written before the crash
    r = Engine(spark, lake.root).run(FLOW, PART)
    assert r.mode.value == "REFILL" and r.quarantined == {}
    assert len(quarantine(lake)) == 5
    check_sink(spark, lake, until="2024-01-01 01:00")


def test_a_run_reads_only_the_recorded_rows_of_its_own_partitions(spark, lake, engine):
    """Skipping rows recorded already reads the flow's quarantine files whose event times overlap
    the run's partitions (plus a window's size for a flow), not the flow's whole history."""
    lake.create("trades", BASE)
    engine.run(FLOW, PART)
    engine.run(FLOW, NEXT)
    uri = os.path.join(lake.root, "_laminar", "quarantine", "trades")

    def partitions(within):
        _, files = recorded_files(uri, "q", within)
        keys = {r["partition"] for f in files for r in pq.read_table(f.uri.removeprefix("file://"),
                                                                     columns=["partition"]).to_pylist()}
        return sorted(keys, key=lambda k: (k is not None, k or ""))

    assert partitions(None) == [None]  # the sweep's rows (no partition): only files holding them
    assert partitions([partition_interval(PART, FLOW.granularity)]) == [PART]
    assert partitions([partition_interval(NEXT, FLOW.granularity)]) == [NEXT]
    assert recorded_files(uri, "q2", None)[1] == []  # another flow's files are never read
    # and a rerun still records nothing twice through the pruned check
    before = quarantine(lake)
    assert engine.run(FLOW, NEXT, force=True).quarantined == {}
    assert quarantine(lake) == before
    # a changed spec sweeps the whole source again: its partition-less rows are found recorded
    changed = dataclasses.replace(FLOW, aggregates=(*FLOW.aggregates, Agg.min("px")))
    assert changed.spec_hash != FLOW.spec_hash
    assert engine.run(changed, NEXT).quarantined == {}
    assert quarantine(lake) == before


def test_flows_share_a_source_quarantine_table_by_flow(spark, lake, engine):
    other = FlowSpec(name="q2", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                     aggregates=(Agg.count(),), rules=(RowRule("positive_qty", "qty > 0"),))
    lake.create("trades", BASE)
    engine.run(FLOW, PART)
    engine.run(other, PART)
    rows = quarantine(lake)
    assert sorted({r["flow"] for r in rows}) == ["q", "q2"]
    assert {r["rule"] for r in rows if r["flow"] == "q2"} == {"positive_qty", "event_time_missing", "key_missing"}


def test_a_rule_that_does_not_compile_names_flow_rule_and_table(lake, engine):
    bad = FlowSpec(name="b", source="trades", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),),
                   rules=(RowRule("typo", "quantity > 0"),))
    lake.create("trades", BASE[:1])
    with pytest.raises(SpecError) as info:
        engine.run(bad, PART)
    text = str(info.value)
    assert "'typo'" in text and "trades" in text and "version 0" in text and "Py4J" not in text


def test_a_post_column_never_sees_the_groups_of_broken_rows(spark, lake, engine):
    """The pass merges broken rows in groups of their own (its metrics come from the merged rows); a
    post column dividing by an aggregate must not see them: b's only row breaks `qty > 0`, so its
    group's volume is 0 and `hi / volume` would raise DIVIDE_BY_ZERO."""
    flow = FlowSpec(name="d", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.sum("qty", name="volume"), Agg.max("px", name="hi")),
                    post={"per_unit": "hi / volume"}, rules=(RowRule("positive_qty", "qty > 0"),))
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 2), ("2024-01-01 00:02:00", "b", 11.0, 0)])
    r = engine.run(flow, PART)
    assert r.metrics["rows_rejected"] == 1 and r.metrics["rows_read"] == 2
    assert lake.read(flow.sink)[["sym", "volume", "per_unit"]].values.tolist() == [["a", 2, 5.0]]


def test_rule_and_bounds_validation():
    with pytest.raises(SpecError, match="rules\\[0\\].name"):
        FlowSpec(name="x", source="t", event_time="ts", window=Tumbling("1m"), aggregates=(Agg.count(),),
                 rules=(RowRule("key_missing", "a > 0"),))
    with pytest.raises(SpecError, match="event_time_bounds"):
        FlowSpec(name="x", source="t", event_time="ts", window=Tumbling("1m"), aggregates=(Agg.count(),),
                 event_time_bounds=("2030-01-01", "2020-01-01"))
    plain = FlowSpec(name="x", source="t", event_time="ts", window=Tumbling("1m"), aggregates=(Agg.count(),))
    ruled = FlowSpec(name="x", source="t", event_time="ts", window=Tumbling("1m"), aggregates=(Agg.count(),),
                     rules=(RowRule("r", "a > 0"),))
    assert plain.spec_hash != ruled.spec_hash


def test_the_sweep_reads_change_data_only_when_its_footers_allow_a_missing_event_time(spark, lake, engine):
    # Change data files have no statistics in the Delta log; their Parquet footers do. A correction
    # whose rows all have an in-bounds event time costs the sweep no Spark job; one that nulls an
    # event time is still read and its row quarantined.
    from types import SimpleNamespace

    from laminar_assets.engine.run.sweep import sweep
    from tests.engine.test_one_pass import Jobs

    lake.create("trades", [BASE[0], BASE[7]])
    engine.run(FLOW, PART)
    lake.update("trades", {"px": "20.0"}, "sym = 'b'")  # v1: change data, every event time present
    found, jobs = Jobs(spark).count(lambda: sweep(engine.ctx, FLOW, SimpleNamespace(to_versions={"trades": 1}), "r1").counts)
    assert found == {} and jobs == 0
    lake.update("trades", {"ts": "NULL"}, "sym = 'b'")  # v2: a correction that loses the event time
    found, jobs = Jobs(spark).count(lambda: sweep(engine.ctx, FLOW, SimpleNamespace(to_versions={"trades": 2}), "r2").counts)
    assert found == {"event_time_missing": 1} and jobs > 0
    assert [(r["rule"], r["source_version"]) for r in quarantine(lake)] == [("event_time_missing", 2)]


def test_rows_no_offered_partition_holds_are_quarantined_by_the_sweep(spark, lake):
    """A row dated 9999 (after now + future_horizon), one before the flow's `start` and one in year 1
    (before the years partitions can name): no run will ever aggregate them, so the sweep records them
    instead of leaving them unseen; the partition's own rows are aggregated as before."""
    from datetime import UTC, datetime

    import pyarrow as pa
    from deltalake import write_deltalake

    times = [datetime(2024, 1, 1, 0, 1), datetime(9999, 12, 31, 23, 59, 59, 999999), datetime(2023, 12, 31, 23, 59),
             datetime(1, 1, 1)]  # one file: its statistics span from year 1 to the last representable instant
    rows = pa.table({"ts": pa.array([t.replace(tzinfo=UTC) for t in times], pa.timestamp("us", tz="UTC")),
                     "sym": ["a"] * 4, "px": [1.0, 2.0, 3.0, 4.0], "qty": [1, 1, 1, 1]})
    write_deltalake(lake.path("trades"), rows)
    flow = FlowSpec(name="o", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(),), start="2024-01-01")
    result = Engine(spark, lake.root).run(flow, PART)
    assert result.quarantined == {"event_time_outside_partitions": 3}
    assert sorted(json.loads(r["row"])["px"] for r in quarantine(lake)) == [2.0, 3.0, 4.0]
    assert {r["partition"] for r in quarantine(lake)} == {None}
    assert lake.read("o")["count"].tolist() == [1]


def test_a_small_sweep_records_interpreted_a_large_one_compiled_and_both_agree(spark, lake, tmp_path, monkeypatch):
    """The sweep's job over a few kB (below `interpreted_below_bytes`) evaluates expressions without generated
    code, as a small pass does (compiling each query's new code cost the tiny job more than it saved); the
    session's settings are restored after it, and a sweep that compiles records the same rows."""
    import shutil

    from laminar_assets.engine.quarantine import records

    modes = []
    real = records.record

    def record(*args, **kwargs):
        modes.append(spark.conf.get("spark.sql.codegen.factoryMode", None))
        return real(*args, **kwargs)

    monkeypatch.setattr(records, "record", record)
    lake.create("trades", BASE)
    compiled_root = str(tmp_path / "compiled")
    shutil.copytree(lake.path("trades"), os.path.join(compiled_root, "trades"))
    before = spark.conf.get("spark.sql.codegen.factoryMode", None)
    small = Engine(spark, lake.root).run(FLOW, PART)
    assert modes == ["NO_CODEGEN", "NO_CODEGEN"]  # the sweep's, then the pass's rejects
    assert spark.conf.get("spark.sql.codegen.factoryMode", None) == before != "NO_CODEGEN"
    modes.clear()
    large = Engine(spark, compiled_root, options=EngineOptions(interpreted_below_bytes=0)).run(FLOW, PART)
    assert "NO_CODEGEN" not in modes and len(modes) == 2
    assert small.quarantined == large.quarantined == {"positive_qty": 1, "known_sym": 2, "event_time_missing": 1,
                                                      "event_time_out_of_bounds": 1}

    def recorded(root):
        path = os.path.join(root, "_laminar", "quarantine", "trades")
        return sorted((r["flow"], r["rule"], r["partition"], r["source_version"], r["row"], r["event_time"])
                      for r in DeltaTable(path).to_pyarrow_table().to_pylist())

    assert recorded(lake.root) == recorded(compiled_root)


def test_the_driver_and_spark_record_the_same_new_rows_and_nothing_twice(spark, lake):
    """`record` in the driver (pyarrow groups the rejects and skips the recorded ones) and in Spark (a grouped,
    anti-joined query) append the same rows: duplicates within a batch once with their first version and event
    time, a NULL partition matching a NULL one, a row recorded for another partition or flow still new."""
    from laminar_assets.engine.quarantine import records as qr

    def rejects(rows):
        return spark.createDataFrame(rows, f"{qr.PARTITION_KEY} string, {qr.RULE} string, {qr.ROW} string, "
                                           f"{qr.VERSION} long, {qr.EVENT_TS} timestamp")

    from datetime import datetime as dt
    first = [(None, "event_time_missing", '{"id":1}', 3, None), (PART, "positive_qty", '{"id":2}', 4, dt(2024, 1, 1, 0, 5)),
             (PART, "positive_qty", '{"id":2}', 2, dt(2024, 1, 1, 0, 4))]  # the same row twice: once, version 2
    second = [(None, "event_time_missing", '{"id":1}', 5, None),  # recorded (NULL partition): skipped
              (None, "event_time_missing", '{"id":9}', 5, None),  # new
              (PART, "positive_qty", '{"id":2}', 6, dt(2024, 1, 1, 0, 5)),  # recorded: skipped
              (NEXT, "positive_qty", '{"id":2}', 6, dt(2024, 1, 1, 1, 5))]  # another partition: new
    found = {}
    for how, driver in (("driver", True), ("spark", False)):
        uri = os.path.join(lake.root, how)
        counts = [qr.record(spark, rejects(rows), uri=uri, flow="f", run_id=f"r{i}", through_driver=driver)
                  for i, rows in enumerate((first, second, second))]
        assert counts == [{None: {"event_time_missing": 1}, PART: {"positive_qty": 1}},
                          {None: {"event_time_missing": 1}, NEXT: {"positive_qty": 1}}, {}], (how, counts)
        assert qr.record(spark, rejects(first), uri=uri, flow="other", run_id="r3", through_driver=driver) == \
            {None: {"event_time_missing": 1}, PART: {"positive_qty": 1}}  # another flow's record is its own
        found[how] = sorted((r["flow"], r["partition"] or "", r["rule"], r["row"], r["source_version"],
                             str(r["event_time"])) for r in DeltaTable(uri).to_pyarrow_table().to_pylist())
    assert found["driver"] == found["spark"]
    assert ("f", PART, "positive_qty", '{"id":2}', 2, "2024-01-01 00:04:00+00:00") in found["driver"]


def test_clean_commits_move_the_sweep_without_its_lease_and_a_moved_progress_falls_back_to_it(spark, lake, engine,
                                                                                              monkeypatch):
    """Commits whose files' statistics prove every event time present and in bounds hold no row for the sweep:
    its progress moves with one conditional write, no lease taken. When another sweeper moved the progress
    since this process read or wrote it, that write fails and the sweep runs under its lease from where the
    progress now is; a commit with a row to record is swept under the lease and recorded once."""
    from laminar_assets.checkpoints import CheckpointStore

    lake.create("trades", BASE)
    engine.run_many(FLOW, [PART, NEXT])  # the first sweep reads the snapshot, under the lease
    taken = []
    real = engine.ctx.store.lease
    monkeypatch.setattr(engine.ctx.store, "lease", lambda flow, key, run_id: taken.append(key) or real(flow, key, run_id))
    other = CheckpointStore(lake.root)  # another process's store of the same root

    lake.append("trades", [("2024-01-01 00:30:00", "a", 1.0, 1)])  # version 1: clean
    r = engine.run(FLOW, PART)
    assert taken == [] and r.sweep.sources == {"trades": "commits 1..1"} and r.quarantined == {}  # no lease at all
    assert other.load_sweep(FLOW.name, FLOW.spec_hash) == {"trades": 1}

    other.save_sweep(FLOW.name, FLOW.spec_hash, {"trades": 0})  # another sweeper wrote it since (here: behind)
    lake.append("trades", [("2024-01-01 00:31:00", "a", 1.0, 1)])  # version 2: clean
    taken.clear()
    r = engine.run(FLOW, PART)
    assert taken == ["_sweep"] and r.sweep.sources == {"trades": "commits 1..2"}, (taken, r.sweep)
    assert other.load_sweep(FLOW.name, FLOW.spec_hash) == {"trades": 2}

    lake.append("trades", [(None, "a", 2.0, 1), ("2024-01-01 00:32:00", "a", 1.0, 1)])  # version 3: a row to record
    taken.clear()
    r = engine.run(FLOW, PART)
    assert taken == ["_sweep"] and r.quarantined == {"event_time_missing": 1}
    assert sorted(q["source_version"] for q in quarantine(lake) if q["rule"] == "event_time_missing") == [0, 3]
    check_sink(spark, lake)  # the appends touch PART's windows only
