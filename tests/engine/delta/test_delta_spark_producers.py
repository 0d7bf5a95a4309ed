"""Sources written by delta-spark, as upstream Spark jobs write them: after every commit, Laminar's
sinks equal a full recompute of the rows delta-spark reads, and Laminar's own snapshot reading
(its deletion-vector decoding, its column mapping) returns exactly the rows delta-spark returns.

The producer is a separate process with a plain Spark session and Delta's extension
(tests/delta_spark_producer.py): appends, MERGE upserts, UPDATE and DELETE with deletion vectors on
and off, OPTIMIZE, REORG ... APPLY (PURGE), VACUUM, column-mapping renames and drops, change data
feed on and off, a table partitioned by a column, and a commit landing while a run is in flight.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Mode, Reason, Tumbling
from laminar_assets.engine.delta import snapshot_files, table_info
from laminar_assets.engine.spark import installed_jars
from laminar_assets.engine.spark.read import read_source
from laminar_assets.errors import SchemaMismatchError
from tests.delta_spark_producer import DeltaSparkProducer
from tests.lake_invariants import assert_lake_intact
from tests.reference import Recomputes, assert_frames_match, full_recompute

pytestmark = [pytest.mark.spark, pytest.mark.skipif(not installed_jars("delta"), reason="needs delta-spark's jars "
                                                    "(make install puts them in the venv)")]

RETRACTING = FlowSpec(name="vol", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                      aggregates=(Agg.count(), Agg.sum("qty"), Agg.avg("px")))
EXTREMES = FlowSpec(name="ext", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.min("px"), Agg.max("qty"), Agg.last("px"), Agg.count_distinct("qty")))
FLOWS = (RETRACTING, EXTREMES)
PARTITIONS = ["2024-01-01-00:00", "2024-01-01-01:00"]
COLUMNS = "id BIGINT, ts TIMESTAMP, sym STRING, px DOUBLE, qty BIGINT"


def _values(rows) -> str:
    return ", ".join(f"({i}, TIMESTAMP'{ts}', '{sym}', {px}, {qty})" for i, ts, sym, px, qty in rows)


FIRST = [(1, "2024-01-01 00:01:00", "a", 3.0, 1), (2, "2024-01-01 00:05:00", "a", 10.0, 2),
         (3, "2024-01-01 00:12:00", "b", 7.0, 3), (4, "2024-01-01 00:31:00", "b", 7.0, 4),
         (5, "2024-01-01 01:02:00", "a", 5.0, 1), (6, "2024-01-01 01:15:00", "c", 9.0, 2),
         (7, "2024-01-01 01:16:00", "c", 1.0, 5), (8, "2024-01-01 01:44:00", "a", 4.0, 3)]
# (step name, statement with {t} for the table); every one commits a version
HISTORY = [
    ("append", "INSERT INTO {t} VALUES " + _values([(9, "2024-01-01 01:50:00", "b", 8.0, 2),
                                                    (10, "2024-01-01 00:03:00", "a", 2.5, 6)])),  # a late row
    ("merge", "MERGE INTO {t} t USING (SELECT * FROM VALUES " + _values([
        (2, "2024-01-01 00:05:00", "a", 11.0, 2), (5, "2024-01-01 01:02:00", "a", 0.5, 4),
        (11, "2024-01-01 00:44:00", "c", 6.0, 1)]).replace("TIMESTAMP", "TIMESTAMP") +
     " AS u(id, ts, sym, px, qty)) u ON t.id = u.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"),
    ("update moving rows across windows and partitions",
     "UPDATE {t} SET ts = ts + INTERVAL 70 MINUTES, px = px + 1 WHERE id IN (3, 10)"),
    ("delete of an extreme", "DELETE FROM {t} WHERE id IN (1, 7)"),
    ("reorg purge", "REORG TABLE {t} APPLY (PURGE)"),  # rewrites the files that carry deletion vectors
    ("optimize", "OPTIMIZE {t}"),
    ("vacuum", "VACUUM {t} RETAIN 0 HOURS"),
    ("append after vacuum", "INSERT INTO {t} VALUES " + _values([(12, "2024-01-01 00:58:00", "a", 1.5, 2)])),
]


@pytest.fixture(scope="module")
def producer():
    job = DeltaSparkProducer()
    yield job
    job.close()


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["id", "ts", "sym", "px", "qty"])
    df["ts"] = pd.to_datetime(df["ts"]).dt.tz_localize("UTC").astype("datetime64[us, UTC]")
    return df.astype({"id": "Int64", "sym": "string", "px": "float64", "qty": "Int64"})


def _laminar_reading(spark, path: str, version: int) -> pd.DataFrame:
    """The rows Laminar's own reader takes from the pinned snapshot (deletion vectors decoded by Laminar)."""
    info = table_info("trades", path, version)
    df = read_source(spark, snapshot_files(info, None, keep_null_files=True), info).toPandas()
    return _frame(df.assign(ts=df["ts"].dt.tz_localize(None) if df["ts"].dt.tz is None else
                            df["ts"].dt.tz_convert("UTC").dt.tz_localize(None)).to_dict("records"))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("id").reset_index(drop=True)


