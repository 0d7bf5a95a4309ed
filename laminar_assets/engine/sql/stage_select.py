"""How the SELECT of a view without GROUP BY maps to a stage (sqlglot trees in, StageSpec fields out).

    SELECT src.*, expr AS c, d.col            -> every source column (or the listed ones), derived c, join column
    FROM src [LEFT] JOIN dim d ON src.k = d.k -> DimensionJoin(dim, on=k, columns=(col,)); USING (k) works too
    WHERE cond                                -> filter (over the source's columns: it runs before the join)
    QUALIFY ROW_NUMBER() OVER (PARTITION BY key ORDER BY <event time>) = 1
                                              -> dedup_key (the earliest row per key within a partition)
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from ..spec.parts import DimensionJoin
from .select import Fail, from_of, number, plain_sql, sql, table_of


def stage_fields(select: exp.Select, fail: Fail, *, event_time: str) -> dict[str, Any]:
    """StageSpec keyword arguments from a SELECT without GROUP BY."""
    table = table_of(from_of(select, fail), fail)
    src_alias = table.alias_or_name
    dims: dict[str, tuple[str, DimensionJoin]] = {}  # alias -> (table, join)
    for j in select.args.get("joins") or ():
        dim = table_of(j.this, fail)
        side, kind = (j.args.get("side") or "").upper(), (j.args.get("kind") or "").upper()
        how = "left" if side == "LEFT" and kind in ("", "OUTER") else "inner" if not side and kind in ("", "INNER") else None
        if how is None:
            fail(j, "a stage joins dimension tables with JOIN or LEFT JOIN only")
        on = _join_columns(j, src_alias, dim.alias_or_name, fail)
        dims[dim.alias_or_name] = (dim.name, DimensionJoin(dim.name, on=on, columns=(), how=how))
    for clause in ("having", "order", "limit", "distinct"):
        if select.args.get(clause):
            fail(select.args[clause], f"{clause.upper()} is not supported in a stage")
    columns: list[str] = []
    derived: list[tuple[str, str]] = []
    dim_columns: dict[str, list[str]] = {a: [] for a in dims}
    star = False
    for item in select.expressions:
        node, name = (item.this, item.alias) if isinstance(item, exp.Alias) else (item, None)
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            owner = node.table if isinstance(node, exp.Column) else ""
            if owner in dims or (not owner and dims):
                fail(node, "name the dimension columns a stage adds (e.g. d.sector) and use src.* for the source's")
            star = True
        elif isinstance(node, exp.Column) and node.table in dims:
            if name and name != node.name:
                fail(node, "dimension columns keep their names (no AS)")
            dim_columns[node.table].append(node.name)
            columns.append(node.name)
        elif isinstance(node, exp.Column) and not name:
            columns.append(node.name)
        else:
            if not name:
                fail(node, f"give {sql(node)!r} a name (AS name)")
            _source_only(node, dims, fail, "derived columns are computed before the join")
            if node.find(exp.AggFunc, exp.Window):
                fail(node, "a stage computes row by row: aggregates and window functions need GROUP BY a window")
            derived.append((name, plain_sql(node)))
            columns.append(name)
    where = select.args.get("where")
    if where is not None:
        _source_only(where, dims, fail, "WHERE filters the source's rows before the join")
    joins = tuple(DimensionJoin(t, on=j.on, columns=tuple(dim_columns[a]), how=j.how) for a, (t, j) in dims.items())
    return dict(source=table.name, event_time=event_time, derived=tuple(derived), joins=joins,
                columns=() if star else tuple(columns), filter=plain_sql(where.this) if where is not None else None,
                dedup_key=_dedup_key(select.args.get("qualify"), event_time, fail))


def _source_only(node: exp.Expression, dims: dict, fail: Fail, why: str) -> None:
    for col in node.find_all(exp.Column):
        if col.table in dims:
            fail(col, f"{sql(col)} is a dimension column: {why}")


def _join_columns(join: exp.Join, src: str, dim: str, fail: Fail) -> tuple[str, ...]:
    using = join.args.get("using")
    if using:
        return tuple(u.name for u in using)
    on = join.args.get("on")
    pairs = list(on.flatten()) if isinstance(on, exp.And) else [on]
    out = []
    for p in pairs:
        if not (isinstance(p, exp.EQ) and isinstance(p.this, exp.Column) and isinstance(p.expression, exp.Column)
                and p.this.name == p.expression.name and {p.this.table, p.expression.table} == {src, dim}):
            fail(p if isinstance(p, exp.Expression) else join,
                 f"join on equal column names, e.g. ON {src}.k = {dim}.k or USING (k)")
        out.append(p.this.name)
    return tuple(out)


def _dedup_key(qualify: exp.Qualify | None, event_time: str, fail: Fail) -> tuple[str, ...]:
    if qualify is None:
        return ()
    cond = qualify.this
    w = cond.this if isinstance(cond, exp.EQ) else None
    order = w.args.get("order") if isinstance(w, exp.Window) else None
    ordered = order.expressions if order is not None else []
    if not (isinstance(w, exp.Window) and isinstance(w.this, exp.RowNumber) and number(cond.expression) == 1
            and w.args.get("partition_by") and all(isinstance(p, exp.Column) for p in w.args["partition_by"])
            and len(ordered) == 1 and isinstance(ordered[0].this, exp.Column)
            and ordered[0].this.name == event_time and not ordered[0].args.get("desc")):
        fail(cond, f"QUALIFY supports the dedup form only: ROW_NUMBER() OVER (PARTITION BY key ORDER BY {event_time}) "
                   "= 1 (keeps the earliest row of each key within the partition)")
    return tuple(p.name for p in w.args["partition_by"])
