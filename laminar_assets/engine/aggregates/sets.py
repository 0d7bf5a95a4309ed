"""Aggregates whose states merge but never retract: sketches (HLL, KLL, frequent items), exact
sets (COUNT(DISTINCT), top-k), and any other Spark SQL aggregate, kept as its final value and
recomputed per window (refill-only). A retraction refills the window."""

from __future__ import annotations

from pyspark.sql.types import IntegralType

from .base import AggImpl, user_sql


class DistinctSketch(AggImpl):
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


class QuantileSketch(AggImpl):
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


class DistinctSet(AggImpl):
    """Exact COUNT(DISTINCT): the set of values; a union merges, so it cannot retract."""

    PARTS = ("set",)

    def partial_exprs(self, sign):
        return [f"collect_set({self.x})"]

    def merge_exprs(self):
        return [f"array_distinct(flatten(collect_list({self.s('set')})))"]

    def finalize_expr(self):
        return f"CAST(size({self.s('set')}) AS BIGINT)"


class TopK(AggImpl):
    """The k largest values: each partial keeps its k largest, a merge keeps the k largest of those."""

    PARTS = ("top",)

    def _keep(self, values: str) -> str:
        k = self.agg.k
        assert k is not None  # a top_k without k is refused before any run (spec.problems)
        return f"slice(sort_array({values}, false), 1, {int(k)})"

    def partial_exprs(self, sign):
        return [self._keep(f"collect_list({self.x})")]

    def merge_exprs(self):
        return [self._keep(f"flatten(collect_list({self.s('top')}))")]

    def finalize_expr(self):
        return self.s("top")


class FrequentSketch(AggImpl):
    """Approximate top-k most frequent values: Spark's frequent-items sketch, merged by combine."""

    PARTS = ("sk",)

    def partial_exprs(self, sign):
        return [f"approx_top_k_accumulate({self.x}, {int(self.agg.precision or 1000)})"]

    def merge_exprs(self):
        return [f"approx_top_k_combine({self.s('sk')}, {int(self.agg.precision or 1000)})"]

    def finalize_expr(self):
        return frequent_first(f"approx_top_k_estimate({self.s('sk')}, {int(self.agg.precision or 1000)})", self.agg.k)


class Query(AggImpl):
    """Any Spark SQL aggregate: its state is the final value of a window computed from all its rows.

    Such a flow is refill-only (the planner recomputes every window a change touches), so a window's
    merge sees exactly one row, from the snapshot. Should a second one ever meet it, the run fails
    instead of keeping either value.
    """

    PARTS = ("v",)

    def partial_exprs(self, sign):
        return [user_sql(self.agg.expr)]

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

