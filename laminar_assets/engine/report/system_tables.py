"""`laminar sql`: Spark SQL over the lake, with Laminar's own facts as `laminar_system.*` tables.

Every sink and stage table is a temp view by its name, every raw source too; Spark reads the Parquet
files of the table's latest snapshot (`spark_read`), never the Delta log. The system tables:

    laminar_system.dag_topology   one row per node of the graph (`report.topology`)
    laminar_system.partitions     one row per (flow, partition) watermark (`CheckpointStore`)
    laminar_system.runs           one row per commit a run made to a sink, from its Delta history
    laminar_system.flow_outcomes  one row per partition run (NOOPs too), from the runs' outcome records
    laminar_system.flow_stats     one row per flow and UTC day: hit and fallback rates (`flow_stats`)
    laminar_system.exports        one row per export: delivered version, lag, last delivery (`export_status`)
    laminar_system.dead_letters   one row per row a webhook export could not deliver (`export.dead_letters`)

Spark temp views cannot have a dotted name, so `laminar_system.x` is rewritten in the query text to
the view `laminar_system_x` (same length, so Spark's error positions still point into the query as
typed). Only the tables a query names are registered; the driver collects only the (limited) result.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.errors import LaminarError, did_you_mean

from ..catalog import busy_metastore
from ..delta.tables import is_delta_table, open_delta, resolve_uri, snapshot_files, table_info
from ..export import dead_letters
from ..spark.frames import spark_path
from ..spark.read import read_source
from ..spark.session import delta_available
from .deliveries import export_status
from .flow_stats import outcome_rows, summarize
from .overview import topology
from .sql_guard import FILE_FORMATS, check_read_only, check_text, refuse_name, spark_error_line

SYSTEM = "laminar_system"
HISTORY = 1000  # commits read per sink table for `laminar_system.runs` (the most recent ones)


def _fields(*spec: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in spec])


S, L, B, T, STRS = StringType(), LongType(), BooleanType(), TimestampType(), ArrayType(StringType())
DAG_SCHEMA = _fields(("node_id", S), ("operator_type", S), ("inputs", STRS), ("outputs", STRS), ("is_shared", B),
                     ("partitioning", S))
PARTITIONS_SCHEMA = _fields(("flow", S), ("partition", S), ("source_versions", MapType(S, L)), ("seq", L),
                            ("spec_hash", S), ("last_mode", S), ("last_reason", S), ("failed_attempt", S),
                            ("updated_at", T), ("failed_runs", L), ("failing_since", T), ("last_error", S))
METRICS = ("rows_read", "rows_rejected", "state_rows", "sink_rows")
D = DoubleType()
OUTCOMES_SCHEMA = _fields(("flow", S), ("run_id", S), ("at", T), ("partition", S), ("mode", S), ("reason", S),
                          ("refilled_share", D), ("refilled_windows", L), ("rows_read", L), ("change_rows", L),
                          ("seconds", D))
FLOW_STATS_SCHEMA = _fields(("flow", S), ("day", DateType()), ("runs", L), ("partition_runs", L), ("incremental", L),
                            ("refill", L), ("noop", L), ("incremental_share", D), ("refill_share", D),
                            ("noop_share", D), ("hit_rate", D), ("refills_by_reason", MapType(S, L)),
                            ("windows_per_refill", D), ("refilled_share", D), ("rows_read", L), ("change_rows", L),
                            ("rows_read_per_change", D))
EXPORTS_SCHEMA = _fields(("export", S), ("kind", S), ("source", S), ("target", S), ("delivered_version", L),
                         ("source_version", L), ("lag_versions", L), ("lag_seconds", D), ("delivered_at", T), ("mode", S),
                         ("reason", S), ("detail", S), ("rows_upserted", L), ("rows_deleted", L), ("failed_deliveries", L),
                         ("failing_since", T), ("last_error", S), ("dead_letters", L), ("rows_sent", L), ("retries", L),
                         ("pending_rows", L))
INT = IntegerType()
DEAD_LETTERS_SCHEMA = _fields(("export", S), ("source", S), ("idempotency_key", S), ("op", S), ("version", L),
                              ("partition", S), ("status", INT), ("error", S), ("attempts", INT), ("row", S), ("dead_at", T))
RUNS_SCHEMA = _fields(("run_id", S), ("flow", S), ("partitions", STRS), ("mode", S), ("reason", S),
                      ("committed_at", T), ("table_version", L), *[(m, L) for m in METRICS], ("recovered", B))


def dag_topology(spark: SparkSession, specs) -> DataFrame:
    """`laminar_system.dag_topology`: node_id, operator_type (source/stage/flow), inputs, outputs,
    is_shared, partitioning; one row per node of `report.topology(specs)`."""
    rows = [(r["node"], r["kind"], list(r["inputs"]), list(r["outputs"]), bool(r["is_shared"]), r["partitioning"])
            for r in topology(specs)]
    return spark.createDataFrame(rows, DAG_SCHEMA)


def partitions(spark: SparkSession, root: str, specs) -> DataFrame:
    """`laminar_system.partitions`: one row per (flow, partition) watermark (`partition_rows`)."""
    return spark.createDataFrame(partition_rows(root, specs), PARTITIONS_SCHEMA)


def partition_rows(root: str, specs) -> list[tuple]:
    """The rows of `laminar_system.partitions`: flow, partition, source_versions, seq, spec_hash, last_mode,
    last_reason, failed_attempt (why the next run refills), updated_at, and while its runs fail: failed_runs
    (how many in a row since the last success; 0 when that succeeded), failing_since and last_error, as
    `laminar status` shows them, so `WHERE failed_runs > 0` finds the failing partitions."""
    store = CheckpointStore(root)
    rows = []
    for spec in specs:
        for key in store.partitions(spec.name):
            m = store.load(spec.name, key)
            if m is not None:
                failed = m.failed_runs
                rows.append((m.flow, m.partition, {k: int(v) for k, v in m.source_versions.items()}, m.seq,
                             m.spec_hash, m.last_mode, m.last_reason, m.failed_attempt, _instant(m.updated_at),
                             failed.count if failed else 0, _instant(failed.since) if failed else None,
                             failed.last_error if failed else None))
    return rows


def runs(spark: SparkSession, root: str, specs, *, history: int = HISTORY) -> DataFrame:
    """`laminar_system.runs`: one row per commit a run made to a flow's or stage's sink (a run of many
    partitions commits once per group of partitions sharing target versions), from the newest `history`
    commits of each sink's Delta history and their `laminar.*` commit metadata: run_id, flow, partitions,
    mode, reason, committed_at, table_version, rows_read, rows_rejected, state_rows (flows), sink_rows
    (rows the commit wrote) and recovered (a sink re-derived from committed state after a crash).
    Commits older than the `laminar.reason`/`laminar.metrics` metadata have NULL there."""
    rows = []
    for spec in specs:
        uri = resolve_uri(root, spec.sink)
        if not is_delta_table(uri):
            continue
        for c in open_delta(uri).history(history):
            if "laminar.run_id" not in c:
                continue  # table creation, a schema reset: not a run's commit
            metrics = json.loads(c.get("laminar.metrics") or "{}")
            rows.append((c["laminar.run_id"], c.get("laminar.flow", spec.name), _listed(c, "laminar.partition"),
                         c.get("laminar.mode"), c.get("laminar.reason"),
                         datetime.fromtimestamp(c["timestamp"] / 1000, UTC), c.get("version"),
                         *[metrics.get(m) for m in METRICS], c.get("laminar.recovered") == "true"))
    return spark.createDataFrame(rows, RUNS_SCHEMA)


def flow_outcomes(spark: SparkSession, root: str, specs) -> DataFrame:
    """`laminar_system.flow_outcomes`: one row per partition run of every flow and stage, NOOPs included:
    flow, run_id, at, partition, mode, reason, refilled_share, refilled_windows (flows), rows_read,
    change_rows (rows of the new commits' files overlapping the partition), seconds."""
    rows = [tuple(r.get(f.name) for f in OUTCOMES_SCHEMA.fields) for r in outcome_rows(root, specs)]
    return spark.createDataFrame(rows, OUTCOMES_SCHEMA)


def flow_stats_table(spark: SparkSession, root: str, specs) -> DataFrame:
    """`laminar_system.flow_stats`: per flow and UTC day, the shares of partition runs that merged,
    refilled and had nothing to do, the hit rate, refills by reason, windows per refill and rows read
    per changed row (`report.flow_stats`). Sum `flow_outcomes` for another period."""
    by_day: dict[tuple[str, date], list[dict]] = {}
    for r in outcome_rows(root, specs):
        by_day.setdefault((r["flow"], r["at"].date()), []).append(r)
    rows = []
    for (flow, day), parts in sorted(by_day.items()):
        stats = summarize(flow, [{"partitions": [p]} for p in parts]).to_json()
        stats["runs"] = len({p["run_id"] for p in parts})
        rows.append(tuple({**stats, "day": day}.get(f.name) for f in FLOW_STATS_SCHEMA.fields))
    return spark.createDataFrame(rows, FLOW_STATS_SCHEMA)


def exports_table(spark: SparkSession, root: str, specs, exports) -> DataFrame:
    """`laminar_system.exports`: one row per export: kind, source, target (no secrets), delivered_version,
    source_version, lag_versions, lag_seconds, delivered_at, mode, reason, detail, rows_upserted, rows_deleted, and
    while its deliveries fail: failed_deliveries (in a row), failing_since, last_error (`report.export_status`); a
    webhook's dead_letters (rows in its dead-letter table) and its last delivery's rows_sent, retries, pending_rows."""
    rows = []
    for r in export_status(root, list(exports), list(specs)):
        failed = r["failed"] or {}
        values = {**r, "delivered_at": _instant(r["delivered_at"]), "failed_deliveries": failed.get("count", 0),
                  "failing_since": _instant(failed.get("since")), "last_error": failed.get("error")}
        rows.append(tuple(values.get(f.name) for f in EXPORTS_SCHEMA.fields))
    return spark.createDataFrame(rows, EXPORTS_SCHEMA)


def dead_letters_table(spark: SparkSession, root: str, exports) -> DataFrame:
    """`laminar_system.dead_letters`: the rows webhook exports could not deliver, from each one's Delta table
    (`_laminar/dead_letters/<export>`): export, source, idempotency_key, op, version, partition, status (NULL: no
    answer), error, attempts, row (the JSON sent), dead_at."""
    frames = []
    for export in exports:
        uri = dead_letters.table_uri(root, export.name)
        if export.kind == "webhook" and is_delta_table(uri):
            frames.append(table_frame(spark, f"dead letters of {export.name}", uri)
                          .select(*[f.name for f in DEAD_LETTERS_SCHEMA.fields]))
    if not frames:
        return spark.createDataFrame([], DEAD_LETTERS_SCHEMA)
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def lake_tables(root: str, specs) -> dict[str, str]:
    """Name -> Delta URI of every data table a query may name: the sink of each flow and stage (by its
    name) and the raw sources they read. System tables are not included (see `run_query`)."""
    out = {}
    for spec in specs:
        out[os.path.basename(spec.sink.rstrip("/")).lower()] = resolve_uri(root, spec.sink)
    for node in topology(specs):
        if node["kind"] == "source":
            out.setdefault(os.path.basename(node["node"].rstrip("/")).lower(), resolve_uri(root, node["node"]))
    return out


def table_frame(spark: SparkSession, name: str, uri: str) -> DataFrame:
    """The rows of a Delta table's latest snapshot as a lazy DataFrame (its Parquet files, deletion
    vectors applied); a table not written yet is a LaminarError naming it."""
    if not is_delta_table(uri):
        raise LaminarError(f"table {name!r} has no data yet: no Delta table at {uri} (materialize it first, "
                           "e.g. `laminar demo`, or let the sensors run)", table=name)
    info = table_info(name, uri)
    return read_source(spark, snapshot_files(info, None), info)


def _view(name: str) -> str:
    return f"{SYSTEM}_{name}"


def references(query: str) -> tuple[set[str] | None, set[str], str]:
    """What `query` names: (tables, candidates, rewritten query). `tables`: the tables sqlglot's parse
    of a query (SELECT, WITH, VALUES, DESCRIBE of a table) finds (lower case, CTE names left out, system
    tables as `laminar_system.x`); None for any other statement or when sqlglot cannot parse it: then
    `candidates` (every identifier in it, also after EXPLAIN or SHOW) says which tables to register. The
    rewritten query has each `laminar_system.x` replaced by its view name. Whether the statement may run
    at all is `sql_guard`'s judgement, on Spark's own parse: sqlglot's only finds the names."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        tokens = _tokens(query)
    except SqlglotError:
        return None, set(), query  # e.g. an unterminated string: Spark's parser says where
    text, candidates = list(query), set()
    for i, (kind, word, start, end) in enumerate(tokens):
        if kind not in ("VAR", "IDENTIFIER"):
            continue
        candidates.add(word.lower())
        if word.lower() == SYSTEM and i + 2 < len(tokens) and tokens[i + 1][0] == "DOT":
            name, end = tokens[i + 2][1].lower(), tokens[i + 2][3] + 1
            candidates.add(f"{SYSTEM}.{name}")
            text[start:end] = list(_view(name).ljust(end - start))  # same length: Spark's positions stay right
    rewritten = "".join(text)
    if tokens and tokens[0][0] == "COMMAND":  # EXPLAIN, SHOW, ...: sqlglot would parse (and log) a Command
        return None, candidates, rewritten
    try:
        trees = [t for t in sqlglot.parse(query, read="spark") if t is not None]
    except SqlglotError:
        return None, candidates, rewritten
    if len(trees) != 1 or not isinstance(trees[0], (exp.Query, exp.Values, exp.Describe)) or \
            trees[0].args.get("kind") or trees[0].args.get("style") in ("HISTORY", "DETAIL"):
        return None, candidates, rewritten  # not one query (a DESCRIBE FUNCTION, HISTORY '/path'): sql_guard judges
    ctes = {c.alias_or_name.lower() for c in trees[0].find_all(exp.CTE)}
    tables = {".".join(p for p in (t.catalog, t.db, t.name) if p).lower() for t in trees[0].find_all(exp.Table)
              if t.name and (t.db or t.catalog or t.name.lower() not in ctes)}
    return tables, candidates, rewritten


def _tokens(query: str, offset: int = 0) -> list[tuple[str, str, int, int]]:
    """sqlglot's tokens of `query` as (kind, text, start, end), positions `offset` on. sqlglot keeps the
    rest of a command (EXPLAIN, SHOW, MSCK, ...) as one string: that is tokenized in turn, and the
    command's own token is marked COMMAND."""
    import sqlglot
    from sqlglot.dialects.spark import Spark

    out = []
    tokens = sqlglot.tokenize(query, read="spark")
    for before, tok in zip([None, *tokens], tokens):
        command = before is not None and before.token_type in Spark.tokenizer_class.COMMANDS
        if command and before is not None and tok.token_type.name == "STRING" \
                and (at := query.find(tok.text, before.end + 1)) >= 0:
            out += _tokens(tok.text, offset + at)
            continue
        kind = "COMMAND" if tok.token_type in Spark.tokenizer_class.COMMANDS else tok.token_type.name
        out.append((kind, tok.text, tok.start + offset, tok.end + offset))
    return out


@dataclass(frozen=True)
class QueryResult:
    """A query's columns and at most `limit` rows (values as Python objects); `truncated` when it had more."""

    columns: list[str]
    rows: list[tuple]
    truncated: bool

    def records(self) -> list[dict]:
        """Rows as JSON-able dicts (timestamps in ISO 8601; a repeated column name gets a `_2` suffix)."""
        names: list[str] = []
        seen: dict[str, int] = {}
        for c in self.columns:
            seen[c] = seen.get(c, 0) + 1
            names.append(c if seen[c] == 1 else f"{c}_{seen[c]}")
        return [dict(zip(names, (jsonable(v) for v in row))) for row in self.rows]


def jsonable(value):
    """A Spark result value as JSON data: datetimes in ISO 8601, decimals and non-finite floats as text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal) or (isinstance(value, float) and not math.isfinite(value)):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # a Row (struct) is a tuple: keep its field names
        return {k: jsonable(v) for k, v in value.asDict().items()} if hasattr(value, "asDict") else \
            [jsonable(v) for v in value]
    return value


def run_query(session: SparkSession | Callable[[], SparkSession], root: str, specs, query: str, *,
              limit: int = 100, exports=(), catalog: str | None = None) -> QueryResult:
    """Run one Spark SQL query over the lake and return at most `limit` rows (the driver collects no
    more). `session` may be a function that builds one: it is called only after the query's tables were
    found (an unknown table fails without starting Spark). An unknown table, and Spark's parse, analysis
    and runtime errors, are one-line LaminarErrors. Only a statement that reads runs (`sql_guard`: judged by
    Spark's own parse before any table is registered); anything else is refused, and nothing runs.
    `catalog`: the schema Laminar registers the lake's tables in (`laminar`): `<catalog>.<table>` is read
    through the session's metastore (its Delta table at the registered location), not as a view."""
    data = lake_tables(root, specs)
    system = {f"{SYSTEM}.dag_topology": lambda: dag_topology(spark, specs),
              f"{SYSTEM}.partitions": lambda: partitions(spark, root, specs),
              f"{SYSTEM}.runs": lambda: runs(spark, root, specs),
              f"{SYSTEM}.flow_outcomes": lambda: flow_outcomes(spark, root, specs),
              f"{SYSTEM}.flow_stats": lambda: flow_stats_table(spark, root, specs),
              f"{SYSTEM}.exports": lambda: exports_table(spark, root, specs, exports),
              f"{SYSTEM}.dead_letters": lambda: dead_letters_table(spark, root, exports)}
    known = sorted(data) + sorted(system) + ([f"{catalog}.<table>"] if catalog else [])
    if (log := _LOG.fullmatch(query)) and log.group("name").lower() in data:  # a lake table's log: by its path
        query = f"{log.group('kind')} delta.`{spark_path(data[log.group('name').lower()])}`{log.group('limit') or ''}"
    check_text(query)  # a refused function by its name: no need to start Spark to refuse it
    tables, candidates, sql = references(query)
    by_path = {name for name in tables or () if name.startswith("delta.")}  # delta.`<path>`: Spark's Delta reads it
    for name in sorted((tables or set()) - by_path):
        if name.split(".", 1)[0] in FILE_FORMATS and "." in name:
            raise refuse_name(name.split(".", 1))  # e.g. parquet.`/path`
        if catalog and name.count(".") == 1 and name.split(".", 1)[0] == catalog.lower():
            continue  # a table of the catalog: the session's metastore resolves it (or Spark says it has none)
        if name not in data and name not in system:
            raise LaminarError(f"unknown table {name!r} in the query; {did_you_mean(name, known)}known tables: "
                               f"{', '.join(known)}", table=name)
    if hasattr(session, "sql"):  # a session (local or Connect), or its factory
        spark: SparkSession = cast(SparkSession, session)
    else:
        spark = cast(Callable[[], SparkSession], session)()
    try:
        sql = check_read_only(spark, sql, shown=lambda line: _shown(line, known),  # what it judged, to run
                              schemas=frozenset({catalog.lower()}) if catalog else frozenset())
    except LaminarError:
        raise
    except Exception as exc:  # Spark's errors while parsing, local (Py4J) or over Spark Connect (gRPC)
        raise LaminarError(_one_line(exc, known)) from exc
    if (by_path or _LOG.match(query)) and not delta_available(spark):
        raise LaminarError("the query reads a Delta table by path (delta.`...`) or its history, which needs "
                           "delta-spark in the Spark session: install its jars (`make install`, or python -m "
                           "laminar_assets.deploy.jar_installer delta) and start Spark again; tables by name "
                           f"work without it ({', '.join(known)})")
    views = []
    try:
        for name in sorted(tables if tables is not None else candidates):
            if catalog and name.startswith(f"{catalog.lower()}."):
                continue
            if name in system:
                system[name]().createOrReplaceTempView(_view(name.split(".", 1)[1]))
                views.append(_view(name.split(".", 1)[1]))
            elif name in data:
                table_frame(spark, name, data[name]).createOrReplaceTempView(name)
                views.append(name)
        try:
            df = spark.sql(sql)
            kinds = [f.dataType for f in df.schema.fields]
            rows = [tuple(_utc(v, k) for v, k in zip(r, kinds)) for r in df.limit(limit + 1).collect()]
        except Exception as exc:  # Spark's errors, local (Py4J) or over Spark Connect (gRPC)
            if catalog and (busy := busy_metastore(spark, exc, catalog)) is not None:
                raise busy from exc  # the embedded metastore, open in another process
            raise LaminarError(_one_line(exc, known, data)) from exc
        return QueryResult(list(df.columns), rows[:limit], len(rows) > limit)
    finally:
        for v in views:
            try:
                spark.catalog.dropTempView(v)
            except Exception:  # noqa: BLE001  (a lost session: nothing left to clean up)
                pass


# `DESCRIBE HISTORY|DETAIL <a lake table's name> [LIMIT n]`: its Delta log as delta-spark shows it (a
# lake table by name is a view of its files, which delta-spark does not describe)
_LOG = re.compile(r"\s*(?P<kind>DESC(?:RIBE)?\s+(?:HISTORY|DETAIL))\s+`?(?P<name>\w+)`?(?P<limit>\s+LIMIT\s+\d+)?\s*;?\s*",
                  re.IGNORECASE)


def _utc(value, kind):
    """Spark hands TIMESTAMP values to Python as naive local times: make them UTC instants."""
    return value.astimezone(UTC) if isinstance(kind, TimestampType) and isinstance(value, datetime) else value


def _one_line(exc: Exception, known: list[str], tables: dict[str, str] | None = None) -> str:
    """Spark's message, first line only (no plan, no JVM trace), with view names shown as typed. Time travel
    on a lake table by name (a view of its latest snapshot's files) says how to read an older version."""
    line = _shown(spark_error_line(exc), known)
    if "TIME_TRAVEL" in line and (name := re.search(r"`(\w+)`", line)) and name.group(1).lower() in (tables or {}):
        line += (" A lake table by name is its latest snapshot: read an older version by path, "
                 f"delta.`{spark_path((tables or {})[name.group(1).lower()])}` VERSION AS OF <n>.")
    return line


def _shown(line: str, known: list[str]) -> str:
    """A line of Spark's message as `laminar sql` shows it: view names as typed, the known tables."""
    line = re.sub(rf"`?{SYSTEM}_(\w+)`?", rf"{SYSTEM}.\1", line)
    if "TABLE_OR_VIEW_NOT_FOUND" in line:
        line += f" Known tables: {', '.join(known)}."
    return f"query failed: {line}"


def _listed(commit: dict, key: str) -> list[str] | None:
    """A comma-separated value of a commit's metadata as a list (None when absent)."""
    return commit[key].split(",") if commit.get(key) else None
