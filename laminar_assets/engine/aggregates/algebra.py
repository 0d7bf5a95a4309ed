"""The aggregate algebra: state columns, partial state from rows, merge, retract, finalize.

For every aggregate, `merge` is associative and commutative with the empty
state as identity, so state can be built from any split of the rows. Partial
states are signed: a deleted row (or an update pre-image) contributes with
sign -1. Only retractable kinds (`kinds.KINDS`) accept negative partials; the
planner refills the affected windows for the others.

Retracting from floating-point state can lose precision: subtracting 1e13 from
a sum that held it leaves the rounding error of 1e13 in a sum of ~1e4. Float
sums, averages and variances therefore also keep how large their contributions
were (gross magnitude, counts, extremes; all merge by plain sums and min/max).
`lost()` says when a window that saw a retraction can no longer be trusted to
1e-9 relative; the run then recomputes that window (reason PRECISION_LOSS).

Expressions are Spark SQL text: one analyzer call each, and readable in `explain`.
The numeric and ordered kinds live here, the sketch/set/pick kinds in `sets.py`, their base
`AggImpl` in `base.py`; `implementation()` maps every kind of `kinds.KINDS` to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyspark.sql.types import DataType, DecimalType, IntegralType, NumericType

from ..spec.kinds import KINDS
from ..spec.specs import Agg
from .base import EVENT_TS, PRECISION_RATIO, ROWS, SIGN, AggImpl, q  # noqa: F401  (re-exported)
from .sets import DistinctSet, DistinctSketch, FrequentSketch, QuantileSketch, Query, TopK


def _retracted(sign: str, expr: str) -> str:
    """`expr` (an aggregate over the group's rows) when the group holds retracted rows, else 0."""
    return f"CASE WHEN {sign} < 0 THEN {expr} ELSE 0 END"


class _Count(AggImpl):
    PARTS = ("c",)

    def partial_exprs(self, sign):
        target = "count(1)" if self.agg.column is None else f"count({self.x})"
        return [f"{sign} * {target}"]

    def merge_exprs(self):
        return [f"sum({self.s('c')})"]

    def finalize_expr(self):
        return f"CAST({self.s('c')} AS BIGINT)"


class _Sum(AggImpl):
    """Signed sum and non-null count. Float sums also keep `ga` (sum of |x| over every row merged,
    inserted or retracted) and `gr` (the same over retracted rows only)."""

    @property
    def _float(self) -> bool:
        return self.agg.kind == "avg" or not isinstance(self.input_type, IntegralType)

    @property
    def parts(self) -> tuple[str, ...]:
        return ("s", "nn", "ga", "gr") if self._float else ("s", "nn")

    def _cast(self) -> str:
        return f"CAST({self.x} AS {'DOUBLE' if self._float else 'BIGINT'})"

    def partial_exprs(self, sign):
        out = [f"{sign} * coalesce(sum({self._cast()}), 0)", f"{sign} * count({self.x})"]
        if self._float:
            gross = f"coalesce(sum(abs({self._cast()})), 0D)"
            out += [gross, _retracted(sign, gross)]
        return out

    def merge_exprs(self):
        return [f"sum({self.s(p)})" for p in self.parts]

    def finalize_expr(self):
        return f"CASE WHEN {self.s('nn')} > 0 THEN {self.s('s')} END"

    def lost_expr(self):
        if not self._float:
            return None  # BIGINT sums are exact
        return f"({self.s('gr')} > 0 AND {self.s('ga')} > {PRECISION_RATIO!r}D * abs({self.s('s')}))"


class _Avg(_Sum):
    def finalize_expr(self):
        return f"CASE WHEN {self.s('nn')} > 0 THEN {self.s('s')} / {self.s('nn')} END"


class _Variance(AggImpl):
    """Moments (n, mean, M2) merged with Chan's parallel formula, stable for signed parts.

    Guard columns: `cg` rows merged (inserted or retracted), `cr` rows retracted, `lo`/`hi` the
    extremes of every value ever merged. Every term Chan's formula adds is at most cg * (hi - lo)^2,
    so its rounding error after a retraction is bounded by that magnitude."""

    PARTS = ("n", "mean", "m2", "cg", "cr", "lo", "hi")

    @property
    def _gmean(self) -> str:
        return q(f"__g_{self.agg.name}_mean")

    def partial_exprs(self, sign):
        x = f"CAST({self.x} AS DOUBLE)"
        return [f"{sign} * count({x})", f"avg({x})", f"{sign} * coalesce(var_pop({x}) * count({x}), 0D)",
                f"count({x})", _retracted(sign, f"count({x})"), f"min({x})", f"max({x})"]

    def pre_merge_exprs(self, group):
        n, mean = self.s("n"), self.s("mean")
        over = f"OVER (PARTITION BY {', '.join(q(g) for g in group)})"
        total = f"sum({n}) {over}"
        weighted = f"sum(coalesce({n} * {mean}, 0D)) {over}"
        return [f"CASE WHEN {total} != 0 THEN {weighted} / {total} END AS {self._gmean}"]

    def merge_exprs(self):
        n, mean, m2, g = self.s("n"), self.s("mean"), self.s("m2"), self._gmean
        spread = f"coalesce({n} * ({mean} - {g}) * ({mean} - {g}), 0D)"
        return [f"sum({n})", f"max({g})", f"sum(coalesce({m2}, 0D) + {spread})",
                f"sum({self.s('cg')})", f"sum({self.s('cr')})", f"min({self.s('lo')})", f"max({self.s('hi')})"]

    def finalize_expr(self):
        n = self.s("n")
        var = f"CASE WHEN {n} > 1 THEN greatest({self.s('m2')}, 0D) / ({n} - 1) END"
        return var if self.agg.kind == "var_samp" else f"sqrt({var})"

    def lost_expr(self):
        spread = f"({self.s('hi')} - {self.s('lo')})"
        return (f"({self.s('cr')} > 0 AND {self.s('n')} > 1 AND "
                f"{self.s('cg')} * {spread} * {spread} > {PRECISION_RATIO!r}D * {self.s('m2')})")


def _over(group) -> str:
    """A window over the rows of each group (over all rows when there are no group columns)."""
    return f"OVER (PARTITION BY {', '.join(q(g) for g in group)})" if group else "OVER ()"


@dataclass(frozen=True)
class _HeldExtreme(AggImpl):
    """The smallest or largest candidate of a group (`_fn`), and how many rows hold it (`c`, signed).

    A partial keeps its rows' extreme and, signed, how many of them hold it; a merge keeps the
    extreme of its states and sums the counts of the states that hold it: the (extreme, count at
    the extreme) monoid, associative and commutative, identity = no rows. A retracted row that
    does not hold the group's extreme changes nothing; one that does lowers the count. When the
    count reaches 0 with rows left, the true extreme is some value the state never kept: `gone_expr`
    says so and the run recomputes the group (reason EXTREME_RETRACTED). Every retracted row was
    merged before, so it is never beyond the extreme; a count below 0 is recomputed too.

    `exact_holders`: a partial counts every row holding its extreme, through a window over its rows
    (which costs a sort of them). Without it, a partial of added rows counts one holder and a
    partial of retracted rows counts all of its rows: the state's count is then a lower bound of
    the holders, so it can only reach 0 early (a tie recomputes its group, exactly), never late."""

    VALUE: ClassVar[str] = "m"
    exact_holders: bool = True

    @property
    def parts(self) -> tuple[str, ...]:
        return (self.VALUE, "c")

    @property
    def _fn(self) -> str:
        return "min" if self.agg.kind == "min" else "max"

    def candidate(self) -> str:
        """SQL over one input row: what is compared; NULL for a row that can never hold the extreme."""
        return self.x

    @property
    def _at(self) -> str:  # the extreme of a partial's rows, on each of them
        return q(f"__x_{self.agg.name}")

    @property
    def _merged_at(self) -> str:  # the extreme of a merge's states, on each of them
        return q(f"__g_{self.agg.name}_x")

    def pre_partial_exprs(self, group):
        return [f"{self._fn}({self.candidate()}) {_over(group)} AS {self._at}"] if self.exact_holders else []

    def partial_exprs(self, sign):
        cand = self.candidate()
        if self.exact_holders:
            holders = f"count_if({cand} <=> {self._at})"
        else:
            holders = f"CASE WHEN {sign} > 0 THEN least(count({cand}), 1L) ELSE count({cand}) END"
        return [f"{self._fn}({cand})", f"{sign} * {holders}"]

    def pre_merge_exprs(self, group):
        return [f"{self._fn}({self.s(self.VALUE)}) {_over(group)} AS {self._merged_at}"]

    def merge_exprs(self):
        v = self.s(self.VALUE)
        return [f"{self._fn}({v})", f"sum(CASE WHEN {v} <=> {self._merged_at} THEN {self.s('c')} ELSE 0L END)"]

    def finalize_expr(self):
        return self.s(self.VALUE)

    def gone_expr(self):
        return f"({self.s(self.VALUE)} IS NOT NULL AND {self.s('c')} <= 0)"


class _Extreme(_HeldExtreme):
    """MIN / MAX."""


class _FirstLast(_HeldExtreme):
    """Value at the earliest (first) or latest (last) event time; ties broken by value."""

    VALUE = "p"

    @property
    def _fn(self) -> str:
        return "min" if self.agg.kind == "first" else "max"

    def candidate(self):
        return f"CASE WHEN {self.x} IS NOT NULL THEN named_struct('t', {q(EVENT_TS)}, 'v', {self.x}) END"

    def finalize_expr(self):
        return f"{self.s('p')}.v"


class _ExtremeBy(_HeldExtreme):
    """MIN_BY / MAX_BY: the (by, value) pair with the smallest / largest `by`; ties by value."""

    VALUE = "p"

    @property
    def _fn(self) -> str:
        return "min" if self.agg.kind == "min_by" else "max"

    def candidate(self):
        by = q(self.agg.by)
        return f"CASE WHEN {by} IS NOT NULL THEN named_struct('o', {by}, 'v', {self.x}) END"

    def finalize_expr(self):
        return f"{self.s('p')}.v"


_IMPLEMENTATIONS: dict[str, type[AggImpl]] = {
    "count": _Count, "sum": _Sum, "avg": _Avg, "var_samp": _Variance, "stddev_samp": _Variance,
    "min": _Extreme, "max": _Extreme, "first": _FirstLast, "last": _FirstLast,
    "approx_count_distinct": DistinctSketch, "approx_percentile": QuantileSketch,
    "count_distinct": DistinctSet, "min_by": _ExtremeBy, "max_by": _ExtremeBy, "top_k": TopK,
    "approx_top_k": FrequentSketch, "sql": Query,
}
assert set(_IMPLEMENTATIONS) == set(KINDS), "every kind in kinds.KINDS needs an implementation"


def implementation(agg: Agg, input_type: DataType | None = None, *, exact_holders: bool = True) -> AggImpl:
    """The Spark implementation of `agg` for an input column of `input_type` (`exact_holders`: see
    `_HeldExtreme`; the other kinds ignore it)."""
    make = _IMPLEMENTATIONS[agg.kind]
    if isinstance(make, type) and issubclass(make, _HeldExtreme):
        return make(agg, input_type, exact_holders)
    return make(agg, input_type)


def implementations(spec, schema, *, exact_holders: bool = True) -> list[AggImpl]:
    """The implementations of a flow's aggregates over input rows with Spark `schema`."""
    return [implementation(a, schema[a.column].dataType if a.column else None, exact_holders=exact_holders)
            for a in spec.aggregates]


def is_numeric(t: DataType) -> bool:
    return isinstance(t, (NumericType, DecimalType))
