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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from pyspark.sql.types import DataType, DecimalType, IntegralType, NumericType

from .kinds import KINDS
from .spec import Agg

SIGN = "__sign"
EVENT_TS = "__ts"
ROWS = "__n"  # signed row count of a group; a group whose count reaches 0 is gone
# A window that saw a retraction is recomputed when the magnitude of what it summed exceeds its value
# by this factor: the retraction's rounding error (~2.2e-16 x magnitude) could then reach ~1e-12 of it.
PRECISION_RATIO = 4096.0


def q(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class AggImpl:
    """Spark behaviour of one `Agg`, as SQL expressions over named columns."""

    agg: Agg
    input_type: DataType | None

    PARTS: ClassVar[tuple[str, ...]] = ()  # names of the state columns (per kind)

    @property
    def retractable(self) -> bool:
        return KINDS[self.agg.kind].retractable

    @property
    def parts(self) -> tuple[str, ...]:
        return self.PARTS

    @property
    def state_columns(self) -> list[str]:
        return [f"__st_{self.agg.name}_{p}" for p in self.parts]

    def s(self, part: str) -> str:
        return q(f"__st_{self.agg.name}_{part}")

    @property
    def x(self) -> str:
        return q(self.agg.column) if self.agg.column else "1"

    def _named(self, exprs: Sequence[str]) -> list[str]:
        return [f"{e} AS {q(n)}" for e, n in zip(exprs, self.state_columns)]

    # overridden per kind
    def partial_exprs(self, sign: str) -> list[str]:
        """Aggregate expressions over input rows (grouped by window, keys and sign)."""
        raise NotImplementedError

    def pre_merge_exprs(self, group: Sequence[str]) -> list[str]:
        """Window expressions added before merging (only the variance needs one)."""
        return []

    def merge_exprs(self) -> list[str]:
        """Aggregate expressions over state rows: associative, commutative, identity = no rows."""
        raise NotImplementedError

    def finalize_expr(self) -> str:
        raise NotImplementedError

    def lost_expr(self) -> str | None:
        """SQL condition over a merged state row: True when retractions may have cost this window
        its precision (it must be recomputed). None for aggregates whose state is exact."""
        return None

    # helpers for callers
    def partial(self, sign: str = q(SIGN)) -> list[str]:
        return self._named(self.partial_exprs(sign))

    def merge(self) -> list[str]:
        return self._named(self.merge_exprs())

    def finalize(self) -> str:
        return f"{self.finalize_expr()} AS {q(self.agg.name)}"

    def describe(self) -> dict:
        return {
            "name": self.agg.name, "kind": self.agg.kind, "column": self.agg.column, "expr": self.agg.expr,
            "state_columns": self.state_columns, "retractable": self.retractable,
            "partial": self.partial_exprs(q(SIGN)), "merge": self.merge_exprs(), "finalize": self.finalize_expr(),
            "precision_guard": self.lost_expr(),
        }


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


class _Extreme(AggImpl):
    PARTS = ("m",)

    def partial_exprs(self, sign):
        return [f"{self.agg.kind}({self.x})"]

    def merge_exprs(self):
        return [f"{self.agg.kind}({self.s('m')})"]

    def finalize_expr(self):
        return self.s("m")


class _FirstLast(AggImpl):
    """Value at the earliest (first) or latest (last) event time; ties broken by value."""

    PARTS = ("p",)

    @property
    def _fn(self) -> str:
        return "min" if self.agg.kind == "first" else "max"

    def partial_exprs(self, sign):
        pair = f"CASE WHEN {self.x} IS NOT NULL THEN named_struct('t', {q(EVENT_TS)}, 'v', {self.x}) END"
        return [f"{self._fn}({pair})"]

    def merge_exprs(self):
        return [f"{self._fn}({self.s('p')})"]

    def finalize_expr(self):
        return f"{self.s('p')}.v"


class _DistinctSketch(AggImpl):
    """HyperLogLog sketch; a union is exact on registers, so merges equal one sketch of all rows."""

    PARTS = ("sk",)

    def partial_exprs(self, sign):
        integral = isinstance(self.input_type, IntegralType)
        value = f"CAST({self.x} AS {'BIGINT' if integral else 'STRING'})"
        return [f"hll_sketch_agg({value}, {self.agg.precision or 12})"]

    def merge_exprs(self):
        return [f"hll_union_agg({self.s('sk')}, true)"]

    def finalize_expr(self):
        return f"hll_sketch_estimate({self.s('sk')})"


class _QuantileSketch(AggImpl):
    """KLL sketch of doubles; `nn` keeps the non-null count so an empty sketch yields null."""

    PARTS = ("sk", "nn")

    def partial_exprs(self, sign):
        x = f"CAST({self.x} AS DOUBLE)"
        return [f"kll_sketch_agg_double({x}, {self.agg.precision or 200})", f"count({x})"]

    def merge_exprs(self):
        return [f"kll_merge_agg_double({self.s('sk')}, {self.agg.precision or 200})", f"sum({self.s('nn')})"]

    def finalize_expr(self):
        return (f"CASE WHEN {self.s('nn')} > 0 THEN "
                f"kll_sketch_get_quantile_double({self.s('sk')}, CAST({float(self.agg.quantile)!r} AS DOUBLE)) END")


class _DistinctSet(AggImpl):
    """Exact COUNT(DISTINCT): the set of values; a union merges, so it cannot retract."""

    PARTS = ("set",)

    def partial_exprs(self, sign):
        return [f"collect_set({self.x})"]

    def merge_exprs(self):
        return [f"array_distinct(flatten(collect_list({self.s('set')})))"]

    def finalize_expr(self):
        return f"CAST(size({self.s('set')}) AS BIGINT)"


class _ExtremeBy(AggImpl):
    """MIN_BY / MAX_BY: the (by, value) pair with the smallest / largest `by`; ties by value."""

    PARTS = ("p",)

    @property
    def _fn(self) -> str:
        return "min" if self.agg.kind == "min_by" else "max"

    def partial_exprs(self, sign):
        by = q(self.agg.by)
        return [f"{self._fn}(CASE WHEN {by} IS NOT NULL THEN named_struct('o', {by}, 'v', {self.x}) END)"]

    def merge_exprs(self):
        return [f"{self._fn}({self.s('p')})"]

    def finalize_expr(self):
        return f"{self.s('p')}.v"


class _TopK(AggImpl):
    """The k largest values: each partial keeps its k largest, a merge keeps the k largest of those."""

    PARTS = ("top",)

    def _keep(self, values: str) -> str:
        return f"slice(sort_array({values}, false), 1, {int(self.agg.k)})"

    def partial_exprs(self, sign):
        return [self._keep(f"collect_list({self.x})")]

    def merge_exprs(self):
        return [self._keep(f"flatten(collect_list({self.s('top')}))")]

    def finalize_expr(self):
        return self.s("top")


class _FrequentSketch(AggImpl):
    """Approximate top-k most frequent values: Spark's frequent-items sketch, merged by combine."""

    PARTS = ("sk",)

    def partial_exprs(self, sign):
        return [f"approx_top_k_accumulate({self.x}, {int(self.agg.precision or 1000)})"]

    def merge_exprs(self):
        return [f"approx_top_k_combine({self.s('sk')}, {int(self.agg.precision or 1000)})"]

    def finalize_expr(self):
        return frequent_first(f"approx_top_k_estimate({self.s('sk')}, {int(self.agg.precision or 1000)})", self.agg.k)


class _Query(AggImpl):
    """Any Spark SQL aggregate: its state is the final value of a window computed from all its rows.

    Such a flow is refill-only (the planner recomputes every window a change touches), so a window's
    merge sees exactly one row, from the snapshot. Should a second one ever meet it, the run fails
    instead of keeping either value.
    """

    PARTS = ("v",)

    def partial_exprs(self, sign):
        return [f"({self.agg.expr})"]

    def merge_exprs(self):
        msg = f"laminar: aggregate {self.agg.name} = {self.agg.expr} cannot merge two partial states"
        return [f"CASE WHEN count(1) > 1 THEN raise_error({msg!r}) ELSE first({self.s('v')}) END"]

    def finalize_expr(self):
        return self.s("v")


def frequent_first(items: str, k: int) -> str:
    """The first `k` of an array of (item, count) structs, most frequent first and ties by item, so the
    answer does not depend on the order rows were merged in (exact while the sketch tracks every item)."""
    order = ("(l, r) -> CASE WHEN l.count > r.count THEN -1 WHEN l.count < r.count THEN 1 "
             "WHEN l.item < r.item THEN -1 WHEN l.item > r.item THEN 1 ELSE 0 END")
    return f"slice(array_sort({items}, {order}), 1, {int(k)})"


_IMPLEMENTATIONS: dict[str, Callable[..., AggImpl]] = {
    "count": _Count, "sum": _Sum, "avg": _Avg, "var_samp": _Variance, "stddev_samp": _Variance,
    "min": _Extreme, "max": _Extreme, "first": _FirstLast, "last": _FirstLast,
    "approx_count_distinct": _DistinctSketch, "approx_percentile": _QuantileSketch,
    "count_distinct": _DistinctSet, "min_by": _ExtremeBy, "max_by": _ExtremeBy, "top_k": _TopK,
    "approx_top_k": _FrequentSketch, "sql": _Query,
}
assert set(_IMPLEMENTATIONS) == set(KINDS), "every kind in kinds.KINDS needs an implementation"


def implementation(agg: Agg, input_type: DataType | None = None) -> AggImpl:
    """The Spark implementation of `agg` for an input column of `input_type`."""
    return _IMPLEMENTATIONS[agg.kind](agg, input_type)


def implementations(spec, schema) -> list[AggImpl]:
    """The implementations of a flow's aggregates over input rows with Spark `schema`."""
    return [implementation(a, schema[a.column].dataType if a.column else None) for a in spec.aggregates]


def is_numeric(t: DataType) -> bool:
    return isinstance(t, (NumericType, DecimalType))
