"""How the SELECT of a materialized view maps to a flow or a stage (sqlglot trees in, spec fields out).

Flow (a SELECT grouped by a window):
    GROUP BY keys, TUMBLE(ts, size) | HOP(ts, slide, size)   -> keys, window, event_time = ts
    SUM(x) AS s, MIN_BY(x, y) AS m, ...                       -> aggregates (the merge algebra)
    SUM(price * quantity) AS notional                         -> derived column `_in_notional`, summed
    SUM(a) / SUM(b) AS ratio, RANK() OVER (PARTITION BY window_start ...)
                                                              -> post expression (hidden aggregates)
    PERCENTILE(x, 0.5) AS p, any other aggregate              -> `Agg.sql`: refill-only
    WHERE cond                                                -> filter
    FROM t JOIN q ON ... | LEFT JOIN q USING (k)              -> FactJoin (q read whole, its columns q__col);
                                                                 refill-only, windows follow t
A view without GROUP BY is a stage: see stage_select.py.

`fail(node, message)` raises the caller's error (it knows the file and the line).
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from ..spec.parts import Agg, FactJoin
from ..spec.sql_dialect import DIALECT
from .window_calls import Fail, is_window, same_window, window_of

WINDOW_COLUMNS = ("window_start", "window_end")


def sql(node: exp.Expression) -> str:
    return node.sql(dialect=DIALECT)


def flow_fields(select: exp.Select, fail: Fail) -> dict[str, Any]:
    """FlowSpec keyword arguments from a grouped SELECT."""
    source, joins = _sources(select, fail)
    _unqualify(select)
    window, event_time, keys, grouped = None, None, [], None
    named = {sql(i.this): i.alias for i in select.expressions if isinstance(i, exp.Alias) and not _top_aggregate(i.this)}
    key_derived: dict[str, str] = {}  # a GROUP BY expression the select list names: a derived key column
    for g in select.args["group"].expressions:
        if is_window(g):
            if window is not None:
                fail(g, "a flow groups by one window (TUMBLE or HOP), found a second one")
            window, event_time = window_of(g, fail)
            grouped = g
        elif isinstance(g, exp.Column):
            keys.append(g.name)
        elif sql(g) in named and not g.find(exp.AggFunc):  # e.g. payload:sym::string AS sym (#63)
            key_derived[named[sql(g)]] = sql(g)
            keys.append(named[sql(g)])
        else:
            fail(g, "GROUP BY takes columns, expressions the select list names (expr AS name) and one TUMBLE(...) "
                    "or HOP(...); name this key in the select list, or compute it in a stage (a view without "
                    "GROUP BY) and group by its column")
    if window is None:
        fail(select.args["group"], "a flow groups by a window: add TUMBLE(ts, INTERVAL '1' MINUTE) or "
                                   "HOP(ts, slide, size) to GROUP BY")
    assert event_time is not None and grouped is not None  # set with the window
    for clause in ("having", "order", "limit", "qualify", "distinct"):
        if select.args.get(clause):
            fail(select.args[clause], f"{clause.upper()} is not supported in a flow; put it in a query over the sink")
    for item in select.expressions:  # a window anywhere in the select list is the GROUP BY's
        for call in [item, *item.find_all(exp.Anonymous)]:
            if is_window(call):
                same_window(call, window, event_time, grouped, fail)
    builder = _AggBuilder(fail)
    post: list[tuple[str, str]] = []
    for item in select.expressions:
        node, name = (item.this, item.alias) if isinstance(item, exp.Alias) else (item, None)
        if isinstance(node, exp.Column):
            if node.name in keys or node.name in WINDOW_COLUMNS:
                continue
            fail(node, f"column {node.name!r} is neither in GROUP BY nor inside an aggregate")
        if is_window(node):
            continue  # the window is written as window_start and window_end
        if name in key_derived and sql(node) == key_derived[name]:
            continue  # a derived key: written as its column
        if not name:
            fail(node, f"give {sql(node)!r} a name (AS name)")
        if _top_aggregate(node):
            builder.add(node, name)
        else:
            post.append((name, builder.post_expression(node, name, keys)))
    where = select.args.get("where")
    if where is not None and where.find(exp.AggFunc):
        fail(where, "WHERE filters rows before aggregation and cannot use an aggregate")
    return dict(source=source, joins=joins, event_time=event_time, window=window, keys=tuple(keys),
                aggregates=tuple(builder.aggs), derived=(*key_derived.items(), *builder.derived.items()), post=tuple(post),
                hidden=tuple(builder.hidden), filter=sql(where.this) if where is not None else None)


class _AggBuilder:
    """Aggregates of a flow's select list, shared between items (SUM(q) in `volume` and in `vwap`)."""

    def __init__(self, fail: Fail) -> None:
        self.fail = fail
        self.aggs: list[Agg] = []
        self.hidden: list[str] = []
        self.derived: dict[str, str] = {}
        self._by_sql: dict[str, str] = {}  # canonical aggregate SQL -> output name

    def add(self, node: exp.Expression, name: str, hidden: bool = False) -> str:
        key = sql(node)
        if key in self._by_sql and hidden:
            return self._by_sql[key]
        agg = self._agg(node, name)
        self.aggs.append(agg)
        self._by_sql.setdefault(key, name)
        if hidden:
            self.hidden.append(name)
        return name

    def post_expression(self, node: exp.Expression, name: str, keys: list[str]) -> str:
        """`node` with every aggregate replaced by its (possibly hidden) output column."""
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n.parent, exp.Window) and n.arg_key == "this":
                return n  # RANK() in RANK() OVER (...) is the window function itself
            if _top_aggregate(n):
                return exp.column(self.add(n, f"_{name}_{len(self.hidden) + 1}", hidden=True))
            if is_window(n):
                return exp.column("window_start")
            return n

        out = node.transform(swap)
        for w in out.find_all(exp.Window):
            parts = {p.name for p in w.args.get("partition_by") or () if isinstance(p, exp.Column)}
            if "window_start" not in parts:
                self.fail(w, "a window function over a flow's results must PARTITION BY the window (TUMBLE/HOP or "
                             "window_start): a run recomputes one partition's windows at a time")
        known = set(keys) | {a.name for a in self.aggs} | set(WINDOW_COLUMNS)
        for col in out.find_all(exp.Column):
            if col.name not in known:
                call = _unknown_function_around(col)
                if call is not None:
                    self.fail(call, unknown_function_message(call))
                self.fail(col, f"column {col.name!r} is neither in GROUP BY nor inside an aggregate")
        return sql(out)

    def _column(self, node: exp.Expression, name: str, role: str) -> str:
        if isinstance(node, exp.Column):
            return node.name
        text = sql(node)
        for col, expr in self.derived.items():
            if expr == text:
                return col
        col = f"_{role}_{name.lstrip('_')}"
        self.derived[col] = text
        return col

    def _agg(self, node: exp.Expression, name: str) -> Agg:
        col = lambda n, role="in": self._column(n, name, role)  # noqa: E731
        inner = node.this if isinstance(node, exp.IgnoreNulls) else node
        arg = inner.this if isinstance(inner, exp.AggFunc) else None
        if isinstance(arg, exp.Distinct) and not (isinstance(inner, exp.Count) and len(arg.expressions) == 1):
            return Agg.sql(sql(node), name=name)
        if isinstance(inner, exp.Count):
            if arg is None or isinstance(arg, exp.Star):
                return Agg.count(name=name)
            if isinstance(arg, exp.Distinct):
                return Agg.count_distinct(col(arg.expressions[0]), name=name)
            return Agg.count(col(arg), name=name)
        simple: dict[type[exp.Expression], str] = {
                  exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max", exp.Variance: "var_samp",
                  exp.Stddev: "stddev_samp", exp.StddevSamp: "stddev_samp",
                  exp.First: "first", exp.Last: "last"}
        kind = simple.get(type(inner))
        if kind and len([v for v in inner.args.values() if v]) == 1:
            return Agg(kind, col(arg), name)
        if isinstance(inner, exp.ApproxDistinct) and not inner.args.get("accuracy"):
            return Agg.approx_count_distinct(col(arg), name=name)
        if isinstance(inner, exp.ApproxQuantile) and (quantile := number(inner.args.get("quantile"))) is not None \
                and not inner.args.get("accuracy"):
            return Agg.approx_percentile(col(arg), quantile, name=name)
        if isinstance(inner, (exp.ArgMin, exp.ArgMax)):
            kind = "min_by" if isinstance(inner, exp.ArgMin) else "max_by"
            return Agg(kind, col(arg), name, by=col(inner.expression, "by"))
        if isinstance(inner, exp.ApproxTopK) and (k := number(inner.expression)) is not None:
            items = number(inner.args.get("counters")) if inner.args.get("counters") else 1000
            if items is None:
                self.fail(inner.args["counters"], "APPROX_TOP_K's third argument (how many items it tracks) must be a "
                                                  "number, like APPROX_TOP_K(col, 5, 1000)")
            return Agg.approx_top_k(col(arg), int(k), name=name, max_items=int(items))
        if isinstance(inner, exp.Anonymous) and inner.name.upper() == "TOP_K" and len(inner.expressions) == 2 \
                and (k := number(inner.expressions[1])) is not None:
            return Agg.top_k(col(inner.expressions[0]), int(k), name=name)
        return Agg.sql(sql(node), name=name)  # an aggregate the algebra does not know: refill-only


