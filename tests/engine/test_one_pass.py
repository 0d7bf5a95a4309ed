"""One Spark pass per flow run: the number of Spark jobs does not grow with the partitions a change
touches, a partition with nothing to do costs no job, files are laid out per partition (or, asked for, per run
of adjacent partitions), and cost-based refills (REFILL_CHEAPER) give the same answer."""

from __future__ import annotations

import shutil

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Mode, Reason, Tumbling
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

FLOW = FlowSpec(name="vw", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("qty"), Agg.avg("px"), Agg.max("px")))
KEYS = [f"2024-01-01-{h:02d}:00" for h in range(6)]


def spread(hours, minute=5, px=10.0, qty=1):
    return [(f"2024-01-01 {h:02d}:{minute:02d}:00", "a", px + h, qty) for h in hours]


class Jobs:
    """Spark jobs run between two markers (job ids are sequential per SparkContext)."""

    def __init__(self, spark) -> None:
        self.sc = spark.sparkContext

    def _last(self) -> int:
        self.sc.setJobGroup("test-marker", "marker", interruptOnCancel=False)
        try:
            self.sc.parallelize([1], 1).count()
            return max(self.sc.statusTracker().getJobIdsForGroup("test-marker"))
        finally:
            self.sc.setLocalProperty("spark.jobGroup.id", None)

    def count(self, fn):
        start = self._last()
        out = fn()
        return out, self._last() - start - 1

    def tasks(self, fn):
        """`fn()` and the task count of every stage its jobs ran, by job (skipped stages: none)."""
        start = self._last()
        out = fn()
        end = self._last()
        tracker = self.sc.statusTracker()
        stages = [tracker.getJobInfo(j).stageIds for j in range(start + 1, end)]
        return out, [[tracker.getStageInfo(s).numTasks for s in ids if tracker.getStageInfo(s).numCompletedTasks]
                     for ids in stages]


def check(spark, lake, flow=FLOW):
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    assert_frames_match(lake.read(flow.sink), expected, flow.keys)


def test_a_flow_run_costs_the_same_few_jobs_however_many_partitions_change(spark, lake, engine):
    lake.create("trades", spread(range(6)))
    jobs = Jobs(spark)
    _, bootstrap = jobs.count(lambda: engine.run_many(FLOW, KEYS))
    lake.append("trades", spread([1], minute=30))
    one, jobs_one = jobs.count(lambda: engine.run_many(FLOW, KEYS))
    lake.append("trades", spread(range(6), minute=40))
    six, jobs_six = jobs.count(lambda: engine.run_many(FLOW, KEYS))
    assert [r.mode for r in one].count(Mode.INCREMENTAL) == 1
    assert {r.mode for r in six} == {Mode.INCREMENTAL}
    assert bootstrap <= 4 and jobs_one <= 4 and jobs_six <= 4, (bootstrap, jobs_one, jobs_six)
    assert jobs_six == jobs_one  # the same jobs for one touched partition and for six
    check(spark, lake)


def test_a_partition_with_nothing_to_do_runs_no_spark_job(spark, lake, engine):
    lake.create("trades", spread(range(3)))
    engine.run_many(FLOW, KEYS[:3])
    results, n = Jobs(spark).count(lambda: engine.run_many(FLOW, KEYS[:3]))
    assert {r.reason for r in results} == {Reason.NO_NEW_VERSIONS} and n == 0
    lake.append("trades", spread([5]))  # another hour: this range has nothing to do
    results, n = Jobs(spark).count(lambda: engine.run_many(FLOW, KEYS[:3]))
    assert {r.reason for r in results} == {Reason.NO_CHANGES_IN_PARTITION} and n == 0


def _files_by_partition(uri: str) -> dict[str, set[str]]:
    """Live files of a table per partition of their window_start statistics (each must hold one)."""
    out: dict[str, set[str]] = {}
    for a in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist():
        lo, hi = a["min.window_start"], a["max.window_start"]
        assert lo.strftime("%Y-%m-%d-%H") == hi.strftime("%Y-%m-%d-%H"), f"{a['path']} spans partitions"
        out.setdefault(lo.strftime("%Y-%m-%d-%H:00"), set()).add(a["path"])
    return out


def test_files_are_laid_out_per_partition_so_a_replace_rewrites_no_other(spark, lake, engine):
    lake.create("trades", spread(range(6)) + spread(range(6), minute=25))
    engine.run_many(FLOW, KEYS)
    state_uri = engine.layout.state_uri(FLOW, engine.store.load(FLOW.name, KEYS[0]).input_schema)
    before = {uri: _files_by_partition(uri) for uri in (state_uri, lake.path(FLOW.sink))}
    assert all(len(files) == 6 for files in before.values())
    lake.append("trades", spread([2], minute=50))
    engine.run_many(FLOW, KEYS)
    for uri, files in before.items():
        after = _files_by_partition(uri)
        assert after["2024-01-01-02:00"] != files["2024-01-01-02:00"]
        assert {k: v for k, v in after.items() if k != "2024-01-01-02:00"} == \
            {k: v for k, v in files.items() if k != "2024-01-01-02:00"}
    check(spark, lake)


