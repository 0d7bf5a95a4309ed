"""The base of every aggregate implementation: the internal column names and `AggImpl`, the Spark
behaviour of one `Agg` as SQL expressions over named columns (see algebra.py for the algebra)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from pyspark.sql.types import DataType

from ..spec.kinds import KINDS
from ..spec.specs import Agg

SIGN = "__sign"
EVENT_TS = "__ts"
ROWS = "__n"  # signed row count of a group; a group whose count reaches 0 is gone
# A window that saw a retraction is recomputed when the magnitude of what it summed exceeds its value
# by this factor: the retraction's rounding error (~2.2e-16 x magnitude) could then reach ~1e-12 of it.
PRECISION_RATIO = 4096.0


def q(name: str) -> str:
    """A quoted Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def user_sql(expr: str) -> str:
    """A user's SQL expression (a rule, a derived or post column, a filter) to embed in generated SQL:
    in parentheses, on lines of its own, so a `--` comment in it ends where it does."""
    return f"(\n{expr}\n)"


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslashes and quotes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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

    def pre_partial_exprs(self, group: Sequence[str]) -> list[str]:
        """Window expressions over input rows, added before the partials (grouped by `group`)."""
        return []

    def pre_merge_exprs(self, group: Sequence[str]) -> list[str]:
        """Window expressions over state rows, added before merging (grouped by `group`)."""
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

    def gone_expr(self) -> str | None:
        """SQL condition over a merged state row: True when retractions removed what the state
        needs to answer exactly (every row holding a min or max), so the window must be recomputed.
        Always evaluated (not an option, unlike `lost_expr`). None for aggregates that never lose it."""
        return None

    # helpers for callers
    def partial(self, sign: str = q(SIGN)) -> list[str]:
        return self._named(self.partial_exprs(sign))

    def merge(self) -> list[str]:
        return self._named(self.merge_exprs())

    def finalize(self) -> str:
        return f"{self.finalize_expr()} AS {q(self.agg.output)}"

    def describe(self) -> dict:
        return {
            "name": self.agg.name, "kind": self.agg.kind, "column": self.agg.column, "expr": self.agg.expr,
            "state_columns": self.state_columns, "retractable": self.retractable,
            "partial": self.partial_exprs(q(SIGN)), "merge": self.merge_exprs(), "finalize": self.finalize_expr(),
            "precision_guard": self.lost_expr(), "gone": self.gone_expr(),
        }

