"""Spark SQL text over named DataFrames: one statement, so one analysis.

In classic PySpark every DataFrame call is an analysis of the whole plan so far and a few Py4J
round trips per Column; a flow pass built call by call took dozens of analyses and hundreds of
round trips. A `Query` is built as text instead and handed to
Spark once (`frames.select_frame`: `spark.sql(text, **frames)`, which over Spark Connect also embeds the frames' plans).
Steps that only add columns or filter share one SELECT where they can: Spark's analyzer iterates
about once per nested SELECT, so depth costs more than width.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame, SparkSession

from ..aggregates.base import q
from ..spec.problems import FRAME_PLACEHOLDER
from .frames import select_frame

_REF = FRAME_PLACEHOLDER


def ref(name: str) -> str:
    """Where a frame named `name` goes in a query's text."""
    return f"\x00{name}\x00"


def _mentions(texts, names) -> bool:
    """Whether SQL `texts` may refer to any of `names` (a conservative textual check)."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", t) for n in names for t in texts)


@dataclass(frozen=True)
class Query:
    """`SELECT exprs FROM source [WHERE where] [GROUP BY group]`, whose `ref(name)`s stand for
    `frames[name]`. `columns`: its output columns, in order, when the builder knows them (a step
    that replaces a column needs them); `added`: the names this SELECT adds to its source's `*`."""

    source: str
    frames: dict[str, DataFrame] = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    exprs: tuple[str, ...] = ("*",)
    conditions: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    hint: str | None = None
    group: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        head = f"SELECT {'/*+ ' + self.hint + ' */ ' if self.hint else ''}{', '.join(self.exprs)} FROM {self.source}"
        where = f" WHERE {' AND '.join(f'({c})' for c in self.conditions)}" if self.conditions else ""
        return head + where + (f" GROUP BY {', '.join(self.group)}" if self.group else "")

    def run(self, spark: SparkSession) -> DataFrame:
        """The query as a DataFrame (one analysis; no job runs)."""
        if not self.frames:
            return select_frame(spark, self.text, {})
        # spark.sql formats the text (str.format): braces of the SQL itself are doubled
        text = _REF.sub(r"{\1}", self.text.replace("{", "{{").replace("}", "}}"))
        return select_frame(spark, text, self.frames)

    @property
    def _open(self) -> bool:  # a SELECT of `*` plus added columns: more columns or filters may join it
        return self.exprs[0] == "*" and not self.group and self.hint is None

    def select(self, exprs: list[str], *, where: str | None = None, columns: tuple[str, ...] = (),
               hint: str | None = None, group: list[str] | None = None) -> Query:
        """`SELECT exprs FROM (this) [WHERE where] [GROUP BY group]` (`columns`: its output, if known)."""
        bare = self.exprs == ("*",) and not self.conditions and not self.group and self.hint is None
        source = self.source if bare else f"({self.text}) AS _q"
        return Query(source, self.frames, columns, tuple(exprs), (where,) if where else (),
                     (), hint, tuple(group or ()))

    def where(self, condition: str) -> Query:
        if self._open and not _mentions([condition], self.added):
            return replace(self, conditions=(*self.conditions, condition))
        return self.select(["*"], where=condition, columns=self.columns)

    def add_columns(self, named: list[tuple[str, str]]) -> Query:
        """Add new columns, none referring to another in `named`."""
        exprs = tuple(f"{expr} AS {q(name)}" for name, expr in named)
        names = tuple(n for n, _ in named)
        columns = (*self.columns, *names) if self.columns else ()
        if self._open and not _mentions(exprs, self.added):
            return replace(self, exprs=(*self.exprs, *exprs), added=(*self.added, *names), columns=columns)
        return replace(self.select(["*"], columns=self.columns), exprs=("*", *exprs), added=names, columns=columns)

    def with_columns(self, named: list[tuple[str, str]]) -> Query:
        """Add (or replace, in place) columns named by SQL expressions, each seeing the ones before."""
        out = self
        for name, expr in named:
            if name in out.columns:
                exprs = [f"{expr} AS {q(c)}" if c == name else q(c) for c in out.columns]
                out = out.select(exprs, columns=out.columns)
            else:
                out = out.add_columns([(name, expr)])
        return out


def frame(name: str, df: DataFrame, columns: tuple[str, ...] = ()) -> Query:
    """A DataFrame as a query."""
    return Query(ref(name), {name: df}, columns)


def union_all(parts: list[Query]) -> Query:
    """The parts' rows (their select lists must match in order)."""
    frames: dict[str, DataFrame] = {}
    for p in parts:
        frames.update(p.frames)
    text = " UNION ALL ".join(f"({p.text})" for p in parts)
    return Query(f"({text}) AS _q", frames, parts[0].columns)