def _files_by_hours(uri: str) -> dict[tuple[str, str], str]:
    """Live files of a table by the first and last hour of their window_start statistics -> the file's path."""
    out = {}
    for a in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist():
        span = (a["min.window_start"].strftime("%H"), a["max.window_start"].strftime("%H"))
        assert span not in out, f"two files span hours {span}"
        out[span] = a["path"]
    return out


@pytest.mark.parametrize("carried_by", ["driver", "spark"])
def test_a_batched_pass_writes_one_file_for_adjacent_partitions_and_a_replace_keeps_the_others_rows(
        spark, lake, carried_by):
    """With `partitions_per_file`, a small pass over adjacent partitions writes one state and one sink file for
    them (on an object store a file costs a PUT, and a HEAD and a GET at each later read); a pass over some of
    them writes the rows of the others back, one file per gap between its partitions (by the driver when small,
    else by a Spark job), and rewrites nobody else's file; a pass over a partition no shared file spans rewrites
    nothing else. By default each partition has its own files (`test_files_are_laid_out_per_partition...`)."""
    lake.create("trades", spread(range(6)) + spread(range(6), minute=25))
    engine = Engine(spark, lake.root, options=EngineOptions(partitions_per_file=8))
    engine.run_many(FLOW, KEYS)
    state_uri = engine.layout.state_uri(FLOW, engine.store.load(FLOW.name, KEYS[0]).input_schema)
    uris = (state_uri, lake.path(FLOW.sink))
    assert all(_files_by_hours(uri).keys() == {("00", "05")} for uri in uris)
    narrow = engine if carried_by == "driver" else Engine(spark, lake.root, options=EngineOptions(
        driver_write_below_bytes=0, partitions_per_file=8))
    lake.append("trades", spread([2], minute=50))
    results = narrow.run_many(FLOW, KEYS)
    assert [r.mode for r in results] == [Mode.NOOP] * 2 + [Mode.INCREMENTAL] + [Mode.NOOP] * 3
    check(spark, lake)
    after = {uri: _files_by_hours(uri) for uri in uris}
    assert all(files.keys() == {("00", "01"), ("02", "02"), ("03", "05")} for files in after.values()), after
    lake.append("trades", spread([4], minute=50))
    narrow.run_many(FLOW, KEYS)
    check(spark, lake)
    for uri, before in after.items():
        files = _files_by_hours(uri)
        assert files.keys() == {("00", "01"), ("02", "02"), ("03", "03"), ("04", "04"), ("05", "05")}, files
        assert files[("00", "01")] == before[("00", "01")] and files[("02", "02")] == before[("02", "02")], \
            (before, files)
    kept = {uri: _files_by_hours(uri) for uri in uris}
    lake.append("trades", spread([1], minute=55))  # not adjacent: a file each, the others' files untouched
    lake.append("trades", spread([3], minute=55))  # (one commit's file of both would not prove hour 2 unchanged)
    assert [r.mode for r in narrow.run_many(FLOW, KEYS)] == [Mode.NOOP, Mode.INCREMENTAL, Mode.NOOP,
                                                              Mode.INCREMENTAL, Mode.NOOP, Mode.NOOP]
    check(spark, lake)
    for uri, before in kept.items():
        files = _files_by_hours(uri)
        assert files.keys() == {("00", "00"), ("01", "01"), ("02", "02"), ("03", "03"), ("04", "04"), ("05", "05")}
        assert [files[h] for h in [("02", "02"), ("04", "04"), ("05", "05")]] == \
            [before[h] for h in [("02", "02"), ("04", "04"), ("05", "05")]]


def test_run_is_run_many_of_one_partition(spark, lake, engine, tmp_path):
    from tests.conftest import Lake

    lake.create("trades", spread(range(2)))
    other = Lake(str(tmp_path / "other"))
    other.create("trades", spread(range(2)))
    a = [engine.run(FLOW, k) for k in KEYS[:2]]
    b = Engine(spark, other.root).run_many(FLOW, KEYS[:2])
    assert [(r.mode, r.reason, r.metrics["rows_read"]) for r in a] == [(r.mode, r.reason, r.metrics["rows_read"]) for r in b]
    assert_frames_match(lake.read(FLOW.sink), other.read(FLOW.sink), FLOW.keys)


