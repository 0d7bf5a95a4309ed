"""Sources written by delta-spark, as upstream Spark jobs write them: after every commit, Laminar's
sinks equal a full recompute of the rows delta-spark reads, and Laminar's own snapshot reading
(its deletion-vector decoding, its column mapping) returns exactly the rows delta-spark returns.

The producer is a separate process with a plain Spark session and Delta's extension
(tests/delta_spark_producer.py): appends, MERGE upserts, UPDATE and DELETE with deletion vectors on
and off, OPTIMIZE, REORG ... APPLY (PURGE), VACUUM, column-mapping renames and drops, change data
feed on and off, a table partitioned by a column, and a commit landing while a run is in flight.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Mode, Reason, Tumbling
from laminar_assets.engine.delta import open_delta, snapshot_files, table_info
from laminar_assets.engine.spark import installed_jars
from laminar_assets.engine.spark.read import read_source
from laminar_assets.errors import SchemaMismatchError, UnsupportedTableFeatureError
from tests.delta_spark_producer import DeltaSparkProducer, ProducerError
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


def _latest(producer: DeltaSparkProducer, path: str) -> tuple[int, pd.DataFrame]:
    """The table's latest version and its rows as delta-spark reads them. The producer is the table's only
    writer and runs one statement at a time, so its latest snapshot is the version its log names last
    (deltalake lists it; a read `versionAsOf` took delta-spark 3-4x as long as a read of the latest, and
    DESCRIBE HISTORY a Spark job of its own)."""
    return open_delta(path).version(), _frame(producer.read(path))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("id").reset_index(drop=True)


def _check_step(spark, producer, lake, path: str, recompute: Recomputes) -> None:
    version, theirs = _latest(producer, path)
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
    version, theirs = _latest(producer, path)
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


# --- The Delta feature matrix (#63) ------------------------------------------------------------------------------
# A tiny table for the table features delta-spark 4.4 turns on that no other test reads end to end, all written by
# the one producer process above, each through the same history: a first insert, an append, a MERGE that updates
# a row into another window and deletes another row, an OPTIMIZE. After every step a flow over each table (a key
# derived from the features' columns, count, sum and max) equals a recompute of the rows delta-spark reads, or is
# refused with `UnsupportedTableFeatureError` naming the feature. Features that only change how a writer writes
# share a table (the suite's time is its budget, #60); the protocol of each table is checked to list them.
# Covered elsewhere, so not here: deletion vectors, change data feed and column mapping `name` (the tests above;
# four matrix tables have deletion vectors on), type widening, variant, collations and partition values of every
# type (test_delta_spark_reads.py), and Databricks' tables (test_delta_features.py). The result per feature is in
# docs/delta-compatibility.md ("Feature matrix").
@dataclass(frozen=True)
class Featured:
    """One matrix table and the features (as the protocol names them) it must have."""

    label: str
    features: tuple[str, ...]
    props: tuple[tuple[str, str], ...] = ()
    columns: str = ""  # column definitions after id, ts, sym, qty
    clauses: str = ""  # PARTITIONED BY / CLUSTER BY
    fill: tuple[tuple[str, str], ...] = ()  # (column, expression of id, ts, sym, qty) the inserts set
    key: str = "sym"  # the flow's key, a Spark expression (a derived column `k`)
    ntz: bool = False  # event time TIMESTAMP_NTZ
    setup: tuple[str, ...] = ()  # statements between CREATE and the first insert
    moves: str = ""  # what the MERGE's update sets besides event time and quantity
    deletion_vectors: bool = True
    ctas: bool = True  # created with its first rows (CREATE TABLE ... AS SELECT; `columns` are then only the fill's)
    refused: str | None = None  # the feature the flow's refusal names (the table is only created)


MATRIX = (
    # column mapping in `id` mode (the `name` mode is tested above), with Iceberg compatibility (which needs column
    # mapping and no deletion vectors) and UniForm: delta-spark accepts `universalFormat.enabledFormats` but writes
    # no Iceberg metadata without delta-iceberg's jar, which is not installed
    Featured("column_mapping_id_iceberg", ("columnMapping", "icebergCompatV2"),
             (("delta.columnMapping.mode", "id"), ("delta.enableIcebergCompatV2", "true"),
              ("delta.universalFormat.enabledFormats", "iceberg")), deletion_vectors=False),
    # values the writer computes or checks: files rewritten by the MERGE (no deletion vectors)
    Featured("write_time_values", ("checkConstraints", "generatedColumns", "identityColumns", "allowColumnDefaults"),
             (("delta.feature.allowColumnDefaults", "supported"),),
             columns=", gen BIGINT GENERATED ALWAYS AS (qty DIV 4), "
                     "rid BIGINT GENERATED ALWAYS AS IDENTITY (START WITH 100 INCREMENT BY 7), note STRING DEFAULT 'dflt'",
             key="concat_ws('|', sym, gen, rid, note)", deletion_vectors=False, ctas=False,
             setup=("ALTER TABLE {t} ADD CONSTRAINT positive CHECK (qty > 0)",)),
    # row ids materialized in the files by the MERGE, the OPTIMIZE clustering by `sym`, event time TIMESTAMP_NTZ
    Featured("rows_clustered_ntz", ("rowTracking", "clustering", "domainMetadata", "timestampNtz"),
             (("delta.enableRowTracking", "true"),), clauses="CLUSTER BY (sym)", ntz=True),
    # features of the log: a v2 checkpoint (with a sidecar) every two commits, read by every run after the append;
    # with the vacuum protocol check beside deletion vectors, which deltalake refuses to scan, Laminar reads the
    # snapshot's vectors from the log itself, through that checkpoint
    Featured("log_features", ("v2Checkpoint", "inCommitTimestamp", "vacuumProtocolCheck"),
             (("delta.checkpointPolicy", "v2"), ("delta.checkpointInterval", "2"),
              ("delta.enableInCommitTimestamps", "true"), ("delta.feature.vacuumProtocolCheck", "supported"))),
    # partition values of several types, special characters and NULLs (one partition per `sym`), also inside the
    # data files; the MERGE moves a row to another partition
    Featured("partition_values", ("materializePartitionColumns",),
             (("delta.feature.materializePartitionColumns", "supported"),),
             clauses="PARTITIONED BY (b, dec, pts, d)",
             fill=(("b", "IF(sym = 'b', NULL, CAST(concat(sym, '/ =%ü') AS BINARY))"),
                   ("dec", "IF(sym = 'c', NULL, CAST(ascii(sym) / 8 - 12 AS DECIMAL(10,3)))"),
                   ("pts", "IF(sym = 'a', NULL, timestamp_micros(ascii(sym) * 1000001 - 500000000))"),
                   ("d", "IF(sym = 'b', NULL, date_add(DATE'1899-12-31', ascii(sym)))")),
             key="concat_ws('|', sym, hex(b), dec, pts, d)", moves=", b = CAST('moved %ü' AS BINARY), dec = NULL"),
    Featured("variant_shredding", ("variantShredding",), (("delta.enableVariantShredding", "true"),),
             columns=", payload VARIANT", fill=(("payload", "parse_json(concat('{\"q\": ', qty, '}'))"),),
             refused="variantShredding"),
)
MATRIX_AGGS = (Agg.count(), Agg.sum("qty"), Agg.max("qty"))
MATRIX_REFERENCE = FlowSpec(name="matrix", source="matrix", event_time="ts", window=Tumbling("10m"), keys=("tbl", "k"),
                            aggregates=MATRIX_AGGS)
MATRIX_FIRST = [(1, "00:01", "a", 5), (2, "00:04", "a", 2), (3, "00:12", "b", 3), (4, "00:15", "b", 1)]
MATRIX_APPEND = [(5, "00:02", "a", 4), (6, "00:31", "c", 2)]  # one late, into the first window
# "refill": no commit, a forced run (`laminar refill`) of each table with deletion vectors, reading them from the
# snapshot OPTIMIZE left (the tables without refilled at the MERGE already)
MATRIX_STEPS = ("append", "merge", "optimize", "refill")


def _matrix_flow(row: Featured) -> FlowSpec:
    return FlowSpec(name=f"{row.label}_flow", source=row.label, event_time="ts", window=Tumbling("10m"), keys=("k",),
                    derived={"k": f"CAST({row.key} AS STRING)"}, aggregates=MATRIX_AGGS)


def _matrix_rows(row: Featured, rows) -> str:
    """A query of `rows` with the table's columns: id, ts, sym, qty and the filled ones."""
    ts = "TIMESTAMP_NTZ" if row.ntz else "TIMESTAMP"
    values = ", ".join(f"({i}, {ts}'2024-01-01 {hm}:00', '{sym}', {qty})" for i, hm, sym, qty in rows)
    exprs = "".join(f", {e} AS {c}" for c, e in row.fill)
    return f"SELECT CAST(id AS BIGINT) AS id, ts, sym, CAST(qty AS BIGINT) AS qty{exprs} FROM VALUES {values} " \
           "AS v(id, ts, sym, qty)"