def _check_step(spark, producer, lake, path: str, recompute: Recomputes) -> None:
    version = producer.version(path)
    theirs = _frame(producer.read(path, version))
    ours = _laminar_reading(spark, path, version)
    pd.testing.assert_frame_equal(_sorted(ours), _sorted(theirs), check_like=True)
    snapshot = pa.Table.from_pandas(_sorted(theirs), preserve_index=False)
    for flow in FLOWS:
        expected = recompute(flow, snapshot)  # again only when the commit changed rows
        assert_frames_match(lake.read(flow.sink), expected, flow.keys)
    assert_lake_intact(lake.root)


# Each setting on and off, in two histories: deletion vectors with a change data feed on a table
# partitioned by a column, and a table with neither.
@pytest.mark.parametrize("deletion_vectors,cdf,partitioned", [(True, True, True), (False, False, False)],
                         ids=["dv-cdf-partitioned", "nodv-nocdf"])
def test_sinks_equal_a_recompute_after_every_delta_spark_commit(spark, producer, lake, deletion_vectors, cdf,
                                                                partitioned):
    path = lake.path("trades")
    table = f"delta.`{path}`"
    producer.sql(f"CREATE TABLE {table} ({COLUMNS}) USING delta {'PARTITIONED BY (sym)' if partitioned else ''} "
                 f"TBLPROPERTIES ('delta.enableDeletionVectors' = '{str(deletion_vectors).lower()}', "
                 f"'delta.enableChangeDataFeed' = '{str(cdf).lower()}')")
    producer.sql(f"INSERT INTO {table} VALUES {_values(FIRST)}")
    engine = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None))
    recompute = Recomputes(spark)
    for flow in FLOWS:
        engine.run_many(flow, PARTITIONS)
    _check_step(spark, producer, lake, path, recompute)

    reasons: dict[str, dict[str, set]] = {}
    for step, statement in HISTORY:
        producer.sql(statement.format(t=table))
        for flow in FLOWS:
            results = engine.run_many(flow, PARTITIONS)
            reasons.setdefault(step, {})[flow.name] = {(r.mode, r.reason) for r in results}
        _check_step(spark, producer, lake, path, recompute)

    # What a run records for each kind of commit. Rewrites that change no rows are no-ops;
    # a retracting flow merges deletes and updates when the change data feed (or the deletion
    # vectors a commit changed) says what each removed; extremes refill the windows they touch.
    # A rewrite that changes no rows commits a version without a data change, or none at all
    # (a purge of a table without deletion vectors, an OPTIMIZE with nothing to compact).
    nothing = {(Mode.NOOP, Reason.NO_CHANGES_IN_PARTITION), (Mode.NOOP, Reason.NO_NEW_VERSIONS)}
    for step in ("reorg purge", "optimize", "vacuum"):
        assert reasons[step]["vol"] | reasons[step]["ext"] <= nothing, (step, reasons[step])
    if deletion_vectors:  # the purge rewrote the files that carried vectors: a new version, no change
        assert reasons["reorg purge"]["vol"] == {(Mode.NOOP, Reason.NO_CHANGES_IN_PARTITION)}, reasons["reorg purge"]
    for step in ("append", "append after vacuum"):
        assert reasons[step]["vol"] <= {(Mode.INCREMENTAL, Reason.APPEND_ONLY), *nothing}, (step, reasons[step])
    if cdf:
        for step in ("merge", "update moving rows across windows and partitions", "delete of an extreme"):
            assert {m for m, _ in reasons[step]["vol"]} <= {Mode.INCREMENTAL, Mode.NOOP}, (step, reasons[step])
    if cdf or deletion_vectors:  # the commit says which rows it removed
        assert (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE) in reasons["delete of an extreme"]["ext"]
    else:  # files rewritten, nothing says which rows changed: both flows refill what the files held
        for name in ("vol", "ext"):
            assert {(Mode.REFILL, Reason.REWRITE_WITHOUT_CHANGE_DATA)} == reasons["delete of an extreme"][name]