def test_refill_when_the_change_is_most_of_the_partition(spark, lake):
    hour1 = [(f"2024-01-01 01:{i % 60:02d}:{i % 59:02d}", f"s{i % 7}", 1.0 + i, i) for i in range(3000)]
    lake.create("trades", spread([0]))
    lake.append("trades", hour1)
    engine = Engine(spark, lake.root, options=EngineOptions(refill_ratio=0.5, refill_min_bytes=0))
    engine.run_many(FLOW, KEYS[:2])
    # hour 0 gets far more rows than it had (refilling reads less than merging); hour 1 a tiny share
    lake.append("trades", [(f"2024-01-01 00:{i % 60:02d}:{i % 57:02d}", "b", 2.0 + i, i) for i in range(3000)])
    lake.append("trades", [("2024-01-01 01:59:00", "c", 3.0, 1)])
    first, second = engine.run_many(FLOW, KEYS[:2])
    assert (first.mode, first.reason) == (Mode.REFILL, Reason.REFILL_CHEAPER), first.detail
    assert "bytes" in first.detail and "refill_ratio" in first.detail
    assert (second.mode, second.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY), second.detail
    check(spark, lake)
    # with cost-based refills off, the same kind of change merges, with the same result
    plain = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None))
    lake.append("trades", [(f"2024-01-01 00:{i % 60:02d}:{i % 53:02d}", "e", 4.0, 1) for i in range(6000)])
    assert plain.run(FLOW, KEYS[0]).mode is Mode.INCREMENTAL
    check(spark, lake)


def test_small_partitions_are_never_refilled_for_cost_by_default(spark, lake, engine):
    lake.create("trades", spread([0]))
    engine.run(FLOW, KEYS[0])
    lake.append("trades", spread([0], minute=7) * 50)
    r = engine.run(FLOW, KEYS[0])
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert engine.ctx.options.refill_min_bytes > 1_000_000



def test_small_passes_run_interpreted_large_ones_compile_and_both_agree(spark, lake, tmp_path):
    """Below `interpreted_below_bytes` a pass's jobs evaluate expressions without generated code; the
    session's settings are restored after the pass, and the answers equal the compiled run's."""
    seen = {}

    def hook(step):
        if step == "after_read":
            seen.setdefault("mode", []).append(spark.conf.get("spark.sql.codegen.factoryMode", None))

    lake.create("trades", spread(range(6)))
    lake.append("trades", spread([2, 4], minute=30, px=3.5, qty=2))
    small = Engine(spark, lake.root, hook=hook)  # the default threshold: these files are a few kB
    compiled = Engine(spark, str(tmp_path / "compiled"), hook=hook, options=EngineOptions(interpreted_below_bytes=0))
    shutil.copytree(lake.path("trades"), str(tmp_path / "compiled" / "trades"))
    before = spark.conf.get("spark.sql.codegen.wholeStage", None)
    small.run_many(FLOW, KEYS)
    assert seen.pop("mode") == ["NO_CODEGEN"]
    assert spark.conf.get("spark.sql.codegen.wholeStage", None) == before  # restored
    assert spark.conf.get("spark.sql.codegen.factoryMode", None) != "NO_CODEGEN"
    compiled.run_many(FLOW, KEYS)
    assert seen.pop("mode") != ["NO_CODEGEN"]
    a = small.sink_frames(FLOW, KEYS).toPandas().sort_values(["window_start", "sym"]).reset_index(drop=True)
    b = compiled.sink_frames(FLOW, KEYS).toPandas().sort_values(["window_start", "sym"]).reset_index(drop=True)
    assert len(a) == 8
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12)
    check(spark, lake)


def test_overlapping_interpreted_passes_in_threads_restore_the_session_settings(spark):
    """Concurrent runs share the session: A enters, B enters, A leaves (B still inside: still
    interpreted), B leaves; afterwards the settings are what they were before either came."""
    import threading

    from laminar_assets.engine.spark.frames import interpreted

    key = "spark.sql.codegen.factoryMode"
    before = spark.conf.get(key, None)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with interpreted(spark, True):
            a_in.set()
            b_in.wait(30)
        a_out.set()

    def b():
        a_in.wait(30)
        with interpreted(spark, True):
            b_in.set()
            a_out.wait(30)
            seen["inside_after_a_left"] = spark.conf.get(key, None)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {"inside_after_a_left": "NO_CODEGEN"}
    assert spark.conf.get(key, None) == before != "NO_CODEGEN"


