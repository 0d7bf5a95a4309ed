"""The parts a spec is built from: windows, aggregates, late-data policy, joins, row rules.

Frozen plain data, validated when built (`specs.py` validates how they fit together).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, cast

from ..windows import WindowShape, parse_duration


class RefreshPolicy(str, Enum):
    """How a flow may be brought up to date."""

    AUTO = "auto"  # incremental when provable, else refill the affected windows
    INCREMENTAL_STRICT = "incremental_strict"  # fail with the reason instead of refilling
    FULL = "full"  # always refill the partition


def duration_or_given(value: Any) -> Any:
    """`value` as a timedelta, or as given when it is not a duration (see `lenient`)."""
    return lenient(parse_duration, value)


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of `size`, aligned to the UTC epoch."""

    size: timedelta | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", duration_or_given(self.size))

    @property
    def shape(self) -> WindowShape:  # a duration in any flow (window_problem refuses others)
        return WindowShape(cast(timedelta, self.size), cast(timedelta, self.size))


@dataclass(frozen=True)
class Hopping:
    """Overlapping windows of `size` starting every `slide` (slide must divide size)."""

    size: timedelta | str
    slide: timedelta | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", duration_or_given(self.size))
        object.__setattr__(self, "slide", duration_or_given(self.slide))

    @property
    def shape(self) -> WindowShape:  # durations in any flow (window_problem refuses others)
        return WindowShape(cast(timedelta, self.size), cast(timedelta, self.slide))


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

    @property
    def output(self) -> str:
        """The output column's name: `name`, which `__post_init__` sets when it is not given."""
        return self.name if self.name is not None else self.kind

    @classmethod
    def count(cls, column: str | None = None, *, name: str | None = None) -> Agg:
        """`count(*)` when no column is given, else the count of non-null values."""
        return cls("count", column, name)

    @classmethod
    def sum(cls, column: str, *, name: str | None = None) -> Agg:
        return cls("sum", column, name)

    @classmethod
    def avg(cls, column: str, *, name: str | None = None) -> Agg:
        return cls("avg", column, name)

    @classmethod
    def min(cls, column: str, *, name: str | None = None) -> Agg:
        return cls("min", column, name)

    @classmethod
    def max(cls, column: str, *, name: str | None = None) -> Agg:
        return cls("max", column, name)

    @classmethod
    def var_samp(cls, column: str, *, name: str | None = None) -> Agg:
        return cls("var_samp", column, name)

    @classmethod
    def stddev_samp(cls, column: str, *, name: str | None = None) -> Agg:
        return cls("stddev_samp", column, name)

    @classmethod
    def first(cls, column: str, *, name: str | None = None) -> Agg:
        """Value at the earliest event time (ties: the smallest value); nulls ignored."""
        return cls("first", column, name)

    @classmethod
    def last(cls, column: str, *, name: str | None = None) -> Agg:
        """Value at the latest event time (ties: the largest value); nulls ignored."""
        return cls("last", column, name)

    @classmethod
    def approx_count_distinct(cls, column: str, *, name: str | None = None, lg_config_k: int = 12) -> Agg:
        """Distinct count from an HLL sketch (Spark's hll_sketch_agg / hll_union_agg)."""
        return cls("approx_count_distinct", column, name, precision=lg_config_k)

    @classmethod
    def approx_percentile(cls, column: str, quantile: float, *, name: str | None = None, k: int = 200) -> Agg:
        """Quantile from a KLL sketch (Spark's kll_sketch_agg_double / kll_merge_agg_double)."""
        return cls("approx_percentile", column, name, quantile=quantile, precision=k)

    @classmethod
    def count_distinct(cls, column: str, *, name: str | None = None) -> Agg:
        """Exact number of distinct non-null values (the set of values is the state; cannot retract)."""
        return cls("count_distinct", column, name)

    @classmethod
    def min_by(cls, column: str, by: str, *, name: str | None = None) -> Agg:
        """`column` of the row with the smallest `by` (ties: the smallest value); null `by` ignored."""
        return cls("min_by", column, name, by=by)

    @classmethod
    def max_by(cls, column: str, by: str, *, name: str | None = None) -> Agg:
        """`column` of the row with the largest `by` (ties: the largest value); null `by` ignored."""
        return cls("max_by", column, name, by=by)

    @classmethod
    def top_k(cls, column: str, k: int, *, name: str | None = None) -> Agg:
        """The `k` largest non-null values, largest first (exact; a merge keeps k, a delete refills)."""
        return cls("top_k", column, name, k=k)

    @classmethod
    def approx_top_k(cls, column: str, k: int, *, name: str | None = None, max_items: int = 1000) -> Agg:
        """The `k` most frequent values with their counts, from Spark's mergeable frequent-items
        sketch (approx_top_k_accumulate / approx_top_k_combine / approx_top_k_estimate)."""
        return cls("approx_top_k", column, name, precision=max_items, k=k)

    @classmethod
    def sql(cls, expr: str, *, name: str) -> Agg:
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
            object.__setattr__(self, "freeze_after", duration_or_given(self.freeze_after))


@dataclass(frozen=True)
class DimensionJoin:
    """A join with a small dimension table (fan-in); a change to it refills (`DIMENSION_CHANGED`)."""

    table: str
    on: tuple[str, ...]
    columns: tuple[str, ...]
    how: str = "inner"

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", lenient(as_tuple, self.on))
        object.__setattr__(self, "columns", lenient(as_tuple, self.columns))


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
        object.__setattr__(self, "columns", lenient(as_tuple, self.columns))

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


def as_tuple(value: Any) -> tuple:
    """None: (); a string or any other single value: a 1-tuple (the spec then says what it expected of the
    value); a list, tuple or other iterable: its items."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return (value,)
    return tuple(value)


def as_pairs(value: Mapping[str, str] | tuple | None) -> tuple[tuple[str, str], ...]:
    """A mapping or (key, value) pairs as a tuple of string pairs; a ValueError naming what was found for
    anything else."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        items = list(value)
    else:
        raise ValueError(f"expected a mapping of names to expressions, found {value!r}")
    for item in items:
        if isinstance(item, (str, bytes)) or not isinstance(item, Iterable) or len(tuple(item)) != 2:
            raise ValueError(f"expected (name, expression) pairs, found {item!r}")
    return tuple((str(k), str(v)) for k, v in items)


def lenient(convert, value: Any) -> Any:
    """`convert(value)`, or `value` as given when it does not convert: a part keeps what it was given, and the
    spec holding it names itself and the field in its error, which a part alone cannot."""
    try:
        return convert(value)
    except (TypeError, ValueError):
        return value
