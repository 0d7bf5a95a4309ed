"""The parts a spec is built from: windows, aggregates, late-data policy, joins, row rules.

Frozen plain data, validated when built (`spec.py` validates how they fit together).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, Mapping

from .kinds import KINDS
from .windows import WindowShape, parse_duration


class RefreshPolicy(str, Enum):
    """How a flow may be brought up to date."""

    AUTO = "auto"  # incremental when provable, else refill the affected windows
    INCREMENTAL_STRICT = "incremental_strict"  # fail with the reason instead of refilling
    FULL = "full"  # always refill the partition


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of `size`, aligned to the UTC epoch."""

    size: timedelta | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", parse_duration(self.size))

    @property
    def shape(self) -> WindowShape:
        return WindowShape(self.size, self.size)


@dataclass(frozen=True)
class Hopping:
    """Overlapping windows of `size` starting every `slide` (slide must divide size)."""

    size: timedelta | str
    slide: timedelta | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", parse_duration(self.size))
        object.__setattr__(self, "slide", parse_duration(self.slide))

    @property
    def shape(self) -> WindowShape:
        return WindowShape(self.size, self.slide)


@dataclass(frozen=True)
class Agg:
    """One aggregate of a flow: `kind` over `column`, output as `name`.

    Build them with the class methods, e.g. `Agg.sum("quantity", name="volume")`.
    """

    kind: str
    column: str | None = None
    name: str | None = None
    quantile: float | None = None
    precision: int | None = None  # HLL lgConfigK, KLL k, or the items an approximate top-k tracks
    by: str | None = None  # min_by / max_by: the column whose extreme picks the row
    k: int | None = None  # top_k / approx_top_k: how many values to keep
    expr: str | None = None  # sql: the Spark SQL aggregate expression

    def __post_init__(self) -> None:
        if self.name is None:
            default = self.kind if self.column is None else f"{self.kind}_{self.column}"
            object.__setattr__(self, "name", default)

    @classmethod
    def count(cls, column: str | None = None, *, name: str | None = None) -> "Agg":
        """`count(*)` when no column is given, else the count of non-null values."""
        return cls("count", column, name)

    @classmethod
    def sum(cls, column: str, *, name: str | None = None) -> "Agg":
        return cls("sum", column, name)

    @classmethod
    def avg(cls, column: str, *, name: str | None = None) -> "Agg":
        return cls("avg", column, name)

    @classmethod
    def min(cls, column: str, *, name: str | None = None) -> "Agg":
        return cls("min", column, name)

    @classmethod
    def max(cls, column: str, *, name: str | None = None) -> "Agg":
        return cls("max", column, name)

    @classmethod
    def var_samp(cls, column: str, *, name: str | None = None) -> "Agg":
        return cls("var_samp", column, name)

    @classmethod
    def stddev_samp(cls, column: str, *, name: str | None = None) -> "Agg":
        return cls("stddev_samp", column, name)

    @classmethod
    def first(cls, column: str, *, name: str | None = None) -> "Agg":
        """Value at the earliest event time (ties: the smallest value); nulls ignored."""
        return cls("first", column, name)

    @classmethod
    def last(cls, column: str, *, name: str | None = None) -> "Agg":
        """Value at the latest event time (ties: the largest value); nulls ignored."""
        return cls("last", column, name)

    @classmethod
    def approx_count_distinct(cls, column: str, *, name: str | None = None, lg_config_k: int = 12) -> "Agg":
        """Distinct count from an HLL sketch (Spark's hll_sketch_agg / hll_union_agg)."""
        return cls("approx_count_distinct", column, name, precision=lg_config_k)

    @classmethod
    def approx_percentile(cls, column: str, quantile: float, *, name: str | None = None, k: int = 200) -> "Agg":
        """Quantile from a KLL sketch (Spark's kll_sketch_agg_double / kll_merge_agg_double)."""
        return cls("approx_percentile", column, name, quantile=quantile, precision=k)

    @classmethod
    def count_distinct(cls, column: str, *, name: str | None = None) -> "Agg":
        """Exact number of distinct non-null values (the set of values is the state; cannot retract)."""
        return cls("count_distinct", column, name)

    @classmethod
    def min_by(cls, column: str, by: str, *, name: str | None = None) -> "Agg":
        """`column` of the row with the smallest `by` (ties: the smallest value); null `by` ignored."""
        return cls("min_by", column, name, by=by)

    @classmethod
    def max_by(cls, column: str, by: str, *, name: str | None = None) -> "Agg":
        """`column` of the row with the largest `by` (ties: the largest value); null `by` ignored."""
        return cls("max_by", column, name, by=by)

    @classmethod
    def top_k(cls, column: str, k: int, *, name: str | None = None) -> "Agg":
        """The `k` largest non-null values, largest first (exact; a merge keeps k, a delete refills)."""
        return cls("top_k", column, name, k=k)

    @classmethod
    def approx_top_k(cls, column: str, k: int, *, name: str | None = None, max_items: int = 1000) -> "Agg":
        """The `k` most frequent values with their counts, from Spark's mergeable frequent-items
        sketch (approx_top_k_accumulate / approx_top_k_combine / approx_top_k_estimate)."""
        return cls("approx_top_k", column, name, precision=max_items, k=k)

    @classmethod
    def sql(cls, expr: str, *, name: str) -> "Agg":
        """Any Spark SQL aggregate expression over the source (and derived) columns, e.g.
        `percentile(price, 0.5)`. Its state does not merge, so the flow is refill-only: every run
        recomputes exactly the windows its changes touch (reason QUERY_NOT_INCREMENTALIZABLE)."""
        return cls("sql", None, name, expr=expr)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class LatePolicy:
    """What to do with changes to old partitions.

    By default every late row, correction and delete updates its windows. With
    `freeze_after`, a partition whose end is older than that before the newest
    source commit is frozen: runs leave it as it is and report the ignored changes.
    """

    freeze_after: timedelta | str | None = None

    def __post_init__(self) -> None:
        if self.freeze_after is not None:
            object.__setattr__(self, "freeze_after", parse_duration(self.freeze_after))


