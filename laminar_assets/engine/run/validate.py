"""Checks of a spec against the real schema of its sources (needs Spark's analyzer, runs no job)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DateType, StringType, StructType, TimestampNTZType, TimestampType

from laminar_assets.errors import SchemaMismatchError, SpecError, UnsupportedTableFeatureError

from ..aggregates.algebra import is_numeric
from ..aggregates.base import EVENT_TS
from ..aggregates.column_types import check_aggregation, spark_message
from ..delta.tables import TableInfo, column_fate
from ..quarantine.records import rule_kept_sql
from ..spark.frames import has_variant, spark_schema, variant_fields
from ..spec.kinds import KINDS
from ..spec.reads import expression_columns
from ..spec.specs import FlowSpec, Spec

TIME_TYPES = (TimestampType, TimestampNTZType, DateType, StringType)


def apply_row_logic(df: DataFrame, spec: Spec) -> DataFrame:
    """Derived columns then the row filter, as the spec declares them."""
    for name, expr in spec.derived_pairs:
        df = df.withColumn(name, F.expr(expr))
    if spec.filter:
        df = df.where(F.expr(spec.filter))
    return df


def event_time_column(df: DataFrame | None, column: str, dtype: DataType | None = None):
    """The event time as a timestamp; strings that do not parse become null (counted, not fatal).
    `dtype`: the column's type when known (no analysis of `df` then)."""
    if not dtype:
        assert df is not None  # a caller without the column's type passes the frame to read it from
        dtype = df.schema[column].dataType
    return F.expr(event_time_sql(column, dtype))


def event_time_sql(column: str, dtype: DataType) -> str:
    """`event_time_column` as Spark SQL text, for a column of type `dtype`."""
    c = "`" + column.replace("`", "``") + "`"
    if isinstance(dtype, StringType):
        return f"try_to_timestamp({c})"
    if isinstance(dtype, (TimestampNTZType, DateType)):
        return f"CAST({c} AS TIMESTAMP)"
    return c


@dataclass(frozen=True)
class CheckedSource:
    """What `check_source` found: the types of the columns the spec reads (the input-schema
    fingerprint), and the analyzed schema of a source row with the spec's joined and derived columns,
    so a run builds its query without asking Spark for schemas again."""

    types: dict[str, str]
    row_schema: StructType


_CHECKED: dict[tuple, CheckedSource] = {}
_CHECKED_LOCK = threading.Lock()


def checked_source(spark: SparkSession, spec: Spec, info: TableInfo,
                   joined: dict[str, TableInfo] | None = None) -> CheckedSource:
    """`check_source`, remembered for this process: what it finds depends only on the spec and the
    schemas it checks against (not on the table versions), and Spark's analyzer would otherwise be
    asked again on every run (a new Engine per Dagster step, many runs per `laminar demo` or
    `laminar serve` process).
    A failed check is not remembered: it raises again, with the versions of that run."""
    key = (id(spark), spec.name, spec.spec_hash, info.name, info.schema, bool(variant_fields(info.delta_schema)),
           *sorted((name, t.schema) for name, t in (joined or {}).items()))
    with _CHECKED_LOCK:
        found = _CHECKED.get(key)
    if found is None:
        found = check_source(spark, spec, info, joined)
        with _CHECKED_LOCK:
            if len(_CHECKED) > 256:
                _CHECKED.clear()
            _CHECKED[key] = found
    return found


