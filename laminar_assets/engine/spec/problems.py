"""What can be wrong with the parts of a spec, as (field, message): checked when a spec is built.

Pure functions over plain values; `specs.py` turns a problem into a SpecError naming the spec.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TypeGuard

from ..windows import divides, parse_duration
from .kinds import KINDS
from .parts import Agg, FactJoin, Hopping, RefreshPolicy, Tumbling

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-/]{1,63}$")  # Dagster's rules for asset tags
_TAG_VALUE_RE = re.compile(r"^[A-Za-z0-9_.\-]{0,63}$")


def agg_problem(agg: Agg) -> str | None:
    """What is wrong with one aggregate on its own (None: nothing)."""
    if not isinstance(agg.kind, str) or agg.kind not in KINDS:
        return f"unknown aggregate {agg.kind!r}; expected one of {', '.join(KINDS)}"
    for attr in ("column", "by"):
        value = getattr(agg, attr)
        if value is not None and not (isinstance(value, str) and value):
            return f"{agg.kind}: expected a column name for {attr}, found {value!r}"
    if agg.kind == "sql":
        if not (isinstance(agg.expr, str) and agg.expr.strip()):
            return f"aggregate 'sql' needs a Spark SQL aggregate expression (expr=...), found {agg.expr!r}"
    elif agg.column is None and KINDS[agg.kind].needs_column:
        return f"aggregate {agg.kind!r} needs a column"
    if agg.kind == "approx_percentile" and not (_number(agg.quantile) and 0.0 <= agg.quantile <= 1.0):
        return f"approx_percentile needs a quantile in [0, 1], found {agg.quantile!r}"
    bounds = PRECISION.get(agg.kind)  # None: Spark's default
    if bounds and agg.precision is not None and not (_whole(agg.precision) and bounds[0] <= agg.precision <= bounds[1]):
        return f"{agg.kind} needs {bounds[2]} between {bounds[0]} and {bounds[1]}, found {agg.precision!r}"
    if agg.kind in ("min_by", "max_by") and not (isinstance(agg.by, str) and agg.by):
        return f"{agg.kind} needs the column whose extreme picks the row (by=...), found {agg.by!r}"
    if agg.kind in ("top_k", "approx_top_k"):
        if not (_whole(agg.k) and 1 <= agg.k <= 10_000):
            return f"{agg.kind} needs k between 1 and 10000, found {agg.k!r}"
        if agg.kind == "approx_top_k" and agg.precision is not None and agg.precision < agg.k:
            return f"approx_top_k tracks max_items={agg.precision} items, fewer than the k={agg.k} it returns"
    return None


# What Spark accepts for an aggregate's `precision`: (least, most, what it is)
PRECISION = {"approx_count_distinct": (4, 21, "lg_config_k"), "approx_percentile": (8, 65535, "k"),
             "approx_top_k": (1, 1_000_000, "max_items")}


def _whole(value: object) -> TypeGuard[int]:
    """Whether `value` is an int and not a bool (True is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> TypeGuard[float]:
    """Whether `value` is an int or a float and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def catalog_problem(owners: tuple, tags: tuple) -> tuple[str, str] | None:
    """(field, what is wrong) with a spec's owners or tags (None: nothing)."""
    for owner in owners:
        if not isinstance(owner, str) or not (_EMAIL_RE.match(owner) or owner.startswith("team:") and len(owner) > 5):
            return "owners", f"expected an email address or 'team:<name>', found {owner!r}"
    for key, value in tags:
        if not (isinstance(key, str) and _TAG_KEY_RE.match(key) and isinstance(value, str) and _TAG_VALUE_RE.match(value)):
            return (f"tags.{key}", "expected a key of letters, digits, '_', '-', '.', '/' and a value of up to "
                    f"63 letters, digits, '_', '-', '.', found {key!r}: {value!r}")
    return None


def joins_problem(joins: tuple, sources: tuple[str, ...], rules: tuple) -> tuple[str, str] | None:
    """(field, what is wrong) with a flow's fact joins (None: nothing)."""
    aliases: set[str] = set()
    for i, join in enumerate(joins):
        if not isinstance(join, FactJoin):
            return f"joins[{i}]", f"expected a FactJoin, found {join!r}"
        if join.table in sources:
            return f"joins[{i}].table", f"{join.table!r} is already a source of the flow (no self-joins)"
        if join.how not in ("inner", "left"):
            return f"joins[{i}].how", f"expected 'inner' or 'left' (windows follow the source's rows), found {join.how!r}"
        if not isinstance(join.table, str) or not join.table.strip():
            return f"joins[{i}].table", f"expected a table name or URI, found {join.table!r}"
        if not isinstance(join.columns, tuple) or not all(isinstance(c, str) and c for c in join.columns):
            return f"joins[{i}].columns", f"expected column names, found {join.columns!r}"
        if not isinstance(join.alias, str) or not _NAME_RE.match(join.alias) or join.alias in aliases:
            return f"joins[{i}].alias", f"expected a unique identifier, found {join.alias!r}"
        if not (isinstance(join.on, str) and join.on.strip()):
            return f"joins[{i}].on", "expected a join condition (Spark SQL)"
        aliases.add(join.alias)
    if joins and rules:
        return ("rules", "row rules (quarantine) apply to a single source; a flow that joins fact tables takes none: "
                "put the rules on a stage it reads")
    return None


# The longest window, and the most windows one event may fall in (hopping size / slide): each copy is a
# row of every pass, so a window of a year sliding by the minute would copy each event half a million times.
MAX_WINDOW = timedelta(days=31)
MAX_WINDOW_COPIES = 1440


def duration_problem(value, what: str) -> str | None:
    """What is wrong with a duration field (None: a positive timedelta)."""
    if not isinstance(value, timedelta):
        try:
            parse_duration(value)
        except ValueError as exc:
            return str(exc)
        return f"expected a duration like '5m', found {value!r}"
    if value <= timedelta(0):
        return f"expected a positive {what}, found {value}"
    return None


def window_problem(window, granularity) -> tuple[str, str] | None:
    """(field, what is wrong) with a flow's window against its partitioning (None: nothing)."""
    if not isinstance(window, (Tumbling, Hopping)):
        return ("window", f"expected Tumbling(size) or Hopping(size, slide), found {window!r}")
    fields = ("size", "slide") if isinstance(window, Hopping) else ("size",)
    for name in fields:
        problem = duration_problem(getattr(window, name), f"window {name}")
        if problem:
            return (f"window.{name}", problem)
        if getattr(window, name) > MAX_WINDOW:
            return (f"window.{name}", f"expected a window {name} of at most {MAX_WINDOW.days} days, found "
                                      f"{getattr(window, name)}")
    shape = window.shape
    step = granularity.step
    if isinstance(window, Hopping):
        if not divides(shape.slide, shape.size):
            return ("window.slide", f"hopping slide {shape.slide} does not divide window size {shape.size} (the size "
                                    "must be a whole number of slides)")
        if not divides(shape.slide, step):
            return ("window.slide", f"hopping slide {shape.slide} does not divide the {granularity.value} partition")
        if shape.copies > MAX_WINDOW_COPIES:
            return ("window.slide", f"hopping windows of {shape.size} every {shape.slide} put each event in "
                                    f"{shape.copies} windows; expected at most {MAX_WINDOW_COPIES}: use a longer slide")
    elif not divides(shape.size, step):
        return ("window.size", f"window size {shape.size} does not divide the {granularity.value} partition ({step})")
    return None


def flow_problem(spec, reserved: tuple[str, ...]) -> tuple[str, str] | None:
    """(field, what is wrong) with a flow's window, keys, aggregates and outputs (None: nothing)."""
    problem = window_problem(spec.window, spec.granularity)
    if problem:
        return problem
    for i, key in enumerate(spec.keys):
        if not isinstance(key, str) or not _NAME_RE.match(key):
            return (f"keys[{i}]", f"expected a column name, found {key!r}")
    if len({k.lower() for k in spec.keys}) != len(spec.keys):
        return ("keys", f"duplicate group-by key in {list(spec.keys)} (names are compared regardless of case)")
    for i, key in enumerate(spec.keys):
        if key.lower() in reserved:  # every flow groups by its own window already
            return (f"keys[{i}]", f"{key!r} is the window column every flow adds and groups by; derive the source's "
                    "column under another name to group by it")
    for col, _expr in spec.derived:
        if col.lower() in reserved:  # the pass adds the window columns beside the row's own
            return (f"derived.{col}", f"{col!r} is the window column every flow adds; derive another name")
    if not spec.aggregates:
        return ("aggregates", "expected at least one aggregate, found none")
    # Spark and Delta compare column names regardless of case: so does this
    seen: dict[str, str] = {n.lower(): n for n in [*spec.keys, *reserved]}
    for i, agg in enumerate(spec.aggregates):
        where = f"aggregates[{i}]"
        if not isinstance(agg, Agg):
            return (where, f"expected an Agg, found {agg!r}")
        agg_message = agg_problem(agg)
        if agg_message:
            return (where, agg_message)
        if not isinstance(agg.name, str) or not _NAME_RE.match(agg.name) or agg.name.startswith("__"):
            return (where, f"output name {agg.name!r} is not an identifier")
        if agg.name.lower() in seen:
            return (where, f"duplicate output column {agg.name!r}{_case_note(agg.name, seen)}")
        seen[agg.name.lower()] = agg.name
    for col, _expr in spec.post:
        if col.lower() in seen:
            return (f"post.{col}", f"duplicate output column {col!r}{_case_note(col, seen)}")
        seen[col.lower()] = col
    names = {a.name for a in spec.aggregates}
    for col in spec.hidden:
        if col not in names:
            return ("hidden", f"expected names of aggregates, found {col!r}")
    if spec.not_incrementalizable and spec.refresh is RefreshPolicy.INCREMENTAL_STRICT:
        return ("refresh", "refresh 'incremental_strict' cannot maintain "
                f"{', '.join(spec.not_incrementalizable)} incrementally (Laminar can only recompute the "
                "windows it touches); use refresh 'auto' or an aggregate Laminar can merge")
    return None


# How the pass marks an input frame in its SQL text (spark/query.py): a name between NUL characters.
FRAME_PLACEHOLDER = re.compile("\x00([A-Za-z0-9_]+)\x00")


def _case_note(name: str, seen: dict[str, str]) -> str:
    other = seen[name.lower()]
    return "" if other == name else f" (the same as {other!r} but for case: column names are case-insensitive)"


def expression_problem(spec) -> tuple[str, str] | None:
    """(field, what is wrong) for a user expression the pass cannot embed in its own SQL: one holding
    what reads as a placeholder for an input frame (`FRAME_PLACEHOLDER`), or
    a derived, post, filter or rule expression that names itself with a top-level `AS` (the field's
    key is its name; an alias cannot stand where the pass puts it). Text sqlglot cannot parse is left
    to Spark's own check."""
    import sqlglot
    from sqlglot import exp

    from .sql_dialect import DIALECT

    flow = spec.aggregation()  # post expressions and SQL aggregates: an aggregation's only
    post, aggregates = (flow.post, flow.aggregates) if flow is not None else ((), ())
    fields = [*[(f"derived.{c}", e) for c, e in spec.derived], *[(f"post.{c}", e) for c, e in post],
              *[(f"rules.{r.name}", r.check) for r in spec.rules], *([("filter", spec.filter)] if spec.filter else [])]
    sql_aggs = [(f"aggregates.{a.name}", a.expr) for a in aggregates if getattr(a, "expr", None)]
    for field, expr in [*fields, *sql_aggs]:
        if isinstance(expr, str) and FRAME_PLACEHOLDER.search(expr):
            return (field, f"expected an expression without a name between two NUL characters (how the pass "
                           f"marks its inputs), found {expr!r}; write NUL as char(0)")
    for field, expr in [*fields, *sql_aggs]:
        if not isinstance(expr, str) or not re.search(r"\bas\b", expr, re.IGNORECASE):
            continue  # no `AS` anywhere: nothing to parse
        try:
            tree = sqlglot.parse_one(expr, read=DIALECT)
        except sqlglot.errors.SqlglotError:
            continue
        if isinstance(tree, exp.Alias):
            return (field, f"expected an expression without a top-level alias, found {expr!r}: drop "
                           f"'AS {tree.alias}' (the field's key names the column)")
    return None