@dataclass(frozen=True)
class DimensionJoin:
    """A join with a small dimension table (fan-in); a change to it refills (`DIMENSION_CHANGED`)."""

    table: str
    on: tuple[str, ...]
    columns: tuple[str, ...]
    how: str = "inner"

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", as_tuple(self.on))
        object.__setattr__(self, "columns", as_tuple(self.columns))


@dataclass(frozen=True)
class FactJoin:
    """A flow's join with another fact table, read whole at its pinned version.

    The joined table's `columns` reach the flow as `<alias>__<column>` (e.g. `q__bid`), and `on`
    is Spark SQL over those names and the primary source's columns. Windows follow the primary
    source's event time, so a change to the primary recomputes the windows it touches; a change
    to the joined table recomputes every partition (`DIMENSION_CHANGED`). Such a flow is
    refill-only: it never merges partial states.
    """

    table: str
    alias: str
    on: str
    columns: tuple[str, ...]
    how: str = "inner"

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_tuple(self.columns))

    def column(self, name: str) -> str:
        """The flow-side name of the joined table's column `name`."""
        return f"{self.alias}__{name}"


@dataclass(frozen=True)
class RowRule:
    """A condition every good source row meets (Spark SQL over the raw source columns).

    A row for which `check` is false or NULL is not aggregated: it goes to the
    quarantine table of its source with the rule's name. `source` limits the rule
    to one source table of a fan-in (None: every source).
    """

    name: str
    check: str
    source: str | None = None


def agg_problem(agg: Agg) -> str | None:
    """What is wrong with one aggregate on its own (None: nothing)."""
    if agg.kind not in KINDS:
        return f"unknown aggregate {agg.kind!r}; expected one of {', '.join(KINDS)}"
    if agg.kind == "sql":
        if not (isinstance(agg.expr, str) and agg.expr.strip()):
            return f"aggregate 'sql' needs a Spark SQL aggregate expression (expr=...), found {agg.expr!r}"
    elif agg.column is None and KINDS[agg.kind].needs_column:
        return f"aggregate {agg.kind!r} needs a column"
    if agg.kind == "approx_percentile" and not (agg.quantile is not None and 0.0 <= agg.quantile <= 1.0):
        return f"approx_percentile needs a quantile in [0, 1], found {agg.quantile!r}"
    if agg.kind in ("min_by", "max_by") and not (isinstance(agg.by, str) and agg.by):
        return f"{agg.kind} needs the column whose extreme picks the row (by=...), found {agg.by!r}"
    if agg.kind in ("top_k", "approx_top_k") and not (isinstance(agg.k, int) and 1 <= agg.k <= 10_000):
        return f"{agg.kind} needs k between 1 and 10000, found {agg.k!r}"
    return None


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-/]{1,63}$")  # Dagster's rules for asset tags
_TAG_VALUE_RE = re.compile(r"^[A-Za-z0-9_.\-]{0,63}$")


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
        if not _NAME_RE.match(join.alias or "") or join.alias in aliases:
            return f"joins[{i}].alias", f"expected a unique identifier, found {join.alias!r}"
        if not (isinstance(join.on, str) and join.on.strip()):
            return f"joins[{i}].on", "expected a join condition (Spark SQL)"
        aliases.add(join.alias)
    if joins and rules:
        return ("rules", "row rules (quarantine) apply to a single source; a flow that joins fact tables takes none: "
                "put the rules on a stage it reads")
    return None


def as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def as_pairs(value: Mapping[str, str] | tuple | None) -> tuple[tuple[str, str], ...]:
    if not value:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)