# Spark SQL aggregate functions sqlglot's Spark dialect does not know (it parses them as plain calls):
# aggregates like any other it does not know, computed refill-only (`Agg.sql`).
SPARK_ONLY_AGGREGATES = ("EVERY", "HISTOGRAM_NUMERIC", "TRY_SUM", "TRY_AVG", "BITMAP_CONSTRUCT_AGG", "BITMAP_OR_AGG",
                         "HLL_SKETCH_AGG", "HLL_UNION_AGG", "KLL_SKETCH_AGG_BIGINT", "KLL_SKETCH_AGG_DOUBLE",
                         "KLL_SKETCH_AGG_FLOAT", "KLL_MERGE_AGG_BIGINT", "KLL_MERGE_AGG_DOUBLE", "KLL_MERGE_AGG_FLOAT",
                         "APPROX_TOP_K_ACCUMULATE", "APPROX_TOP_K_COMBINE", "REGR_SXY", "REGR_SXX", "REGR_SYY",
                         "REGR_R2", "REGR_AVGX", "REGR_AVGY", "REGR_COUNT", "REGR_INTERCEPT", "REGR_SLOPE")


def _top_aggregate(node: exp.Expression) -> bool:
    if isinstance(node, exp.Window):
        return False
    if isinstance(node, (exp.AggFunc, exp.Filter)) or (isinstance(node, exp.IgnoreNulls) and isinstance(node.this, exp.AggFunc)):
        return True
    return isinstance(node, exp.Anonymous) and (node.name.upper() == "TOP_K" or node.name.upper() in SPARK_ONLY_AGGREGATES)


