"""Spark/Arrow schema helpers, observations, interpreted execution and run ids (the session-side
helpers every run module shares; writing files is `output.uncommitted`'s job)."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import ArrayType, MapType, StructField, StructType, VariantType

from laminar_assets import storage


def spark_path(uri: str) -> str:
    """The URI Spark reads a file at (file:// locally, s3a:// for S3)."""
    return storage.spark_uri(uri)


def spark_schema(schema: pa.Schema, delta_schema: str | None = None) -> StructType:
    """The Spark schema of an Arrow one. `delta_schema`: the table's Delta schema (JSON), whose VARIANT
    columns (top level or nested) take Spark's VARIANT type: Arrow has no variant type (`deltalake` gives
    the stored struct<metadata, value> of binaries), and Spark reads the Parquet column as a variant only
    when asked for one (`variant_get`, `payload:price` need it)."""
    out = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    variants = variant_fields(delta_schema)
    if not variants:
        return out
    return StructType([StructField(f.name, variants[f.name].dataType, f.nullable) if f.name in variants else f
                       for f in out.fields])


def variant_fields(delta_schema: str | None) -> dict[str, StructField]:
    """Top-level fields of a Delta schema (JSON) that are or hold a VARIANT, as Spark fields (by logical name)."""
    if not delta_schema or '"variant"' not in delta_schema:
        return {}
    schema = StructType.fromJson(json.loads(delta_schema))
    return {f.name: f for f in schema.fields if has_variant(f.dataType)}


def has_variant(t) -> bool:
    """Whether a Spark type is or holds a VARIANT."""
    if isinstance(t, VariantType):
        return True
    if isinstance(t, StructType):
        return any(has_variant(f.dataType) for f in t.fields)
    if isinstance(t, ArrayType):
        return has_variant(t.elementType)
    if isinstance(t, MapType):
        return has_variant(t.keyType) or has_variant(t.valueType)
    return False


def arrow_schema_of(df: DataFrame | StructType) -> pa.Schema:
    """The Arrow schema of a frame's rows (an analysis of its plan) or of a Spark schema already known."""
    return to_arrow_schema(df if isinstance(df, StructType) else df.schema, timezone="UTC")


def selected_schema(schema: StructType, names) -> StructType | None:
    """The schema of `frame.select(*named(names))` for a frame of `schema`, without asking Spark (over Spark
    Connect each schema is an analysis of the whole plan, a request to the server): each field as the frame has
    it. None when a name is not exactly one of the frame's fields (Spark may match it regardless of case, or
    find it ambiguous, or missing): the caller asks Spark then."""
    fields = {f.name: f for f in schema.fields}
    if len(fields) != len(schema.fields) or any(n not in fields for n in names):
        return None
    return StructType([fields[n] for n in names])


def to_arrow(df: DataFrame) -> pa.Table:
    """`df.toArrow()` in one round trip to a Spark Connect server. Connect's `toArrow` first asks the server for
    the frame's schema (an analysis of its whole plan, tens of milliseconds for a flow's statement) and then
    executes the plan, which analyses it again; the execution's answer carries the same schema, which is
    taken from there instead (pyspark's `_to_table`, what `toArrow` and `collect` call). The same table,
    cast as `toArrow` casts it. Classic PySpark's frames: their own `toArrow` (one analysis)."""
    execute = getattr(df, "_to_table", None)
    if execute is None:
        return df.toArrow()
    table, schema = execute()
    return table.cast(to_arrow_schema(schema if schema is not None else df.schema,
                                      error_on_duplicated_field_names_in_struct=True, timezone="UTC"))


def select_frame(spark: SparkSession, text: str, frames: dict[str, Any]) -> DataFrame:
    """`spark.sql(text, **frames)` for a SELECT, as a frame that is analysed when it runs, not before
    (`frames`: DataFrames by name; typed Any as `sql`'s keywords are).

    Over Spark Connect `spark.sql` is a command the server executes at once, to learn whether the text is
    a command to run now (`INSERT`, `CREATE`): for a SELECT that is a whole analysis of the statement
    (its files listed, the plan resolved), and the server answers with the same SQL relation, which the
    execution analyses again (a quarter of a flow pass's time over a local server, docs/PERFORMANCE.md).
    Laminar's queries are SELECTs, so their frame is made as `spark.sql` makes it when the server's answer
    holds no result: the SQL relation with the frames as named subqueries (pyspark's own plan classes).
    An error in the text then comes from the first action on the frame, where every caller already
    expects Spark's errors. Classic PySpark: `spark.sql` itself (lazy there)."""
    if not _connect(spark):
        return spark.sql(text, **frames) if frames else spark.sql(text)
    from pyspark.sql.connect.dataframe import DataFrame as ConnectFrame
    from pyspark.sql.connect.plan import SQL, SubqueryAlias
    from pyspark.sql.connect.sql_formatter import SQLStringFormatter

    views: list[SubqueryAlias] = []
    if frames:  # as spark.sql formats them: each frame a named subquery of the statement
        formatter = SQLStringFormatter(spark)  # type: ignore[arg-type]
        text = formatter.format(text, **frames)
        views = [SubqueryAlias(frame._plan, name) for frame, name in formatter._temp_views]  # type: ignore[attr-defined]
    return ConnectFrame(SQL(text, [], {}, views), spark)  # type: ignore[arg-type]


def _connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session (pyspark's `is_remote` answers for the process, not a session)."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def empty_frame(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    return spark.createDataFrame([], spark_schema(schema))


def named(names) -> list[Column]:
    """Columns by name, quoted: a user's column name may hold a dot or a backtick, which a bare
    name in `select`/`F.col` would read as a struct field or fail to parse."""
    return [F.col("`" + n.replace("`", "``") + "`") for n in names]


def observe(df: DataFrame, observation, *metrics) -> DataFrame:
    """`df.observe(observation, *metrics)` for a batch frame. The Spark Connect client first asks the
    server whether `df` is streaming, one more analysis of the whole plan per call; run frames never
    are, so that answer is given up front."""
    if isinstance(getattr(type(df), "isStreaming", None), functools.cached_property):  # Connect's DataFrame
        df.__dict__["isStreaming"] = False
    return df.observe(observation, *metrics)



# Spark settings that make a query evaluate expressions without generating and compiling Java code.
# `factoryMode` is marked internal in Spark; if a later version ignores it, queries compile as usual.
_INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


_interpreted_lock = threading.Lock()
# id(session) -> [small passes inside, large passes inside, settings before (None: not interpreted now)]
_interpreted_users: dict[int, list] = {}


@contextlib.contextmanager
def interpreted(spark: SparkSession, enabled: bool):
    """Run the block's Spark jobs with interpreted expressions when `enabled` (small inputs: each
    query's generated code is new, so compiling it costs more than it saves), then restore the
    session's settings.

    The settings belong to the session, which a run's steps (threads) share: the first small pass in
    sets them and the last one out restores what was there before. A large pass (`enabled` False)
    must not run interpreted, so while one is inside the session compiles for everyone: small passes
    then only lose the shortcut, never an answer."""
    key = id(spark)
    with _interpreted_lock:
        state = _interpreted_users.setdefault(key, [0, 0, None])
        if enabled:
            state[0] += 1
            if state[1] == 0 and state[2] is None:
                state[2] = {k: spark.conf.get(k, None) for k in _INTERPRETED}
                for k, v in _INTERPRETED.items():
                    spark.conf.set(k, v)
        else:
            state[1] += 1
            _restore(spark, state)
    try:
        yield
    finally:
        with _interpreted_lock:
            state = _interpreted_users[key]
            state[0 if enabled else 1] -= 1
            if state[0] == 0:
                _restore(spark, state)
            if state[0] == state[1] == 0:
                del _interpreted_users[key]


def _restore(spark: SparkSession, state: list) -> None:
    """Put back the settings interpretation replaced, if it is on (called under `_interpreted_lock`)."""
    before, state[2] = state[2], None
    for k, v in (before or {}).items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def schema_change(current: pa.Schema, wanted: pa.Schema) -> str:
    """How a table of schema `current` must change to hold rows of `wanted`: "same"; "adds" (only new
    columns: the table's schema evolves in place, its rows read NULL there, as the new source columns
    of rows written before they existed do); or "differs" (a column's type changed or a column went)."""
    now = {f.name: str(f.type) for f in nullable(current)}
    then = {f.name: str(f.type) for f in nullable(wanted)}
    if now == then:
        return "same"
    if all(then.get(name) == t for name, t in now.items()):
        return "adds"
    return "differs"


def nullable(schema: pa.Schema) -> pa.Schema:
    """The schema with every field nullable, nested ones too: Spark marks array elements and struct
    fields non-null or not depending on the expression that built them, which is not a change of shape."""
    return pa.schema([pa.field(f.name, _nullable_type(f.type), True) for f in schema])


def _nullable_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = pa.field(t.value_field.name, _nullable_type(t.value_type), True)
        return pa.list_(item) if pa.types.is_list(t) else pa.large_list(item)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable_type(f.type), True) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _nullable_type(t.item_type), True))
    return t


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:10]}"