def test_a_commit_while_a_run_is_in_flight(spark, producer, lake):
    """delta-spark commits between the run's read and its commit: the run keeps its pinned version,
    the next run takes the new commit, and nothing is lost or counted twice."""
    path = lake.path("trades")
    table = f"delta.`{path}`"
    producer.sql(f"CREATE TABLE {table} ({COLUMNS}) USING delta TBLPROPERTIES "
                 "('delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true')")
    producer.sql(f"INSERT INTO {table} VALUES {_values(FIRST)}")
    Engine(spark, lake.root).run_many(RETRACTING, PARTITIONS)

    producer.sql(f"DELETE FROM {table} WHERE id = 2")
    pinned = producer.version(path)
    landed = []

    def commit_midway(step):
        if step == "after_read" and not landed:
            producer.sql(f"UPDATE {table} SET qty = qty + 10 WHERE sym = 'a'")
            producer.sql(f"INSERT INTO {table} VALUES {_values([(20, '2024-01-01 00:07:00', 'a', 2.0, 2)])}")
            landed.append(producer.version(path))

    results = Engine(spark, lake.root, hook=commit_midway).run_many(RETRACTING, PARTITIONS)
    assert landed and landed[0] == pinned + 2
    assert {r.plan.to_versions["trades"] for r in results} == {pinned}
    after = Engine(spark, lake.root).run_many(RETRACTING, PARTITIONS)
    assert {r.plan.to_versions["trades"] for r in after} == {landed[0]}
    expected = full_recompute(spark, RETRACTING, pa.Table.from_pandas(_frame(producer.read(path)), preserve_index=False))
    assert_frames_match(lake.read(RETRACTING.sink), expected, RETRACTING.keys)


def test_column_mapping_renames_and_drops(spark, producer, lake):
    """A rename or drop of a column no flow uses changes nothing; a rename of one a flow uses is a
    schema error naming the old name, the new one and the version."""
    path = lake.path("trades")
    table = f"delta.`{path}`"
    producer.sql(f"CREATE TABLE {table} ({COLUMNS}, venue STRING, note STRING) USING delta TBLPROPERTIES "
                 "('delta.columnMapping.mode' = 'name', 'delta.enableDeletionVectors' = 'true')")
    producer.sql(f"INSERT INTO {table} SELECT *, 'x', 'n' FROM VALUES {_values(FIRST)}")
    engine = Engine(spark, lake.root)
    engine.run_many(RETRACTING, PARTITIONS)

    producer.sql(f"ALTER TABLE {table} RENAME COLUMN venue TO exchange")
    producer.sql(f"ALTER TABLE {table} DROP COLUMN note")
    producer.sql(f"INSERT INTO {table} VALUES (30, TIMESTAMP'2024-01-01 00:20:00', 'a', 4.0, 1, 'y')")
    producer.sql(f"DELETE FROM {table} WHERE id = 4")
    engine.run_many(RETRACTING, PARTITIONS)
    version = producer.version(path)
    theirs = _frame(producer.read(path, version))
    assert_frames_match(lake.read(RETRACTING.sink),
                        full_recompute(spark, RETRACTING, pa.Table.from_pandas(theirs, preserve_index=False)),
                        RETRACTING.keys)
    ours = _laminar_reading(spark, path, version)
    pd.testing.assert_frame_equal(_sorted(ours), _sorted(theirs), check_like=True)

    producer.sql(f"ALTER TABLE {table} RENAME COLUMN qty TO quantity")
    renamed_at = producer.version(path)
    with pytest.raises(SchemaMismatchError) as caught:
        engine.run_many(RETRACTING, PARTITIONS)
    message = str(caught.value)
    assert "'qty'" in message and "'quantity'" in message and f"version {renamed_at}" in message, message
