"""The aggregate algebra: state columns, partial state from rows, merge, retract, finalize.

For every aggregate, `merge` is associative and commutative with the empty
state as identity, so state can be built from any split of the rows. Partial
states are signed: a deleted row (or an update pre-image) contributes with
sign -1. Only `retractable` aggregates accept negative partials; the planner
refills the affected windows for the others.

Expressions are Spark SQL text: one analyzer call each, and readable in `explain`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from pyspark.sql.types import DataType, DecimalType, IntegralType, NumericType

from .spec import Agg

SIGN = "__sign"
EVENT_TS = "__ts"
ROWS = "__n"  # signed row count of a group; a group whose count reaches 0 is gone


def q(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class AggImpl:
    """Spark behaviour of one `Agg`, as SQL expressions over named columns."""

    agg: Agg
    input_type: DataType | None
    retractable: bool
    parts: tuple[str, ...]

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

    # helpers for callers
    def partial(self, sign: str = q(SIGN)) -> list[str]:
        return self._named(self.partial_exprs(sign))

    def merge(self) -> list[str]:
        return self._named(self.merge_exprs())

    def finalize(self) -> str:
        return f"{self.finalize_expr()} AS {q(self.agg.name)}"

    def describe(self) -> dict:
        return {
            "name": self.agg.name, "kind": self.agg.kind, "column": self.agg.column,
            "state_columns": self.state_columns, "retractable": self.retractable,
            "partial": self.partial_exprs(q(SIGN)), "merge": self.merge_exprs(), "finalize": self.finalize_expr(),
        }


class _Count(AggImpl):
    def partial_exprs(self, sign):
        target = "count(1)" if self.agg.column is None else f"count({self.x})"
        return [f"{sign} * {target}"]

    def merge_exprs(self):
        return [f"sum({self.s('c')})"]

    def finalize_expr(self):
        return f"CAST({self.s('c')} AS BIGINT)"


class _Sum(AggImpl):
    def _cast(self) -> str:
        integral = isinstance(self.input_type, IntegralType)
        return f"CAST({self.x} AS {'BIGINT' if integral else 'DOUBLE'})"

    def partial_exprs(self, sign):
        return [f"{sign} * coalesce(sum({self._cast()}), 0)", f"{sign} * count({self.x})"]

    def merge_exprs(self):
        return [f"sum({self.s('s')})", f"sum({self.s('nn')})"]

    def finalize_expr(self):
        return f"CASE WHEN {self.s('nn')} > 0 THEN {self.s('s')} END"


class _Avg(_Sum):
    def _cast(self) -> str:
        return f"CAST({self.x} AS DOUBLE)"

    def finalize_expr(self):
        return f"CASE WHEN {self.s('nn')} > 0 THEN {self.s('s')} / {self.s('nn')} END"


class _Variance(AggImpl):
    """Moments (n, mean, M2) merged with Chan's parallel formula, stable for signed parts."""

    @property
    def _gmean(self) -> str:
        return q(f"__g_{self.agg.name}_mean")

    def partial_exprs(self, sign):
        x = f"CAST({self.x} AS DOUBLE)"
        return [f"{sign} * count({x})", f"avg({x})", f"{sign} * coalesce(var_pop({x}) * count({x}), 0D)"]

    def pre_merge_exprs(self, group):
        n, mean = self.s("n"), self.s("mean")
        over = f"OVER (PARTITION BY {', '.join(q(g) for g in group)})"
        total = f"sum({n}) {over}"
        weighted = f"sum(coalesce({n} * {mean}, 0D)) {over}"
        return [f"CASE WHEN {total} != 0 THEN {weighted} / {total} END AS {self._gmean}"]

    def merge_exprs(self):
        n, mean, m2, g = self.s("n"), self.s("mean"), self.s("m2"), self._gmean
        spread = f"coalesce({n} * ({mean} - {g}) * ({mean} - {g}), 0D)"
        return [f"sum({n})", f"max({g})", f"sum(coalesce({m2}, 0D) + {spread})"]

    def finalize_expr(self):
        n = self.s("n")
        var = f"CASE WHEN {n} > 1 THEN greatest({self.s('m2')}, 0D) / ({n} - 1) END"
        return var if self.agg.kind == "var_samp" else f"sqrt({var})"


class _Extreme(AggImpl):
    def partial_exprs(self, sign):
        return [f"{self.agg.kind}({self.x})"]

    def merge_exprs(self):
        return [f"{self.agg.kind}({self.s('m')})"]

    def finalize_expr(self):
        return self.s("m")


class _FirstLast(AggImpl):
    """Value at the earliest (first) or latest (last) event time; ties broken by value."""

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

    def partial_exprs(self, sign):
        x = f"CAST({self.x} AS DOUBLE)"
        return [f"kll_sketch_agg_double({x}, {self.agg.precision or 200})", f"count({x})"]

    def merge_exprs(self):
        return [f"kll_merge_agg_double({self.s('sk')}, {self.agg.precision or 200})", f"sum({self.s('nn')})"]

    def finalize_expr(self):
        return (f"CASE WHEN {self.s('nn')} > 0 THEN "
                f"kll_sketch_get_quantile_double({self.s('sk')}, CAST({float(self.agg.quantile)!r} AS DOUBLE)) END")


_KINDS: dict[str, tuple[Callable[..., AggImpl], bool, tuple[str, ...]]] = {
    "count": (_Count, True, ("c",)),
    "sum": (_Sum, True, ("s", "nn")),
    "avg": (_Avg, True, ("s", "nn")),
    "var_samp": (_Variance, True, ("n", "mean", "m2")),
    "stddev_samp": (_Variance, True, ("n", "mean", "m2")),
    "min": (_Extreme, False, ("m",)),
    "max": (_Extreme, False, ("m",)),
    "first": (_FirstLast, False, ("p",)),
    "last": (_FirstLast, False, ("p",)),
    "approx_count_distinct": (_DistinctSketch, False, ("sk",)),
    "approx_percentile": (_QuantileSketch, False, ("sk", "nn")),
}


def implementation(agg: Agg, input_type: DataType | None = None) -> AggImpl:
    """The Spark implementation of `agg` for an input column of `input_type`."""
    cls, retractable, parts = _KINDS[agg.kind]
    return cls(agg, input_type, retractable, parts)


def is_numeric(t: DataType) -> bool:
    return isinstance(t, (NumericType, DecimalType))


NEEDS_NUMERIC = {"sum", "avg", "var_samp", "stddev_samp", "approx_percentile"}
