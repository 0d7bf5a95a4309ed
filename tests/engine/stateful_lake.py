"""A random stateful test of the engine the way users operate tables (issue #44).

Hypothesis interleaves what users and operators do to a source table (appends, late rows,
duplicates, updates that move event times or null a key, deletes, compaction, vacuum, vacuum
with log clean-up, a new column, a column retyped and then restored, rows with event times
centuries away) with what the scheduler does (`run` and `run_many` over any partitions, some at
other watermarks or brand new, under work bounds, `force`, a kill at any step of a run followed
by more runs, the kill leaving its holds behind as kill -9 does, runs of partitions another live run
holds, in this process or on another machine, refused without writing anything, runs in a new process as the
daemon launches them, knowing nothing an earlier run in this process learned, the pipeline sensor's ticks, a
commit landing while one watches, and the runs of what they plan), on a source
partitioned by a column or not, with change data on or off. After every step:

- every materialized partition of every spec equals a recompute, by pandas and without the
  engine, of its input at the versions its watermark names (flows on the stage: the stage
  table at that version);
- every Delta table in the lake names only files that exist, and no table Laminar writes holds
  uncommitted files that no commit took (beyond those a kill left behind, which VACUUM reclaims);
- no quarantine row is recorded twice;
- no table is written by another flow than its own: every commit of a spec's tables names that
  spec, and no commit of the source names any.

At the end, running every partition again and again brings each to the latest versions within
a bounded number of runs (a failure that repeats on every run is a bug): every spec the history ran
(or killed mid-run) and the specs it reads, or every spec when the history ran none. A spec the
history never ran would only get a first run there, which a `run` step tests at any point of a
history (two shards, alternating runs: 3-13 % fewer CPU seconds). Most histories run no spec at all
(Hypothesis leaves some rules out of each history): their teardown still runs every spec. Before that, in a
history with a sensor tick, ticks of a sensor without a cursor (a new Dagster instance on the lake) and their runs
stop asking within a bounded number, and leave every partition equal to a recompute at the latest versions.

The reference keeps the source's content at every version as read right after the commit,
because vacuum makes older versions unreadable later.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace

import pandas as pd
import pyarrow as pa
from deltalake import write_deltalake
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore, Holder, Watermark
from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Hopping, Mode, RowRule, StageSpec, Tumbling
from laminar_assets.engine.delta import is_delta_table, open_delta
from laminar_assets.engine.executor import STEPS
from laminar_assets.engine.sql.views import compile_sql
from laminar_assets.errors import ConcurrentRunError, InjectedCrash, RunFailedError, SchemaMismatchError, SourceNotFoundError
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.pipeline.tick import Cursor, plan_tick, watch_for_commits
from tests.engine.new_process import as_a_new_process, on_a_new_machine
from tests.engine.stateful_exports import PARTITIONS, ExportRules, export_plans
from tests.lake_invariants import LakeView, assert_lake_intact, laminar_tables, latest_frame, orphan_files, writers
from tests.reference import assert_frames_match

DAY = pd.Timestamp("2024-01-01", tz="UTC")
VENUES = ("XNYS", "XNAS", "XLON")

SYM_10M = FlowSpec(name="sym_10m", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                   aggregates=(Agg.count(), Agg.sum("px"), Agg.max("px"), Agg.last("px")))  # extremes: retract
                   # while a row holding the extreme is left (prices repeat: ties), else the window refills
ACCOUNT_HOP = FlowSpec(name="account_hop", source="trades", event_time="ts", window=Hopping("20m", "10m"),
                       keys=("account",), aggregates=(Agg.count(), Agg.sum("qty"), Agg.avg("px")))
CLEAN = StageSpec(name="clean", source="trades", event_time="ts", dedup_key=("id",),
                  rules=(RowRule("positive_px", "px > 0"),))
VENUE_15M = FlowSpec(name="venue_15m", source="clean", event_time="ts", window=Tumbling("15m"), keys=("venue",),
                     aggregates=(Agg.count(), Agg.sum("px"), Agg.min("qty"), Agg.count_distinct("qty")))
                     # COUNT(DISTINCT) cannot retract: changes refill the groups (or windows) they touch
[VENUE_SQL] = compile_sql("""
    CREATE MATERIALIZED VIEW venue_sql AS
    SELECT venue, TUMBLE(ts, INTERVAL '30' MINUTE), COUNT(*) AS n, SUM(qty) AS q
    FROM trades WHERE qty > 1
    GROUP BY venue, TUMBLE(ts, INTERVAL '30' MINUTE)""", origin="stateful_lake")
SPECS = {s.name: s for s in (CLEAN, SYM_10M, ACCOUNT_HOP, VENUE_15M, VENUE_SQL)}  # in graph order

# Event times: minutes after 2024-01-01 00:00 (a few before it: hopping windows reach back), or none.
minute = st.one_of(st.integers(-15, 179), st.integers(0, 179), st.just(None))
price = st.sampled_from([-1.0, 0.0, 0.25, 1.5, 2.75, 10.0, 99.5])  # quarters: float sums stay exact
new_row = st.tuples(minute, st.sampled_from(["a", "b", "c"]), st.sampled_from(VENUES),
                    st.sampled_from(["acc1", "acc2", None]), price, st.integers(0, 4))
# the sensor's tick: partitions from the day before the rows (hopping windows reach back) to an hour past them
TICK_SETTINGS = LaminarSettings(partitions_start="2023-12-31", future_horizon="1h")
TICK_NOW = DAY.to_pydatetime() + pd.Timedelta(hours=3).to_pytimedelta()
partition_sets = st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=3, unique=True)
ids_where = st.tuples(st.integers(2, 4), st.integers(0, 3))  # rows with id % m == r
# event times far from every partition: before any start, near the year 10000, past the future horizon
far_times = st.sampled_from(["1900-01-01T00:00:00", "9999-12-31T23:59:59.999999", "2999-06-30T12:00:00"])
# what a kill -9 leaves of a lease: a dead pid, a pid reused by a live process started later, no pid
# at all (expired by its age), or nothing (the lease was released before the kill)
left_leases = st.sampled_from(["released", "released", "dead_pid", "reused_pid", "no_pid"])
READS_PX = {"sym_10m", "account_hop", "clean"}  # of `trades` (venue_15m reads the stage, venue_sql qty only)
bounds = st.sampled_from([{}, {}, {"max_versions_per_run": 1}, {"max_versions_per_run": 2}, {"max_rows_per_run": 4}])
# tiny passes (one task, interpreted, through the driver) mostly; now and then the large-pass path
# (and with it, groups refilled alone wherever they can be: merge first, then recompute the groups
# that lost an extreme; the changed groups, and a stage's changed keys, alone however many there
# are and however small the output; extremes' holders counted as a lower bound, as large passes do)
GROUPS_ALONE = dict(extreme_refill="merge", group_refill_share=1e9, key_refill_min_bytes=0)
LARGE_PASS_PATH = EngineOptions(refill_ratio=None, single_task_below_bytes=0, interpreted_below_bytes=0,
                                driver_write_below_bytes=0, count_tied_extremes_below_bytes=0, **GROUPS_ALONE)
options = st.sampled_from([EngineOptions(refill_ratio=None)] * 3 + [EngineOptions(refill_ratio=None, **GROUPS_ALONE),
                          EngineOptions(refill_ratio=None, count_tied_extremes_below_bytes=0, **GROUPS_ALONE),
                          EngineOptions(refill_ratio=1e-6, refill_min_bytes=0), LARGE_PASS_PATH])
spec_sets = st.sampled_from([("sym_10m", "account_hop"), ("clean", "venue_15m"), ("sym_10m", "venue_sql"),
                             ("clean", "venue_15m", "account_hop"), ("account_hop",), ("clean", "sym_10m")])


def _write(uri: str, data, **options) -> None:
    write_deltalake(uri, data, storage_options=storage.delta_options(uri), **options)


def _frame(rows, with_note: bool) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["id", "ts", "sym", "venue", "account", "px", "qty", "note"][:7 + with_note])
    df["id"] = df["id"].astype("int64")
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    for c in ("sym", "venue", "account", *(("note",) if with_note else ())):
        df[c] = df[c].astype("string")
    df["px"] = df["px"].astype("float64")
    df["qty"] = df["qty"].astype("int64")
    return df


class LakeMachine(ExportRules, RuleBasedStateMachine):
    """One lake: a `trades` source, some specs over it, an engine, exports of some specs when the test gives
    the machine a Postgres and a Redis server; see the module docstring and tests/engine/stateful_exports.py."""

    spark = None  # set by the test module (the session's SparkSession)
    s3 = None  # a tests.object_store.S3Server the lake lives on (None: a local folder)

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="laminar-stateful-")
        # a lake on the local S3 server when the test sets one (`s3`), else in a local folder
        self.root = self.s3.bucket() if self.s3 is not None else os.path.join(self.folder, "lake")
        self.source = storage.join(self.root, "trades")
        self.next_id = 1
        self.snapshots: dict[int, pd.DataFrame] = {}  # the source's rows at each version
        self.allowed_orphans: set[str] = set()  # uncommitted files a kill left behind
        self.with_note = False
        self.ran: set[str] = set()  # the specs a step ran or killed mid-run (`_spec`)
        self.tick_cursor = Cursor()  # the pipeline sensor's (`sensor_tick`)
        self.ticked = False  # the teardown then checks the sensor's catch-up too

    # --- set-up -----------------------------------------------------------------
    @initialize(names=spec_sets, bound=bounds, partitioned=st.booleans(), cdf=st.booleans(), opts=options,
                first=st.lists(new_row, min_size=1, max_size=6), plans=export_plans)
    def create(self, names, bound, partitioned, cdf, opts, first, plans):
        self._create(names, bound, partitioned, cdf, opts, first, plans)

    def _create(self, names, bound, partitioned, cdf, opts, first, plans=()):
        self.specs = [replace(SPECS[n], **bound) for n in SPECS if n in names]
        self.engine = Engine(self.spark, self.root, options=opts)
        self._create_exports(plans)
        config = {"delta.enableChangeDataFeed": str(cdf).lower(), "delta.logRetentionDuration": "interval 0 seconds"}
        _write(self.source, self._rows(first), partition_by=["venue"] if partitioned else None,
                        configuration=config)
        self._record()

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is None and hasattr(self, "engine"):
                self._deliver_exports()  # from wherever the history left them: then again after the runs below
                if self.ticked:
                    self._sensor_catches_up()
                self._catch_up()
                self._catch_up_exports()
        finally:
            try:
                self._drop_exports()
            finally:
                shutil.rmtree(self.folder, ignore_errors=True)

    # --- what users and operators do to the source --------------------------------
    @rule(rows=st.lists(new_row, min_size=1, max_size=6))
    def append(self, rows):
        _write(self.source, self._rows(rows), mode="append", schema_mode="merge" if self.with_note else None)
        self._record()

    @rule(picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=3))
    def duplicate(self, picks):
        """Rows appended again exactly as they are (a producer's retry)."""
        current = self.snapshots[max(self.snapshots)]
        if len(current) == 0:
            return
        copies = current.iloc[[p % len(current) for p in picks]]
        _write(self.source, copies.reset_index(drop=True), mode="append")
        self._record()

    @rule(where=ids_where, change=st.sampled_from(["correct_price", "move_time", "null_key"]))
    def update(self, where, change):
        updates = {"correct_price": {"px": "px + 0.5"}, "move_time": {"ts": "ts - INTERVAL 20 MINUTES"},
                   "null_key": {"account": "NULL"}}[change]
        open_delta(self.source).update(updates=updates, predicate=f"id % {where[0]} = {where[1]}")
        self._record()

    @rule(where=ids_where)
    def delete(self, where):
        open_delta(self.source).delete(f"id % {where[0]} = {where[1]}")
        self._record()

    @rule()
    def compact(self):
        open_delta(self.source).optimize.compact()
        self._record()

    @rule(clean_log=st.booleans())
    def vacuum(self, clean_log):
        dt = open_delta(self.source)
        if clean_log:  # a checkpoint, then the log before it goes (retention 0)
            dt.create_checkpoint()
            dt.cleanup_metadata()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        self._record()

    @precondition(lambda self: not self.with_note)
    @rule(rows=st.lists(new_row, min_size=1, max_size=3))
    def add_column(self, rows):
        self.with_note = True
        _write(self.source, self._rows(rows), mode="append", schema_mode="merge")
        self._record()

    @rule(data=st.data(), rows=st.lists(new_row, min_size=1, max_size=3))
    def retype_then_restore(self, data, rows):
        """A producer rewrites the table with `px` as text, appends under that type, then rewrites it
        with `px` a double again. Meanwhile a run of a spec reading `px` is refused before it writes,
        and one not reading it goes on; afterwards every spec heals within the next runs (the commits
        it cannot read with today's schema are refilled over: SCHEMA_CHANGED_HISTORY), never fails
        for good."""
        current = open_delta(self.source).to_pandas()
        self._overwrite(current.assign(px=current["px"].astype("string")))
        spec = self._spec(data)
        try:
            with self._unless_missing(spec):
                self.engine.run_many(spec, list(PARTITIONS))
        except SchemaMismatchError as exc:  # refused before reading: the spec read px as a double before
            assert spec.name in READS_PX and "px" in str(exc), exc
            assert spec.name != "clean" or self._read_px_as_number(spec), exc  # (flows: the aggregate's check)
        except RunFailedError as exc:  # no partition read px before: nothing to compare with, Spark's cast fails
            assert spec.name in READS_PX and not self._read_px_as_number(spec) and "px" in str(exc), exc
        else:  # a spec that never read px may run over text when no value it reads needs a cast
            assert spec.name not in READS_PX or not self._exists(spec) or not self._read_px_as_number(spec), \
                f"{spec.name} ran over a text px"
        added = self._rows(rows)
        _write(self.source, added.assign(px=added["px"].astype("string")), mode="append",
               schema_mode="merge" if self.with_note else None)
        self._record()
        current = open_delta(self.source).to_pandas()
        self._overwrite(current.assign(px=current["px"].astype("float64")))

    @rule(when=far_times, count=st.integers(1, 2))
    def far_away_rows(self, when, count):
        """Rows whose event time no partition holds (a clock off by centuries): quarantined by a
        sweep or ignored, never a run that lists a million partitions or overflows."""
        rows = self._rows([(0, "a", "XNYS", "acc1", 1.5, 1)] * count)
        rows["ts"] = pd.Series(pd.array([when] * count, dtype="datetime64[us]")).dt.tz_localize("UTC")
        _write(self.source, rows, mode="append", schema_mode="merge" if self.with_note else None)
        self._record()

    # --- what the scheduler does ----------------------------------------------------
    @rule(data=st.data(), keys=partition_sets, together=st.booleans(), force=st.sampled_from([False] * 7 + [True]))
    def run(self, data, keys, together, force):
        """Runs by hand, one partition at a time, or the pipeline sensor's run of some partitions together;
        then the spec's exports deliver (in the sensor's run, after the spec; after a run by hand, in the
        export's own run the sensor starts for an export left behind)."""
        spec = self._spec(data)
        with self._unless_missing(spec):
            if together:
                self.engine.run_many(spec, keys, force=force)
            else:
                for k in keys:
                    self.engine.run(spec, k, force=force)
        self._deliver_exports_of(data, spec)

    @rule(data=st.data(), keys=partition_sets)
    def run_in_a_new_process(self, data, keys):
        """The sensor's run as the daemon launches it, in a new process: nothing this process learned of the lake
        is known to it (snapshots, app transactions, the flows it ran, the watermarks it read): the NOOP check
        answers from the watermarks' tags, sources are opened at their checkpoint."""
        spec = self._spec(data)
        as_a_new_process()
        with self._unless_missing(spec):
            Engine(self.spark, self.root, options=self.engine.ctx.options).run_many(spec, keys)
        self._deliver_exports_of(data, spec)

    @rule(data=st.data(), keys=partition_sets)
    def run_on_another_machine(self, data, keys):
        """The sensor's run in a new process on a machine that keeps no copies of the lake's log files
        (`storage.copies`): another machine, or the cache folder deleted by an operator. Later runs keep their
        copies in the new folder; those of the old one are never seen again."""
        spec = self._spec(data)
        on_a_new_machine()
        with self._unless_missing(spec):
            Engine(self.spark, self.root, options=self.engine.ctx.options).run_many(spec, keys)
        self._deliver_exports_of(data, spec)

    @rule(data=st.data(), during=st.sampled_from([None, None, "append", "delete"]))
    def sensor_tick(self, data, during):
        """The pipeline sensor's tick as the daemon runs it: it watches the source while nothing is new (a user's
        commit may land meanwhile: `watch_for_commits`), plans every spec's dirty partitions from its cursor
        (`plan_tick`), and its one run materializes them in graph order."""
        def user(_seconds):  # the watch's first look found nothing: the commit lands while it waits
            if during == "append":
                self.append(data.draw(st.lists(new_row, min_size=1, max_size=3)))
            elif during == "delete":
                self.delete(data.draw(ids_where))

        watch_for_commits(self.root, self._part().external, self.tick_cursor.versions, seconds=0.1,
                          poll_seconds=0.1, sleep=user, clock=iter([0.0, 0.0, 0.1, 0.1]).__next__)
        self.tick_cursor = self._tick(self.tick_cursor)
        self.ticked = True

    def _part(self):
        [part] = components(self.specs)  # every spec reads `trades` or the stage on it: one part
        return part

    def _tick(self, cursor: Cursor) -> Cursor:
        """One tick's plan from `cursor` and its run (in graph order; a refused flow as `run` refuses it); the
        next cursor."""
        plan = plan_tick(self._part(), self.root, self.engine.store, cursor, lambda *_: set(), set(), TICK_SETTINGS,
                         TICK_NOW)
        for spec in self.specs:
            if plan.dirty.get(spec.name):
                self.ran.add(spec.name)
                with self._unless_missing(spec):
                    self.engine.run_many(spec, list(plan.dirty[spec.name]))
        return plan.cursor

    def _sensor_catches_up(self) -> None:
        """Liveness of the sensor: ticks of a sensor without a cursor (a new Dagster instance on this lake) bring
        every partition up to date within a bounded number of ticks and then ask for nothing, and every partition
        they left alone equals a recompute at the inputs' latest versions: no change was missed."""
        for _ in range(3 + len(self.snapshots)):
            plan = plan_tick(self._part(), self.root, self.engine.store, Cursor(), lambda *_: set(), set(),
                             TICK_SETTINGS, TICK_NOW)
            if not any(plan.dirty.values()):
                break
            self._tick(Cursor())
        else:
            raise AssertionError(f"the sensor still asks for {dict(plan.dirty)} after {3 + len(self.snapshots)} ticks")
        for spec in self.specs:
            if not is_delta_table(storage.join(self.root, spec.sink)):
                continue
            latest = {s: open_delta(storage.join(self.root, s)).version() for s in spec.sources}
            sink = latest_frame(storage.join(self.root, spec.sink))
            for key in PARTITIONS:
                mark = self.engine.store.load(spec.name, key)
                if mark is None or not mark.committed or mark.pending is not None:
                    continue
                self._assert_recomputed(spec, key, latest, sink, f"{spec.name} {key}, at {mark.source_versions} where "
                                        f"the sources are at {latest}, differs from a recompute at those and the "
                                        "sensor asks for nothing")

    @rule(data=st.data(), keys=partition_sets, step=st.sampled_from(STEPS), lease=left_leases)
    def kill(self, data, keys, step, lease):
        """A run killed at `step` (nothing more is written, as with kill -9); later runs recover. A
        real kill also leaves the run's leases behind: held by a pid that is gone, by a pid another
        process has since, or by no pid; the next runs take them over."""
        spec = self._spec(data)

        def hook(current):
            if current == step:
                raise InjectedCrash(f"killed at {step}")

        try:
            with self._unless_missing(spec):
                Engine(self.spark, self.root, hook=hook, options=self.engine.ctx.options).run_many(spec, keys)
        except InjectedCrash:
            self.allowed_orphans |= self._orphans()
            if lease != "released":
                self._leave_leases(spec, keys, lease)

    @rule(data=st.data(), held=partition_sets, also=partition_sets, where=st.sampled_from(["this_host", "another_host"]))
    def run_while_another_run_holds(self, data, held, also, where):
        """Another run is live on some partitions (in this process, or on another machine, whose lease only
        its age ends) while the scheduler runs them, alone or with others: the run is refused with
        `ConcurrentRunError` naming a held partition and writes nothing (no watermark, no commit, no lease
        left behind), or it finds nothing new and answers NOOP without a lease. The other run then ends."""
        spec = self._spec(data)
        keys = list(dict.fromkeys(held + also))
        store = CheckpointStore(self.root)
        with self._live_leases(store, spec, held, where):
            # what the refused run must leave as it was: every watermark (holders included) and table version
            before = self._written(spec, keys)
            try:
                with self._unless_missing(spec):
                    results = self.engine.run_many(spec, keys)
                    assert all(r.mode is Mode.NOOP for r in results), [(r.plan.partition, r.mode) for r in results]
            except ConcurrentRunError as exc:
                assert exc.facts["partition"] in held, exc
            assert self._written(spec, keys) == before, f"a run of {keys} wrote while {held} were held"

    # --- invariants -------------------------------------------------------------------
    @invariant()
    def the_lake_keeps_every_invariant(self):
        """The checks that read the lake's tables, from one listing of it (`LakeView`): on a bucket each
        check listing the folders it looks at again was most of a step's requests."""
        if not hasattr(self, "engine"):
            return
        view = LakeView(self.root)
        self.every_partition_equals_a_recompute_at_its_watermark(view)
        self.every_file_a_table_names_exists(view)
        self.no_run_leaves_uncommitted_files_behind(view)
        self.no_table_is_written_by_another_flow(view)
        self.no_quarantine_row_is_recorded_twice(view)

    def every_partition_equals_a_recompute_at_its_watermark(self, view: LakeView | None = None):
        for spec in self.specs:
            sink = None  # read once per spec, when a partition is to be compared
            for key in PARTITIONS:
                mark = self.engine.store.load(spec.name, key)
                if mark is None or not mark.committed or mark.pending is not None:
                    continue  # nothing materialized, or a killed run's intent the next run settles
                if sink is None:
                    sink = latest_frame(storage.join(self.root, spec.sink), view)
                self._assert_recomputed(spec, key, mark.source_versions, sink, f"{spec.name} {key} at "
                                        f"{mark.source_versions} ({mark.last_mode} {mark.last_reason}) differs "
                                        "from a recompute")

    def _assert_recomputed(self, spec, key: str, versions: dict[str, int], sink: pd.DataFrame, what: str) -> None:
        """Partition `key` of `sink` equals a recompute from the inputs at `versions`; else `what`, and why."""
        actual, expected = self._partition(spec, key, versions, sink)
        try:
            if isinstance(spec, StageSpec):
                pd.testing.assert_frame_equal(actual, expected, check_dtype=False)
            else:
                assert_frames_match(actual, expected, spec.keys)
        except AssertionError as exc:
            raise AssertionError(f"{what}: {exc}") from None

    def every_file_a_table_names_exists(self, view: LakeView | None = None):
        assert_lake_intact(self.root, view)

    def no_run_leaves_uncommitted_files_behind(self, view: LakeView | None = None):
        left = self._orphans(view) - self.allowed_orphans
        assert not left, f"uncommitted files no commit took: {sorted(left)}"

    def no_quarantine_row_is_recorded_twice(self, view: LakeView):
        path = storage.join(self.root, "_laminar", "quarantine", "trades")
        if view.newest_commit(path) is not None:
            rows = latest_frame(path, view)[["flow", "partition", "rule", "row"]]
            twice = rows[rows.duplicated(keep=False)]
            assert twice.empty, f"quarantine rows recorded twice:\n{twice}"

    def no_table_is_written_by_another_flow(self, view: LakeView | None = None):
        written = writers(self.source, view)
        assert not any(written), f"the source was written by {sorted({w for w in written if w})}"
        for spec in self.specs:
            for uri in self._tables_of(spec, view):
                others = writers(uri, view) - {spec.name}
                assert not others, f"{uri} ({spec.name}'s) was written by {sorted(map(str, others))}"

    # --- helpers ------------------------------------------------------------------------
    def _spec(self, data):
        """A spec the step runs (drawn by Hypothesis): from now on the teardown catches it up."""
        name = data.draw(st.sampled_from([s.name for s in self.specs]))
        self.ran.add(name)
        return next(s for s in self.specs if s.name == name)

    def _to_catch_up(self) -> list:
        """The specs the teardown runs to the latest versions, in graph order: those the history ran and
        the specs they read (a flow on the stage needs the stage's latest), or all when it ran none."""
        wanted = set(self.ran) or {s.name for s in self.specs}
        for spec in reversed(self.specs):  # graph order: a reader comes after what it reads
            if spec.name in wanted:
                wanted |= {s for s in spec.sources if s in SPECS}
        return [s for s in self.specs if s.name in wanted]

    @contextmanager
    def _unless_missing(self, spec):
        """A flow on the stage before the stage's first run fails with an error naming the table. A flow on the
        stage while the stage's table holds `px` as text (the stage's first run read the source's text `px`, and
        it has not run since the source was restored) is refused, naming the column, before it writes."""
        missing = [s for s in spec.sources if not is_delta_table(storage.join(self.root, s))]
        if not missing:
            try:
                yield
            except SchemaMismatchError as exc:
                if not self._stage_px_is_text(spec):
                    raise  # a spec reading the source's text `px`: the step's own expectations
                assert "px" in str(exc), exc
            return
        try:
            yield
        except SourceNotFoundError as exc:
            assert exc.facts["table"] == missing[0], exc
        else:
            raise AssertionError(f"{spec.name} ran although its source {missing} does not exist")

    def _stage_px_is_text(self, spec) -> bool:
        """Whether `spec` reads a stage whose table's latest schema holds `px` as text."""
        for src in spec.sources:
            if src in SPECS and is_delta_table(storage.join(self.root, src)):
                field = pa.schema(open_delta(storage.join(self.root, src)).schema().to_arrow()).field("px")
                if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
                    return True
        return False

    def _read_px_as_number(self, spec) -> bool:
        """Whether a partition's watermark (as the last run left it, settled) names a version of the
        source at which `px` was a number."""
        marks = [self.engine.store.load(spec.name, k) for k in PARTITIONS]
        return any(pd.api.types.is_float_dtype(self.snapshots[m.source_versions["trades"]]["px"])
                   for m in marks if m is not None and m.committed and "trades" in m.source_versions)

    def _exists(self, spec) -> bool:
        return all(is_delta_table(storage.join(self.root, s)) for s in spec.sources)

    def _tables_of(self, spec, view: LakeView | None = None) -> list[str]:
        """The Delta tables Laminar writes for `spec` that exist: its sink, and a flow's state tables."""
        state = storage.join(self.root, "_laminar", "state", spec.name)
        if view is not None:  # folders holding a commit
            names = {n.split("/", 1)[0] for n, _ in view.names(state) if "/_delta_log/" in n and n.endswith(".json")}
            uris = [storage.join(state, n) for n in sorted(names)]
            return [u for u in [storage.join(self.root, spec.sink)] if view.newest_commit(u) is not None] + uris
        uris = [storage.join(self.root, spec.sink)] + [storage.join(state, n) for n in storage.list_dirs(state)]
        return [u for u in uris if is_delta_table(u)]

    def _overwrite(self, rows: pd.DataFrame) -> None:
        """The whole table rewritten with `rows` and their schema (a producer changing a column's type)."""
        partitioned = open_delta(self.source).metadata().partition_columns
        _write(self.source, rows.reset_index(drop=True), mode="overwrite", schema_mode="overwrite",
               partition_by=partitioned or None)
        self._record()

    def _leave_leases(self, spec, keys, how: str) -> None:
        """What a kill -9 leaves of the killed run's holds: each watermark it claimed names it as holder (its
        intent written, the watermark not yet), as a process the next run must find gone. The simulated kill
        left this process's run, which this process knows ended; rewritten here as another process's."""
        store = CheckpointStore(self.root)
        holder = Holder(run_id="killed", host=socket.gethostname(), started=time.time())
        if how == "dead_pid":
            gone = subprocess.Popen(["true"])
            gone.wait()
            holder = replace(holder, pid=gone.pid, process_started="0:0")
        elif how == "reused_pid":  # a live pid, but the process holding it started at another time
            holder = replace(holder, pid=os.getpid(), process_started="another-boot:1")
        else:  # no pid: only its age says the holder is gone
            holder = replace(holder, started=time.time() - store.lease_seconds - 60)
        for key in keys:
            mark = store.load(spec.name, key)
            if mark is not None and mark.holder is not None:
                store.save(mark.with_(holder=replace(holder, run_id=mark.holder.run_id)))

    @contextmanager
    def _live_leases(self, store: CheckpointStore, spec, keys, where: str):
        """`keys` held by a live run: one of this process (as a run in another thread holds them), or one of
        another machine (its pid means nothing here), named in their watermarks; as they were afterwards."""
        me = store.holder("live-run")
        holder = me if where == "this_host" else Holder(run_id="live-run", host="another-host", started=time.time(),
                                                        pid=1)
        before = {key: store.load(spec.name, key) for key in keys}
        for key, mark in before.items():  # over a hold a kill left: the live run took it over
            store.save((mark or Watermark(spec.name, key, spec.spec_hash, {}, 0)).with_(holder=holder))
        try:
            yield
        finally:
            for key, mark in before.items():
                if mark is None:
                    store.forget(spec.name, key)
                else:
                    store.save(mark)

    def _written(self, spec, keys) -> tuple:
        """What a run of `keys` writes: their watermarks and the versions of the spec's tables."""
        store = CheckpointStore(self.root)
        return ({k: store.load(spec.name, k) for k in keys},
                {uri: open_delta(uri).version() for uri in self._tables_of(spec)})

    def _rows(self, rows) -> pd.DataFrame:
        out = []
        for m, sym, venue, account, px, qty in rows:
            ts = None if m is None else DAY + pd.Timedelta(minutes=m)
            out.append((self.next_id, ts, sym, venue, account, px, qty, *((f"n{self.next_id}",) if self.with_note else ())))
            self.next_id += 1
        return _frame(out, self.with_note)

    def _record(self) -> None:
        """Keep the source's rows at every version up to the latest (an operation may commit more
        than one version, e.g. VACUUM START and END; their rows are the latest's)."""
        dt = open_delta(self.source)
        rows = dt.to_pandas()
        for v in range(max(self.snapshots, default=-1) + 1, dt.version() + 1):
            self.snapshots[v] = rows

    def _orphans(self, view: LakeView | None = None) -> set[str]:
        sinks = [s.sink for s in self.specs]
        return {f for t in laminar_tables(self.root, sinks, view) for f in orphan_files(t, view)}

    def _partition(self, spec, key: str, versions: dict[str, int],
                   sink: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The rows of one partition in `sink` (the spec's sink, read by the caller), and a pandas
        recompute of them from the inputs at `versions`."""
        start = pd.Timestamp(key[:10] + " " + key[11:], tz="UTC")
        end = start + pd.Timedelta(hours=1)
        if isinstance(spec, StageSpec):
            ts = pd.to_datetime(sink["ts"], utc=True)
            actual = sink[(ts >= start) & (ts < end)]
            expected = _clean(self.snapshots[versions["trades"]])
            expected = expected[(expected["ts"] >= start) & (expected["ts"] < end)]
            cols = sorted(c for c in expected.columns)
            # a column the source gained after the output's last write: the output reads it as NULL
            actual = actual.assign(**{c: pd.Series([pd.NA] * len(actual), index=actual.index, dtype=expected[c].dtype)
                                      for c in cols if c not in actual.columns})
            return (actual[cols].sort_values("id").reset_index(drop=True),
                    expected[cols].sort_values("id").reset_index(drop=True))
        ws = pd.to_datetime(sink["window_start"], utc=True) if len(sink) else pd.Series([], dtype="datetime64[us, UTC]")
        actual = sink[(ws >= start) & (ws < end)].reset_index(drop=True)
        if spec.name == "venue_15m":
            rows = open_delta(storage.join(self.root, "clean"), version=versions["clean"]).to_pandas()
        else:
            rows = self.snapshots[versions["trades"]]
        expected = REFERENCES[spec.name](rows)
        if len(expected):
            expected = expected[(expected["window_start"] >= start) & (expected["window_start"] < end)]
        return actual, expected.reset_index(drop=True)

    def _catch_up(self) -> None:
        """Liveness: every partition of every spec to catch up (`_to_catch_up`) reaches the latest
        versions of its inputs within a bounded number of runs, then equals a recompute."""
        runs = 3 + len(self.snapshots)  # a work bound still takes at least one version per run
        self.caught_up = self._to_catch_up()
        for spec in self.caught_up:  # in graph order: the stage first
            latest = {s: open_delta(storage.join(self.root, s)).version() for s in spec.sources}
            for _ in range(runs):
                self.engine.run_many(spec, list(PARTITIONS))
                marks = [self.engine.store.load(spec.name, k) for k in PARTITIONS]
                if all(m.committed and m.pending is None and m.source_versions == latest for m in marks):
                    break
            else:
                behind = {k: m.source_versions for k, m in zip(PARTITIONS, marks)}
                raise AssertionError(f"{spec.name} is still behind {latest} after {runs} runs: {behind}")
        self.every_partition_equals_a_recompute_at_its_watermark()
        self.no_run_leaves_uncommitted_files_behind()


class StageLakeMachine(LakeMachine):
    """The lake with the stage and a flow on it, where the stage recomputes the keys a delete or
    update touches wherever it can (any share of keys, any output size), and a rule that corrects
    rows of a stage that is up to date, so key refills meet every other step: bounds, kills,
    vacuum, compaction, moved rows, duplicates and partitions at other watermarks."""

    @initialize(names=st.sampled_from([("clean",), ("clean", "venue_15m")]), bound=bounds, partitioned=st.booleans(),
                large=st.booleans(), first=st.lists(new_row, min_size=1, max_size=6), plans=export_plans)
    def create(self, names, bound, partitioned, large, first, plans):
        opts = LARGE_PASS_PATH if large else EngineOptions(refill_ratio=None, **GROUPS_ALONE)
        # change data on: without it an update is a rewrite, which recomputes the partition
        self._create(names, bound, partitioned, True, opts, first, plans)

    @rule(changes=st.lists(st.tuples(ids_where, st.sampled_from(["correct_price", "move_time", "null_key", "delete"])),
                           min_size=1, max_size=3), together=st.booleans(), data=st.data())
    def correct_then_run_the_stage(self, changes, together, data):
        """Rows of an up-to-date stage corrected one change at a time, each followed by a run of the stage (its keys
        refilled) and its exports' deliveries, as the pipeline sensor's run delivers them after the stage."""
        stage = next(s for s in self.specs if isinstance(s, StageSpec))
        self.ran.add(stage.name)
        with self._unless_missing(stage):
            self.engine.run_many(stage, list(PARTITIONS))  # watermarks first: the correction is then a run's only change
        for where, change in changes:
            if change == "delete":
                self.delete(where)
            else:
                self.update(where, change)
            with self._unless_missing(stage):
                if together:
                    self.engine.run_many(stage, list(PARTITIONS))
                else:
                    for k in PARTITIONS:
                        self.engine.run(stage, k)
            self._deliver_exports_of(data, stage)


# --- the pandas references: written from each spec's meaning, sharing no code with the engine ---------

def _windows(rows: pd.DataFrame, size: str, slide: str) -> pd.DataFrame:
    """Each row once per window [start, start + size) holding its event time (starts every `slide`).
    Rows a day or more from the tested hours hold no window of them (and centuries away, their window
    arithmetic would leave pandas' range)."""
    rows = rows[rows["ts"].notna()].copy()
    rows["ts"] = pd.to_datetime(rows["ts"], utc=True)
    rows = rows[(rows["ts"] > DAY - pd.Timedelta(days=1)) & (rows["ts"] < DAY + pd.Timedelta(days=1))]
    size_td, slide_td = pd.Timedelta(size), pd.Timedelta(slide)
    copies = []
    for back in range(int(size_td / slide_td)):
        c = rows.copy()
        c["window_start"] = c["ts"].dt.floor(slide) - back * slide_td
        copies.append(c)
    out = pd.concat(copies, ignore_index=True) if copies else rows.assign(window_start=rows["ts"])
    out = out[(out["ts"] >= out["window_start"]) & (out["ts"] < out["window_start"] + size_td)]
    return out.assign(window_end=out["window_start"] + size_td)


def _grouped(rows: pd.DataFrame, keys: list[str], aggs: dict) -> pd.DataFrame:
    if rows.empty:
        return pd.DataFrame()
    out = rows.groupby(["window_start", "window_end", *keys], dropna=False).agg(**aggs).reset_index()
    return out


def _sym_10m(rows):
    w = _windows(rows, "10min", "10min").sort_values(["ts", "px"])  # last: the latest event time, ties by price
    return _grouped(w, ["sym"], {"count": ("id", "size"), "sum_px": ("px", "sum"), "max_px": ("px", "max"),
                                 "last_px": ("px", "last")})


def _account_hop(rows):
    w = _windows(rows[rows["account"].notna()], "20min", "10min")
    return _grouped(w, ["account"], {"count": ("id", "size"), "sum_qty": ("qty", "sum"), "avg_px": ("px", "mean")})


def _venue_sql(rows):
    w = _windows(rows[rows["qty"] > 1], "30min", "30min")
    return _grouped(w, ["venue"], {"n": ("id", "size"), "q": ("qty", "sum")})


def _clean(rows: pd.DataFrame) -> pd.DataFrame:
    """The stage: rows with an event time and a positive price, one per id (copies of an id are
    identical in this test, so which one is kept does not matter). A price held as text (a watermark
    at a version where `px` was retyped) is compared as the number it spells, as Spark's cast does."""
    kept = rows[rows["ts"].notna() & (pd.to_numeric(rows["px"], errors="coerce") > 0)].copy()
    kept["ts"] = pd.to_datetime(kept["ts"], utc=True)
    return kept.drop_duplicates(subset=["id"]).reset_index(drop=True)


def _venue_15m(rows):
    w = _windows(rows, "15min", "15min")
    return _grouped(w, ["venue"], {"count": ("id", "size"), "sum_px": ("px", "sum"), "min_qty": ("qty", "min"),
                                   "count_distinct_qty": ("qty", "nunique")})


REFERENCES = {"sym_10m": _sym_10m, "account_hop": _account_hop, "venue_sql": _venue_sql, "venue_15m": _venue_15m}
