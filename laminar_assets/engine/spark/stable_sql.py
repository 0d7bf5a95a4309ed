"""Spark SQL text whose generated code stays the same whatever a run's values are.

Spark compiles each query stage to Java. Number and timestamp literals are written into that code;
map, array, struct and string literals are handed to it as references. A predicate spelled with a
run's timestamps, partition numbers or commit versions is therefore new code on every run: compiled
again and run cold until the JVM's JIT catches up (docs/PERFORMANCE.md has the cost). Written as
lookups in map literals, a run's code matches the previous run's, so Spark's code cache
and the JIT's work carry over. Each function falls back to the plain form when a lookup would
not fit (more than `MAX_KEYS` keys, or a partition with two pieces), where that plain form wins.
"""

from __future__ import annotations

from ..windows import Granularity, partition_id_sql, pieces_by_partition
from ..windows import in_ranges_sql as plain_ranges_sql

# Map lookups scan their keys (Spark has no hashed map literal); a plain `IN` list of many values is
# hashed. Beyond this many keys the plain form is used (such a run is large, its compile time small).
MAX_KEYS = 64


def bigint(value: int | None) -> str:
    """A BIGINT literal (typed NULL for None)."""
    return "CAST(NULL AS BIGINT)" if value is None else f"{int(value)}L"


def in_ranges_sql(col: str, ranges, granularity: Granularity) -> str:
    """Timestamp column `col` lies in one of the [start, end) `ranges` (`windows.in_ranges_sql`),
    false (never NULL) otherwise; each partition's piece of the ranges is looked up by `col`'s
    partition number."""
    pieces = pieces_by_partition(ranges, granularity, limit=MAX_KEYS)
    if pieces is None:
        return f"coalesce({plain_ranges_sql(col, ranges)}, false)"
    if not pieces:
        return "false"
    us = f"unix_micros(`{col.replace('`', '``')}`)"
    part = partition_id_sql(col, granularity)
    lo = "map(" + ", ".join(f"{p}L, {a}L" for p, (a, _) in pieces.items()) + ")"
    hi = "map(" + ", ".join(f"{p}L, {b}L" for p, (_, b) in pieces.items()) + ")"
    return f"coalesce({us} >= element_at({lo}, {part}) AND {us} < element_at({hi}, {part}), false)"


def contains_sql(values_by_key: dict[int, tuple[int, ...]], key_sql: str, value_sql: str) -> str:
    """`value_sql` is one of the values listed for `key_sql` (BIGINT expressions); false otherwise,
    also when either is NULL."""
    if not values_by_key:
        return "false"
    if len(values_by_key) > MAX_KEYS:
        by_values: dict[tuple[int, ...], list[int]] = {}
        for key, values in values_by_key.items():
            by_values.setdefault(tuple(values), []).append(key)
        terms = [f"({key_sql} IN ({', '.join(map(str, keys))}) AND {value_sql} IN ({', '.join(map(str, vs))}))"
                 for vs, keys in by_values.items()]
        return f"coalesce({' OR '.join(terms)}, false)"
    entries = ", ".join(f"{k}L, array({', '.join(bigint(v) for v in vs)})" for k, vs in values_by_key.items())
    return f"coalesce(array_contains(element_at(map({entries}), {key_sql}), {value_sql}), false)"