def check_source(spark: SparkSession, spec: Spec, info: TableInfo,
                 joined: dict[str, TableInfo] | None = None) -> CheckedSource:
    """Fail clearly if `info` lacks a column the spec uses or has it with an unusable type.

    `joined` holds the tables of a flow's fact joins (by table name): their columns join the
    source's under their flow-side names.
    """
    facts: dict[str, Any] = dict(flow=spec.name, table=info.name, version=info.version)  # SpecError's keywords
    if spec.event_time in dict(spec.derived) and spec.event_time in info.schema.names:
        raise SpecError(f"flow '{spec.name}': derived column {spec.event_time!r} is the event time and replaces "
                        f"the source column of that name in '{info.name}' (its file statistics would locate rows "
                        "wrongly); derive a new name and use it as event_time",
                        field=f"derived.{spec.event_time}", **facts)
    source_schema = spark_schema(info.schema, info.delta_schema)
    base = spark.createDataFrame([], source_schema)
    if spec.fact_joins:
        base = _with_joined_columns(spark, spec, base, joined or {})
    if not _rules_compile(spec, info, base):  # each rule alone, to name the one that does not
        _check_rules(spec, info, base, facts)
    if info.name == spec.sources[0]:  # a fan-in flow reads its other sources under the first one's names
        columns = base.columns if spec.fact_joins else source_schema.fieldNames()  # known without an analysis
        _check_names(spec, columns, facts)
        _check_dimension_names(spec, columns, facts)
    df = _row_logic_checked(spec, info, base, facts)
    for col in spec.input_columns:
        if col not in df.columns and col not in dict(spec.derived):
            _renamed_or_dropped(spec, info, col)
        if col not in df.columns:
            raise SchemaMismatchError(
                f"flow '{spec.name}' uses column {col!r}, which source '{info.name}' does not have at "
                f"version {info.version}; found columns {df.columns}. Add the column to the source or "
                f"fix the spec", column=col, **facts,
            )
    ts_type = df.schema[spec.event_time].dataType
    if not isinstance(ts_type, TIME_TYPES):
        raise SchemaMismatchError(
            f"event time column {spec.event_time!r} of '{info.name}' must be a timestamp, date or string, "
            f"found {ts_type.simpleString()} at version {info.version}", column=spec.event_time, **facts,
        )
    if variant_fields(info.delta_schema):  # a variant computed from other columns: `check_aggregation` says why
        _refuse_variants(spec, info, df, facts)
    flow = spec.aggregation()
    if flow is not None:  # its aggregates over the source's columns
        _check_shadowed(flow, df.columns, facts)
        for agg in flow.aggregates:
            if agg.expr:
                _check_expression(df, flow, agg, facts)
            if KINDS[agg.kind].numeric and agg.column:
                t = df.schema[agg.column].dataType
                if not is_numeric(t):
                    raise SchemaMismatchError(
                        f"aggregate {agg.kind}({agg.column}) of flow '{flow.name}' needs a numeric column, "
                        f"found {t.simpleString()} in '{info.name}' at version {info.version}",
                        column=agg.column, **facts,
                    )
        # the aggregates' input columns are source or derived ones, typed in df's schema (analysed above)
        check_aggregation(df.withColumn(EVENT_TS, event_time_column(df, flow.event_time)), flow, facts,
                          input_schema=df.schema)
    schema = df.schema
    return CheckedSource({c: schema[c].dataType.simpleString() for c in spec.input_columns}, schema)


def _rules_compile(spec: Spec, info: TableInfo, base: DataFrame) -> bool:
    """Whether every quarantine rule of `info` compiles to a condition, from one analysis of them all (Spark
    casts what it can, a string 'true'/'N', to a condition, as the pass uses them)."""
    rules = spec.rules_for(info.name)
    if not rules:
        return True
    try:
        _ = base.select(*[F.expr(f"NOT {rule_kept_sql(r)}").alias(f"__rule_{i}") for i, r in enumerate(rules)]).schema
    except (AnalysisException, PySparkException):
        return False
    return True


def _check_rules(spec: Spec, info: TableInfo, base: DataFrame, facts: dict) -> None:
    """Raise the `SpecError` naming the first rule of `info` that does not compile, or that is no condition."""
    for rule in spec.rules_for(info.name):
        try:
            kind = base.select(F.expr(rule.check)).schema[0].dataType
        except (AnalysisException, PySparkException) as exc:
            raise SpecError(
                f"flow '{spec.name}': rule {rule.name!r} ({rule.check}) does not compile against source "
                f"'{info.name}' at version {info.version}: {spark_message(exc)}. Fix the rule in the source's "
                "contract (quarantine.rules)", field=f"rules.{rule.name}", **facts) from None
        try:  # as the pass uses it: Spark casts what it can (a string 'true'/'N') to a condition
            _ = base.select(F.expr(f"NOT {rule_kept_sql(rule)}")).schema
        except (AnalysisException, PySparkException):
            raise SpecError(
                f"flow '{spec.name}': rule {rule.name!r} ({rule.check}) must be a condition, true for the rows to "
                f"keep; on source '{info.name}' at version {info.version} it gives {kind.simpleString()}. Fix the "
                "rule in the source's contract (quarantine.rules)", field=f"rules.{rule.name}", **facts) from None


