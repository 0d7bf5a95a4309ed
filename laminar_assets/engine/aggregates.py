"""The aggregate algebra: state columns, partial state from rows, merge, retract, finalize.

For every aggregate, `merge` is associative and commutative with the empty
state as identity, so state can be built from any split of the rows. Partial
states are signed: a deleted row (or an update pre-image) contributes with
sign -1. Only `retractable` aggregates accept negative partials; the planner
refills the affected windows for the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DecimalType, IntegralType, NumericType

from .spec import Agg

SIGN = "__sign"
EVENT_TS = "__ts"
ROWS = "__n"  # signed row count of a group; a group whose count reaches 0 is gone


def _state(agg: Agg, part: str) -> str:
    return f"__st_{agg.name}_{part}"


@dataclass(frozen=True)
class AggImpl:
    """Spark behaviour of one `Agg`."""

    agg: Agg
    input_type: DataType | None
    retractable: bool
    parts: tuple[str, ...]

    @property
    def state_columns(self) -> list[str]:
        return [_state(self.agg, p) for p in self.parts]

    def col(self, part: str) -> Column:
        return F.col(_state(self.agg, part))

    def value(self) -> Column:
        return F.col(self.agg.column)

    # overridden per kind
    def partial(self, sign: Column) -> list[Column]:
        raise NotImplementedError

    def pre_merge(self, window) -> list[tuple[str, Column]]:
        return []

    def merge(self) -> list[Column]:
        raise NotImplementedError

    def finalize(self) -> Column:
        raise NotImplementedError

    def describe(self) -> dict:
        return {
            "name": self.agg.name, "kind": self.agg.kind, "column": self.agg.column,
            "state_columns": self.state_columns, "retractable": self.retractable,
        }

    def _alias(self, cols: list[Column]) -> list[Column]:
        return [c.alias(n) for c, n in zip(cols, self.state_columns)]


class _Count(AggImpl):
    def partial(self, sign):
        target = F.count(F.lit(1)) if self.agg.column is None else F.count(self.value())
        return self._alias([sign * target])

    def merge(self):
        return self._alias([F.sum(self.col("c"))])

    def finalize(self):
        return self.col("c").cast("long")


class _Sum(AggImpl):
    def _typed(self) -> Column:
        integral = isinstance(self.input_type, IntegralType)
        return self.value().cast("long" if integral else "double")

    def partial(self, sign):
        return self._alias([sign * F.coalesce(F.sum(self._typed()), F.lit(0)), sign * F.count(self.value())])

    def merge(self):
        return self._alias([F.sum(self.col("s")), F.sum(self.col("nn"))])

    def finalize(self):
        return F.when(self.col("nn") > 0, self.col("s"))


class _Avg(_Sum):
    def _typed(self) -> Column:
        return self.value().cast("double")

    def finalize(self):
        return F.when(self.col("nn") > 0, self.col("s") / self.col("nn"))


class _Variance(AggImpl):
    """Moments (n, mean, M2) merged with Chan's parallel formula, stable for signed parts."""

    def partial(self, sign):
        x = self.value().cast("double")
        n = F.count(x)
        return self._alias([sign * n, F.avg(x), sign * F.coalesce(F.var_pop(x) * n, F.lit(0.0))])

    def pre_merge(self, window):
        n, mean = self.col("n"), self.col("mean")
        total = F.sum(n).over(window)
        weighted = F.sum(F.coalesce(n * mean, F.lit(0.0))).over(window)
        return [
            (f"__g_{self.agg.name}_mean", F.when(total != 0, weighted / total)),
        ]

    def merge(self):
        n, mean, m2 = self.col("n"), self.col("mean"), self.col("m2")
        gmean = F.col(f"__g_{self.agg.name}_mean")
        spread = F.coalesce(n * (mean - gmean) * (mean - gmean), F.lit(0.0))
        return self._alias([F.sum(n), F.max(gmean), F.sum(F.coalesce(m2, F.lit(0.0)) + spread)])

    def _var(self) -> Column:
        n = self.col("n")
        return F.when(n > 1, F.greatest(self.col("m2"), F.lit(0.0)) / (n - 1))

    def finalize(self):
        return self._var() if self.agg.kind == "var_samp" else F.sqrt(self._var())


class _Extreme(AggImpl):
    def partial(self, sign):
        fn = F.min if self.agg.kind == "min" else F.max
        return self._alias([fn(self.value())])

    def merge(self):
        fn = F.min if self.agg.kind == "min" else F.max
        return self._alias([fn(self.col("m"))])

    def finalize(self):
        return self.col("m")


class _FirstLast(AggImpl):
    """Value at the earliest (first) or latest (last) event time; ties broken by value."""

    def partial(self, sign):
        pair = F.when(self.value().isNotNull(), F.struct(F.col(EVENT_TS).alias("t"), self.value().alias("v")))
        fn = F.min if self.agg.kind == "first" else F.max
        return self._alias([fn(pair)])

    def merge(self):
        fn = F.min if self.agg.kind == "first" else F.max
        return self._alias([fn(self.col("p"))])

    def finalize(self):
        return self.col("p").getField("v")


class _DistinctSketch(AggImpl):
    """HyperLogLog sketch; union is exact on registers, so merges equal one sketch of all rows."""

    def _input(self) -> Column:
        t = self.input_type
        if isinstance(t, IntegralType):
            return self.value().cast("long")
        return self.value().cast("string")

    def partial(self, sign):
        return self._alias([F.hll_sketch_agg(self._input(), self.agg.precision or 12)])

    def merge(self):
        return self._alias([F.hll_union_agg(self.col("sk"), True)])

    def finalize(self):
        return F.hll_sketch_estimate(self.col("sk"))


class _QuantileSketch(AggImpl):
    """KLL sketch of doubles; `nn` keeps the non-null count so an empty sketch yields null."""

    def partial(self, sign):
        x = self.value().cast("double")
        return self._alias([F.kll_sketch_agg_double(x, self.agg.precision or 200), F.count(x)])

    def merge(self):
        return self._alias([F.kll_merge_agg_double(self.col("sk"), self.agg.precision or 200), F.sum(self.col("nn"))])

    def finalize(self):
        return F.when(self.col("nn") > 0, F.kll_sketch_get_quantile_double(self.col("sk"), F.lit(float(self.agg.quantile))))


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