def _matrix_insert(row: Featured, table: str, rows) -> str:
    columns = "".join(f", {c}" for c, _ in row.fill)
    return f"INSERT INTO {table} (id, ts, sym, qty{columns}) {_matrix_rows(row, rows)}"


def _matrix_statements(row: Featured, table: str, step: str) -> list[str]:
    """The statements of `step` on `row`'s table: the MERGE moves row 2 to the next window and deletes row 4 (not
    an extreme: with deletion vectors the run retracts both rows, as it reads them by position)."""
    if step == "create":
        props = {**dict(row.props), "delta.enableDeletionVectors": str(row.deletion_vectors).lower()}
        listed = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        ts = "TIMESTAMP_NTZ" if row.ntz else "TIMESTAMP"
        if row.ctas and not row.refused:  # created with its first rows: one statement, one commit
            return [f"CREATE TABLE {table} USING delta {row.clauses} TBLPROPERTIES ({listed}) AS "
                    f"{_matrix_rows(row, MATRIX_FIRST)}"]
        create = f"CREATE TABLE {table} (id BIGINT, ts {ts}, sym STRING, qty BIGINT{row.columns}) USING delta " \
                 f"{row.clauses} TBLPROPERTIES ({listed})"
        if row.refused:  # refused at its protocol: no rows needed
            return [create]
        return [create, *(s.format(t=table) for s in row.setup), _matrix_insert(row, table, MATRIX_FIRST)]
    if row.refused or step == "refill":
        return []
    if step == "append":
        return [_matrix_insert(row, table, MATRIX_APPEND)]
    if step == "merge":
        return [f"MERGE INTO {table} t USING (SELECT * FROM VALUES (2), (4) AS u(id)) u ON t.id = u.id "
                "WHEN MATCHED AND t.id = 4 THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET ts = ts + INTERVAL 10 MINUTES, qty = qty + 10{row.moves}"]
    return [f"OPTIMIZE {table}"]


