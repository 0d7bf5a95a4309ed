"""Checks of a flow's aggregation against a source row (Spark's analyzer over empty frames, no job):
every aggregate over the types of its columns, then every post column over the sink's row.

One analysis when all is well; only when it fails is each aggregate, then each post column,
analysed on its own, so the error names the field instead of quoting our generated SQL."""

from __future__ import annotations

import re
from typing import cast

from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from laminar_assets.errors import SpecError

from ..spec.specs import FlowSpec
from .algebra import implementations
from .base import AggImpl, q, user_sql

WINDOW_BOUNDS = ("CAST(NULL AS TIMESTAMP) AS window_start", "CAST(NULL AS TIMESTAMP) AS window_end")
# Spark's reasons for refusing an aggregate's input type, in the user's terms
WHY = {
    "DATATYPE_MISMATCH.INVALID_ORDERING_TYPE": "{kind} needs values that have an order, and these have none",
    "DATATYPE_MISMATCH.UNSUPPORTED_INPUT_TYPE": "{kind} does not accept values of this type",
}


def spark_message(exc: Exception) -> str:
    """Spark's message, first line, without its position in a statement the user never wrote."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r";?\s*line \d+ pos \d+;?$", "", text).rstrip(" ;")


def check_aggregation(rows: DataFrame, spec: FlowSpec, facts: dict, *, input_schema: StructType | None = None) -> None:
    """`rows`: an empty source row with the flow's joined and derived columns and its event time as
    `__ts`. Raises a `SpecError` naming `aggregates.<name>` or `post.<name>`. `input_schema`: a schema holding
    the types of the aggregates' input columns, when the caller has it (else `rows` is analysed for it).
    The happy path is one analysis of the whole sink (aggregates and post columns); a failure is analysed again
    piece by piece to name the piece."""
    impls = implementations(spec, input_schema if input_schema is not None else rows.schema)
    keys = [q(k) for k in spec.keys]

    def state(chosen: list[AggImpl]) -> DataFrame:
        before = [e for i in chosen for e in i.pre_partial_exprs(spec.keys)]
        source = rows.selectExpr("*", *before) if before else rows
        return source.groupBy(*[F.expr(k) for k in keys]).agg(*[F.expr(e) for i in chosen for e in i.partial("1")])

    posts = cast(tuple[tuple[str, str], ...], spec.post)  # __post_init__ made them (name, expression) pairs
    try:  # the whole sink at once: the aggregates, then each post column over them
        sink = state(impls).selectExpr(*keys, *WINDOW_BOUNDS, *[i.finalize() for i in impls])
        for name, expr in posts:
            sink = sink.withColumn(name, F.expr(user_sql(expr)))
        _ = sink.schema
    except (AnalysisException, PySparkException):
        sink = _named_failure(rows, state, impls, spec, facts)
    for f in sink.schema.fields:  # Delta tables hold no intervals: the state and sink commits would fail
        if "interval" in f.dataType.simpleString():
            field = ("keys" if f.name in spec.keys else f"post.{f.name}" if f.name in dict(spec.post)
                     else f"aggregates.{f.name}")
            raise SpecError(
                f"flow '{spec.name}': output column {f.name!r} is of type {f.dataType.simpleString()}, which a Delta "
                "table cannot store; convert it, e.g. to seconds with unix_seconds(a) - unix_seconds(b)",
                field=field, **facts)


def _named_failure(rows: DataFrame, state, impls: list[AggImpl], spec: FlowSpec, facts: dict) -> DataFrame:
    """The analysis of a flow's sink failed: analyse it again piece by piece and raise the `SpecError` naming the
    first piece that does not compile (the keys, an aggregate, the aggregates together, a post column)."""
    keys = [q(k) for k in spec.keys]
    try:
        sink = state(impls).selectExpr(*keys, *WINDOW_BOUNDS, *[i.finalize() for i in impls])
        _ = sink.schema
    except (AnalysisException, PySparkException) as exc:
        _check_keys(rows, spec, facts)
        for impl in impls:
            _check_one(rows, state, impl, spec, facts)
        raise SpecError(f"flow '{spec.name}': its aggregates do not compile together over source "
                        f"'{facts['table']}' at version {facts['version']}: {spark_message(exc)}",
                        field="aggregates", **facts) from None
    for name, expr in cast(tuple[tuple[str, str], ...], spec.post):
        try:  # `sink` stays the columns before this one (its message names them; Connect analyses at `schema`)
            with_post = sink.withColumn(name, F.expr(user_sql(expr)))
            _ = with_post.schema
            sink = with_post
        except (AnalysisException, PySparkException) as exc:
            raise SpecError(
                f"flow '{spec.name}': post column {name!r} ({expr}) does not compile over the sink's columns "
                f"{sink.columns}: {spark_message(exc)}. A post column may use the keys, window_start, window_end, "
                "the aggregates and the post columns before it (source columns are gone after aggregation)",
                field=f"post.{name}", **facts) from None
    return sink  # every piece compiled alone: the whole did too, on a second look


def _check_keys(rows: DataFrame, spec: FlowSpec, facts: dict) -> None:
    try:
        _ = rows.groupBy(*[F.expr(q(k)) for k in spec.keys]).count().schema
    except (AnalysisException, PySparkException) as exc:
        typed = ", ".join(f"{k!r} of type {rows.schema[k].dataType.simpleString()}" for k in spec.keys)
        raise SpecError(f"flow '{spec.name}': its keys ({typed}) cannot group rows of source '{facts['table']}' at "
                        f"version {facts['version']}: {spark_message(exc)}", field="keys", **facts) from None


def _check_one(rows: DataFrame, state, impl: AggImpl, spec: FlowSpec, facts: dict) -> None:
    agg = impl.agg
    try:
        _ = state([impl]).schema
    except (AnalysisException, PySparkException) as exc:
        condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
        why = WHY.get(condition(), "") if callable(condition) else ""
        typed = ", ".join(f"{c!r} of type {rows.schema[c].dataType.simpleString()}" for c in (agg.column, agg.by) if c)
        raise SpecError(
            f"flow '{spec.name}': aggregate {agg.name!r} ({agg.kind}) cannot be computed over {typed or 'its rows'} "
            f"of source '{facts['table']}' at version {facts['version']}: "
            f"{why.format(kind=agg.kind) if why else spark_message(exc)}", field=f"aggregates.{agg.name}", **facts,
        ) from None