def _refuse_variants(spec: Spec, info: TableInfo, df: DataFrame, facts: dict) -> None:
    """Raise `UnsupportedTableFeatureError` when a VARIANT value (a source column, or a derived column
    that is one, e.g. `payload:price` without a cast) would be a flow's key, an aggregate's input or
    result, or a stage's key or output column: state and sinks are typed Delta columns that Laminar
    writes from Arrow, which has no variant type, and Spark cannot group or order by a variant. Fields
    extracted with their type (`variant_get(payload, '$.price', 'double')`, `payload:price::double`) are
    plain columns and work everywhere; a variant column nothing uses is read by no one."""
    def fail(column: str, role: str, dtype: DataType, field: str) -> None:
        sources = variant_fields(info.delta_schema)  # the source's variant columns (this runs only when it has one)
        example = column if column in sources else next(iter(sources))
        raise UnsupportedTableFeatureError(
            f"{spec.kind} '{spec.name}' uses {column!r} of source '{info.name}' at version {info.version}, a "
            f"{dtype.simpleString()} value (Delta feature variantType), as {role}; Laminar can only read a variant's "
            "fields with their types: extract one and use that, e.g. derived "
            f"{{'price': \"variant_get({example}, '$.price', 'double')\"}} (in SQL: {example}:price::double)",
            column=column, feature="variantType", field=field, **facts)

    def used(column: str | None, role: str, field: str) -> None:
        if column and column in df.columns and has_variant(df.schema[column].dataType):
            fail(column, role, df.schema[column].dataType, field)

    flow = spec.aggregation()
    if flow is not None:
        for key in flow.keys:
            used(key, "a group key", "keys")
        for agg in flow.aggregates:
            used(agg.column, f"the input of aggregate {agg.name!r}", f"aggregates.{agg.name}")
            used(agg.by, f"the ordering column of aggregate {agg.name!r}", f"aggregates.{agg.name}")
            if agg.expr:
                try:
                    dtype = df.groupBy().agg(F.expr(agg.expr)).schema[0].dataType
                except (AnalysisException, PySparkException):
                    continue  # `_check_expression` names what does not compile
                if has_variant(dtype):
                    fail(agg.expr, f"aggregate {agg.name!r}, whose result would be a sink column", dtype,
                         f"aggregates.{agg.name}")
    else:
        for key in spec.key_columns:
            used(key, "its dedup key", "dedup_key")
        for column in spec.kept_columns or df.columns:
            used(column, "an output column (the stage's table cannot hold a variant)", "columns")


def _with_joined_columns(spark: SparkSession, spec: Spec, base: DataFrame,
                         joined: dict[str, TableInfo]) -> DataFrame:
    """`base` with the joined tables' columns (typed, empty) under their flow-side names, and the
    join conditions checked against them."""
    for join in spec.fact_joins:
        info = joined[join.table]
        other = spark.createDataFrame([], spark_schema(info.schema, info.delta_schema))
        missing = [c for c in join.columns if c not in other.columns]
        if missing:
            _renamed_or_dropped(spec, info, missing[0])
            raise SchemaMismatchError(
                f"flow '{spec.name}' uses column {missing[0]!r} of joined table '{info.name}', which it does not "
                f"have at version {info.version}; found columns {other.columns}", flow=spec.name, table=info.name,
                version=info.version, column=missing[0])
        side = other.select(*[F.col(c).alias(join.column(c)) for c in join.columns])
        try:
            base = base.join(side, F.expr(join.on), "left")
            _ = base.schema
        except (AnalysisException, PySparkException) as exc:
            raise SpecError(f"flow '{spec.name}': join condition {join.on!r} with '{info.name}' does not compile: "
                            f"{spark_message(exc)}", field=f"joins.{join.alias}", flow=spec.name, table=info.name,
                            version=info.version) from None
    return base


def _check_expression(df: DataFrame, spec: FlowSpec, agg, facts: dict) -> None:
    """A SQL aggregate must be one aggregate value per window over the source's columns (analysed, not run)."""
    try:
        _ = df.groupBy().agg(F.expr(agg.expr)).schema
    except (AnalysisException, PySparkException) as exc:
        raise SpecError(f"aggregate {agg.name} = {agg.expr} of flow '{spec.name}' does not compile against "
                        f"'{facts['table']}' as an aggregate: {spark_message(exc)}",
                        field=f"aggregates.{agg.name}", **facts) from None


def _row_logic_checked(spec, info: TableInfo, base: DataFrame, facts: dict) -> DataFrame:
    """`apply_row_logic`, analysed once; when that fails, again one field at a time, so the error names the
    derived column or the filter."""
    try:  # (classic PySpark analyses each step as it is made; Connect, at `schema`)
        whole = base
        for name, expr in [*spec.derived, *([("", spec.filter)] if spec.filter else [])]:
            whole = whole.withColumn(name, F.expr(expr)) if name else whole.where(F.expr(expr))
        _ = whole.schema
        return whole
    except (AnalysisException, PySparkException):
        pass
    df, field, expr = base, "", ""
    try:
        for name, expr in [*spec.derived, *([("", spec.filter)] if spec.filter else [])]:
            field = f"derived.{name}" if name else "filter"
            step = df.withColumn(name, F.expr(expr)) if name else df.where(F.expr(expr))
            _ = step.schema
            df = step  # (the frame before a failing step: its columns are named; Connect analyses at `schema`)
    except (AnalysisException, PySparkException) as exc:
        col = _unresolved(exc)
        if col:
            _renamed_or_dropped(spec, info, col)
            raise SchemaMismatchError(
                f"flow '{spec.name}': {field} ({expr}) uses column {col!r}, which source '{info.name}' does not "
                f"have at version {info.version}; found columns {df.columns}", column=col, field=field, **facts,
            ) from None
        raise SpecError(f"flow '{spec.name}': {field} ({expr}) does not compile against '{info.name}' at version "
                        f"{info.version}: {spark_message(exc)}", field=field, **facts) from None
    return df