def _protocol_features(path: str) -> set[str]:
    """The table features of the table's latest protocol action, the legacy versions' implied ones included."""
    protocol = {}
    log = os.path.join(path, "_delta_log")
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json") and n[:20].isdigit()):
        with open(os.path.join(log, name)) as f:
            for line in f:
                protocol = json.loads(line).get("protocol") or protocol
    implied = {2: {"appendOnly", "invariants"}, 3: {"checkConstraints"}, 4: {"changeDataFeed", "generatedColumns"},
               5: {"columnMapping"}, 6: {"identityColumns"}}
    writer = protocol.get("minWriterVersion", 0)
    return {*protocol.get("readerFeatures", ()), *protocol.get("writerFeatures", ()),
            *(f for v, fs in implied.items() if v <= writer for f in fs)}


def test_feature_matrix_every_flow_equals_a_recompute_or_is_refused_by_name(spark, producer, lake):
    """Every matrix table's flow, after every step, equals a recompute of delta-spark's read, or is refused naming
    the feature; all tables' outcomes are collected, then the test fails listing every one that went wrong."""
    tables = {row.label: f"delta.`{lake.path(row.label)}`" for row in MATRIX}
    # a MERGE's retractions are merged, not refilled up front: deletion vectors are read by position
    engine = Engine(spark, lake.root, options=EngineOptions(extreme_refill="merge"))
    recompute = Recomputes(spark)
    failures: list[str] = []
    outcomes: dict[str, list[str]] = {row.label: [] for row in MATRIX}
    expected: list[pd.DataFrame] = []  # the recompute of the rows delta-spark read last

    def write(step: str) -> None:  # every table's statements of the step in one round trip
        statements = [(row, s) for row in MATRIX for s in _matrix_statements(row, tables[row.label], step)]
        for (row, statement), answer in zip(statements, producer.script([s for _, s in statements])):
            if isinstance(answer, ProducerError):
                failures.append(f"{row.label}, {step}: delta-spark refused {statement}: {answer}")

    def check(step: str) -> None:
        read = [row for row in MATRIX if not row.refused]
        if step != "refill":  # else nothing was committed since the last read
            rows = producer.sql(" UNION ALL ".join(  # one read of every table, one recompute of all
                f"SELECT '{row.label}' AS tbl, id, CAST(ts AS TIMESTAMP) AS ts, CAST({row.key} AS STRING) AS k, qty "
                f"FROM {tables[row.label]}" for row in read))
            frame = pd.DataFrame(rows, columns=["tbl", "id", "ts", "k", "qty"])
            frame["ts"] = pd.to_datetime(frame["ts"]).dt.tz_localize("UTC").astype("datetime64[us, UTC]")
            expected[:] = [recompute(MATRIX_REFERENCE, pa.Table.from_pandas(frame, preserve_index=False))]
        for row in MATRIX if step == "create" else read:
            if step == "refill" and not row.deletion_vectors:
                continue
            flow = _matrix_flow(row)
            try:
                result = engine.run(flow, PARTITIONS[0], force=step == "refill")
            except UnsupportedTableFeatureError as exc:
                outcomes[row.label].append("refused")
                if row.refused is None or row.refused not in str(exc):
                    failures.append(f"{row.label}, {step}: refused: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - every table's outcome is collected, then the test fails
                outcomes[row.label].append(type(exc).__name__)
                failures.append(f"{row.label}, {step}: {type(exc).__name__}: {exc}")
                continue
            outcomes[row.label].append(f"{result.mode.name.lower()} {result.reason.name}")
            if row.refused:
                failures.append(f"{row.label}, {step}: read, not refused")
                continue
            try:
                assert_frames_match(lake.read(flow.sink),
                                    expected[0][expected[0].tbl == row.label].drop(columns="tbl"), ("k",))
            except AssertionError as exc:
                failures.append(f"{row.label}, {step}: the sink differs from the recompute: {exc}")

    write("create")
    for row in MATRIX:  # the table has the features (a preview one counts: `variantShredding-preview`)
        found = {f.split("-")[0] for f in _protocol_features(lake.path(row.label))}
        if set(row.features) - found:
            failures.append(f"{row.label}: delta-spark wrote no {sorted(set(row.features) - found)}: {sorted(found)}")
    check("create")
    for step in MATRIX_STEPS:
        write(step)
        check(step)
    # what each run did: every kind of commit is read incrementally where the table says what changed (a MERGE
    # through deletion vectors), and no feature makes a run fall back to refills
    for row in MATRIX:
        merged = "incremental DELETION_VECTOR_CHANGES" if row.deletion_vectors else "refill REWRITE_WITHOUT_CHANGE_DATA"
        runs = ["refused"] if row.refused else ["refill NO_WATERMARK", "incremental APPEND_ONLY", merged,
                                                    "noop NO_CHANGES_IN_PARTITION",
                                                    *(["refill FORCED_BY_USER"] if row.deletion_vectors else [])]
        if outcomes[row.label] != runs:
            failures.append(f"{row.label}: runs {outcomes[row.label]}, expected {runs}")
    assert not failures, "\n".join(failures + [f"{label}: {' | '.join(seen)}" for label, seen in outcomes.items()])
    # what the features wrote that a reader must cope with: v2 checkpoints, partition values inside the data files
    log = os.listdir(lake.path("log_features") + "/_delta_log")
    assert any(re.search(r"\.checkpoint\.[0-9a-f-]{36}\.(json|parquet)$", n) for n in log), sorted(log)
    materialized = lake.table("partition_values").file_uris()[0]
    assert {"b", "dec", "pts", "d"} <= set(pq.read_schema(materialized).names), pq.read_schema(materialized)