def _unknown_function_around(col: exp.Column) -> exp.Anonymous | None:
    """The innermost call of a function sqlglot does not know that holds `col` (None: none)."""
    node = col.parent
    while node is not None:
        if isinstance(node, exp.Anonymous) and not is_window(node):
            return node
        node = node.parent
    return None


def unknown_function_message(call: exp.Anonymous) -> str:
    """Why a call of a function that is no aggregate Laminar knows fails, with the names it may mean."""
    import difflib

    known = sorted({n for cls in _aggregate_classes() for n in cls.sql_names()} | {"TOP_K", *SPARK_ONLY_AGGREGATES})
    close = difflib.get_close_matches(call.name.upper(), known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return (f"unknown function {call.name}(...): it is no aggregate function of Spark SQL that Laminar knows, so "
            f"the columns inside it are neither grouped nor aggregated; {hint}a flow's select list takes GROUP BY "
            "columns, aggregates (SUM, COUNT, AVG, MIN, MAX, ...) and expressions over them")


def _aggregate_classes() -> list[type[exp.AggFunc]]:
    out, todo = [], [exp.AggFunc]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return [c for c in out if c is not exp.AggFunc]


def number(node: exp.Expression | None) -> float | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
    return None


def _sources(select: exp.Select, fail: Fail) -> tuple[str, tuple[FactJoin, ...]]:
    """The FROM table and the fact tables JOINed to it. Columns of a joined table `q` become `q__col`
    throughout the SELECT (unqualified columns are the FROM table's); windows follow the FROM table."""
    base = table_of(from_of(select, fail), fail)
    if not select.args.get("joins"):
        return base.name, ()
    primary = base.alias_or_name
    for g in select.args["group"].expressions:
        ts = g.expressions[0] if is_window(g) and g.expressions else None
        if isinstance(ts, exp.Column) and ts.table and ts.table != primary:
            fail(ts, f"the window's time column must be of the FROM table {primary!r} (windows follow its rows): "
                     "swap the tables")
    joins: dict[str, dict] = {}
    for j in select.args["joins"]:
        table = table_of(j.this, fail)
        how = {"": "inner", "INNER": "inner", "LEFT": "left"}.get((j.side or j.kind or "").upper())
        if how is None or (j.kind or "").upper() == "CROSS":
            fail(j, "a flow joins fact tables with JOIN or LEFT JOIN (windows follow the FROM table's rows, so "
                    "RIGHT, FULL and CROSS joins cannot be computed per window)")
        alias = table.alias_or_name
        if alias == primary or alias in joins:
            fail(j, f"table alias {alias!r} is used twice: give each table its own alias")
        if j.args.get("using"):
            cond = " AND ".join(f"{u.name} = {alias}__{u.name}" for u in j.args["using"])
            on = exp.condition(cond) if cond else None
        else:
            on = j.args.get("on")
        if on is None:
            fail(j, "a JOIN in a flow needs ON <condition> or USING (columns)")
        joins[alias] = dict(table=table.name, alias=alias, on=on, how=how, columns=[])

    def rename(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or not node.table:
            return node
        if node.table == primary:
            return exp.column(node.name)
        if node.table not in joins:
            fail(node, f"unknown table {node.table!r}; expected {primary!r} or one of {sorted(joins)}")
        cols = joins[node.table]["columns"]
        if node.name not in cols:
            cols.append(node.name)
        return exp.column(f"{node.table}__{node.name}")

    for key in ("expressions", "where", "group"):
        if select.args.get(key) is not None:
            value = select.args[key]
            select.set(key, [v.transform(rename) for v in value] if isinstance(value, list) else value.transform(rename))
    for alias, j in joins.items():
        j["on"] = sql(j["on"].transform(rename))
        for u in select.args["joins"]:
            if u.args.get("using") and table_of(u.this, fail).alias_or_name == alias:
                j["columns"] += [c.name for c in u.args["using"] if c.name not in j["columns"]]
    return base.name, tuple(FactJoin(j["table"], j["alias"], j["on"], tuple(j["columns"]), j["how"])
                            for j in joins.values())


def from_of(select: exp.Select, fail: Fail) -> exp.Expression:
    src = select.args.get("from_")
    if src is None:
        fail(select, "expected FROM <table>")
    return src.this


def table_of(node: exp.Expression, fail: Fail) -> exp.Table:
    if not isinstance(node, exp.Table) or not node.name:
        fail(node, "expected a table name (a subquery is not supported: define it as its own view)")
    return node


def _unqualify(tree: exp.Expression) -> None:
    """Drop table qualifiers: a flow reads one table, so `t.price` is `price`."""
    for col in list(tree.find_all(exp.Column)):
        if col.table:
            col.set("table", None)


def plain_sql(node: exp.Expression) -> str:
    """Spark SQL of an expression over the source's columns, without qualifiers."""
    copy = node.copy()
    _unqualify(copy)
    return sql(copy)
