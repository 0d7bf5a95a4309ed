"""Which columns of a source a spec reads, and where: the columns it names (event time, keys,
aggregate columns, a stage's output columns and dimension join keys) and every column its
expressions use (rules, derived columns, the filter, SQL aggregates, fact-join conditions); a stage
that passes all columns through reads every one. `post` expressions read the results, not the source.

Expressions are parsed with sqlglot in the Spark dialect, so this needs no Spark session (and works
the same over Spark Connect): names are matched regardless of case, backticks and qualifiers
(`t.px`, a struct's `s.a`: every part counts) as Spark resolves them, lambda parameters are not
columns, and text sqlglot cannot parse counts every identifier in it. Over-counting a column only
makes a check stricter; missing one would let a run read a column the check never looked at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Set


def columns_read(spec, source: str, columns: Iterable[str]) -> dict[str, str]:
    """Each column of `columns` (a source's column names) that `spec` reads from `source`, lower-cased,
    with the first use found ("rule positive_px", "derived column notional", "the filter", ...)."""
    present = {c.lower() for c in columns}
    found: dict[str, str] = {}

    def add(names: Iterable[str], use: str, shadowed: Set[str] = frozenset()) -> None:
        for name in names:
            key = name.lower()
            if key in present and key not in shadowed and key not in found:
                found[key] = use

    derived = [(name.lower(), expr) for name, expr in spec.derived]
    after_derived = {name for name, _expr in derived} | {c.lower() for j in spec.fact_joins for c in map(j.column, j.columns)}
    add([spec.event_time], "the event time", after_derived)
    add(spec.key_columns, "a key", after_derived)
    for rule in spec.rules_for(source):  # rules read the raw source row, before derived columns
        add(expression_columns(rule.check), f"rule {rule.name}")
    for join in spec.fact_joins:
        add(expression_columns(join.on), f"the join with {join.table}")
    earlier: set[str] = set()
    for (name, expr), (original, _e) in zip(derived, spec.derived):
        add(expression_columns(expr), f"derived column {original}", earlier)
        earlier.add(name)
    if spec.filter:
        add(expression_columns(spec.filter), "the filter", after_derived)
    flow = spec.aggregation()
    for agg in flow.aggregates if flow is not None else ():
        add([c for c in (agg.column, agg.by) if c], f"aggregate {agg.name}", after_derived)
        if agg.expr:
            add(expression_columns(agg.expr), f"aggregate {agg.name}", after_derived)
    joined = {c.lower() for j in spec.dimension_joins for c in j.columns}
    add([c for j in spec.dimension_joins for c in j.on], "a dimension join", after_derived)
    if spec.reads_all_columns:
        add(sorted(present - after_derived), "passed through")
    else:
        add([c for c in spec.kept_columns if c.lower() not in joined], "an output column", after_derived)
    return found


def expression_columns(expr: str) -> set[str]:
    """The names a Spark SQL expression may read as columns (every part of a qualified name);
    every identifier in it when sqlglot cannot parse it."""
    import sqlglot
    from sqlglot import exp

    from .sql_dialect import DIALECT

    try:
        tree = sqlglot.parse_one(expr, read=DIALECT)
    except sqlglot.errors.SqlglotError:
        return _identifiers(expr)
    return {part.name for col in tree.find_all(exp.Column) for part in col.parts if part.name}


def _identifiers(expr: str) -> set[str]:
    import sqlglot
    from sqlglot.tokens import TokenType

    from .sql_dialect import DIALECT

    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(expr)
    except sqlglot.errors.SqlglotError:
        tokens = []
    skip = {TokenType.STRING, TokenType.NUMBER}
    names = {t.text for t in tokens if t.token_type not in skip}
    if not tokens:  # not even tokens: every word
        names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr))
    return names