def _check_names(spec, columns: list[str], facts: dict) -> None:
    """Derived names must not differ from a source column (or an earlier derived one) only in case:
    Spark resolves names regardless of case, so the two would be one ambiguous name."""
    seen = {c.lower(): (c, "source column") for c in columns}
    for name, _expr in spec.derived:
        other, what = seen.get(name.lower(), (name, ""))
        if other != name:
            raise SpecError(
                f"flow '{spec.name}': derived column {name!r} differs from {what} {other!r} of '{facts['table']}' "
                f"only in case, and Spark resolves column names regardless of case; name it {other!r} to replace "
                "that column, or choose another name", field=f"derived.{name}", **facts)
        seen[name.lower()] = (name, "derived column")


def _check_shadowed(spec: FlowSpec, columns: list[str], facts: dict) -> None:
    """A source's own `window_start`/`window_end` (a flow over another flow's sink) serve the event
    time, derived columns, filter and rules; inside aggregates those names are the flow's windows,
    so an aggregate naming one as its column would silently read the flow's window instead."""
    own = {c.lower(): c for c in columns if c.lower() in ("window_start", "window_end")}
    for agg in spec.aggregates:
        for col in (agg.column, agg.by):
            if col and col.lower() in own:
                raise SpecError(
                    f"flow '{spec.name}': aggregate {agg.name!r} reads column {col!r} of '{facts['table']}', but in "
                    f"aggregates that name is the flow's own window; derive it under another name first, e.g. "
                    f"derived={{'source_{col.lower()}': {own[col.lower()]!r}}}, and aggregate that",
                    field=f"aggregates.{agg.name}", **facts)


def _check_dimension_names(spec: Spec, columns: list[str], facts: dict) -> None:
    """A stage's dimension joins (`dimension_joins`) add their columns beside the row's: none may share a name
    (in any case) with a source or derived column or another join's column, or the stage's row would hold
    two columns Spark cannot tell apart."""
    seen = {c.lower(): f"source column {c!r}" for c in columns}
    seen.update({n.lower(): f"derived column {n!r}" for n, _expr in spec.derived_pairs})
    for i, join in enumerate(spec.dimension_joins):
        on = {c.lower() for c in join.on}
        for col in join.columns:
            if col.lower() in on:
                continue
            if col.lower() in seen:
                raise SpecError(
                    f"{spec.kind} '{spec.name}': dimension '{join.table}' adds column {col!r} beside the "
                    f"{seen[col.lower()]} (Spark resolves names regardless of case, so the row would hold two columns "
                    "of one name); leave it out of the join's columns or rename the other",
                    field=f"joins[{i}].columns", **facts)
            seen[col.lower()] = f"column {col!r} of dimension '{join.table}'"


def _renamed_or_dropped(spec, info: TableInfo, col: str) -> None:
    """A clear error when column mapping renamed or dropped a column the spec uses."""
    fate = column_fate(info, col)
    if fate:
        raise SchemaMismatchError(
            f"flow '{spec.name}' uses column {col!r} of source '{info.name}', which was {fate} "
            f"(the table is at version {info.version}); update the flow to the new name or remove its use",
            flow=spec.name, table=info.name, version=info.version, column=col,
        ) from None


def _unresolved(exc: Exception) -> str | None:
    getter = getattr(exc, "getMessageParameters", None)
    params = getter() if callable(getter) else None
    if params and "objectName" in params:
        return params["objectName"].strip("`")
    return None


def columns_used(spec: Spec, table: str) -> set[str]:
    """Source columns a spec may read from `table`: those it names and those its rules use ("*", all,
    when other expressions are involved)."""
    if table in spec.dimension_tables:
        return spec.joined_columns(table)
    if spec.reads_all_columns or spec.filter or spec.derived or spec.not_incrementalizable:
        return {"*"}
    return {*spec.input_columns, *(c for rule in spec.rules_for(table) for c in expression_columns(rule.check))}