def test_a_large_pass_beside_small_ones_compiles(spark):
    """A run's steps share the session: a large pass entering while a small one runs turns the
    interpreted settings off (and they stay off for it), and when everyone has left the settings are
    what they were before."""
    from laminar_assets.engine.spark.frames import interpreted

    key = "spark.sql.codegen.factoryMode"
    before = spark.conf.get(key, None)
    with interpreted(spark, True):
        assert spark.conf.get(key, None) == "NO_CODEGEN"
        with interpreted(spark, False):
            assert spark.conf.get(key, None) == before
            with interpreted(spark, True):  # another small pass while the large one runs: still compiled
                assert spark.conf.get(key, None) == before
        assert spark.conf.get(key, None) == before  # not switched back under a pass that began compiled
    assert spark.conf.get(key, None) == before != "NO_CODEGEN"
    with interpreted(spark, True):  # and the next small pass alone is interpreted again
        assert spark.conf.get(key, None) == "NO_CODEGEN"
    assert spark.conf.get(key, None) == before


def test_per_partition_metrics_of_a_batched_run_match_single_runs(spark, lake, engine, tmp_path):
    """A batched run's metrics per partition come from one observation (aggregates by slot): each
    partition gets its own numbers, however many partitions share the pass."""
    from tests.conftest import Lake

    rows = [r for h in range(5) for r in spread([h] * (h + 1), minute=5 + h)]  # h+1 rows in hour h
    rows += [(f"2024-01-01 03:{m:02d}:00", "b", 7.0, 2) for m in (11, 12, 31)]  # more windows and keys in hour 3
    lake.create("trades", rows)
    other = Lake(str(tmp_path / "other"))
    other.create("trades", rows)
    single = [engine.run(FLOW, k) for k in KEYS[:5]]
    batched = Engine(spark, other.root).run_many(FLOW, KEYS[:5])
    names = ("rows_read", "partial_groups", "windows_touched", "rows_rejected")
    assert [[r.metrics[n] for n in names] for r in batched] == [[r.metrics[n] for n in names] for r in single]
    assert [r.metrics["rows_read"] for r in batched] == [1, 2, 3, 7, 5]


def test_a_small_pass_runs_in_one_task_and_a_large_one_shuffles_and_both_agree(spark, lake, tmp_path):
    """Below `single_task_below_bytes` a flow pass (partials, old state and merge) is one stage of one
    task; above it the partials combine map-side and shuffle by partition. Same answers."""
    from tests.conftest import Lake

    other = Lake(str(tmp_path / "other"))
    small, large = Engine(spark, lake.root), Engine(spark, other.root, options=EngineOptions(single_task_below_bytes=0))
    jobs = Jobs(spark)
    by_engine = {}
    for engine, where in ((small, lake), (large, other)):
        where.create("trades", spread(range(6)))
        where.append("trades", spread([0], minute=7))  # a second file: the scan has two
        engine.run_many(FLOW, KEYS)
        where.append("trades", spread([1, 4], minute=30, px=3.5, qty=2))
        _, by_engine[engine is small] = jobs.tasks(lambda: engine.run_many(FLOW, KEYS))  # noqa: B023  (called at once)
        check(spark, where)
    assert by_engine[True] == [[1]]  # one job, one stage, one task (state and sink written together)
    assert len(by_engine[False][0]) >= 2, by_engine[False]  # a shuffle: more than one stage
    a = small.sink_frames(FLOW, KEYS).toPandas().sort_values(["window_start", "sym"]).reset_index(drop=True)
    b = large.sink_frames(FLOW, KEYS).toPandas().sort_values(["window_start", "sym"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12)


def test_the_flows_of_a_run_open_their_common_source_once(spark, lake, engine):
    from concurrent.futures import ThreadPoolExecutor

    from laminar_assets.engine.delta import snapshot_cache

    other = FlowSpec(name="vw_max", source="trades", event_time="ts", window=Tumbling("30m"), keys=("sym",),
                     aggregates=(Agg.max("px"), Agg.count()))
    lake.create("trades", spread(range(3)))
    snapshot_cache.clear()
    opened: list[str] = []
    real = snapshot_cache.open_snapshot

    def counting(uri, version, opener):
        return real(uri, version, lambda u, v: opened.append(u) or opener(u, v))

    snapshot_cache.open_snapshot = counting
    try:
        with ThreadPoolExecutor(2) as pool:  # as a Dagster run's steps do
            for done in [pool.submit(engine.run_many, f, KEYS[:3]) for f in (FLOW, other)]:
                assert all(r.mode is Mode.REFILL for r in done.result())
    finally:
        snapshot_cache.open_snapshot = real
    # one open of the source, shared by both runs (whether the second asked while the first was
    # opening it, and waited, or after)
    assert opened.count(lake.path("trades")) == 1
    for f in (FLOW, other):
        check(spark, lake, f)
