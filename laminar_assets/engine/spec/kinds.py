"""The one table of aggregate kinds: what each kind needs and whether it can retract.

Specs validate against it, the planner asks it which aggregates cannot retract, and
`aggregates.algebra` maps each kind to its Spark implementation. It imports nothing from
the engine, so every module can use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """Facts about one aggregate kind."""

    name: str
    retractable: bool  # a deleted row can be subtracted from the state (for the extremes: until no
    #                    row holding the extreme is left, then the window is recomputed)
    needs_column: bool = True
    numeric: bool = False  # the input column must be numeric
    exact: bool = True  # False for sketches (estimates within the sketch's error bound)
    mergeable: bool = True  # False: no partial state merges; every touched window is recomputed
    holds_extreme: bool = False  # its state is one row's value, kept with how many rows hold it


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("count", retractable=True, needs_column=False),
    Kind("sum", retractable=True, numeric=True),
    Kind("avg", retractable=True, numeric=True),
    Kind("var_samp", retractable=True, numeric=True),
    Kind("stddev_samp", retractable=True, numeric=True),
    Kind("min", retractable=True, holds_extreme=True),
    Kind("max", retractable=True, holds_extreme=True),
    Kind("first", retractable=True, holds_extreme=True),
    Kind("last", retractable=True, holds_extreme=True),
    Kind("approx_count_distinct", retractable=False, exact=False),
    Kind("approx_percentile", retractable=False, numeric=True, exact=False),
    Kind("count_distinct", retractable=False),
    Kind("min_by", retractable=True, holds_extreme=True),
    Kind("max_by", retractable=True, holds_extreme=True),
    Kind("top_k", retractable=False),
    Kind("approx_top_k", retractable=False, exact=False),
    # Any other Spark SQL aggregate expression (percentile, median, collect_list, ...): Laminar keeps its
    # final value per window and recomputes each touched window from the snapshot (refill-only).
    Kind("sql", retractable=False, needs_column=False, mergeable=False),
)}


def kind(name: str) -> Kind:
    """The kind called `name`; KeyError if there is none (specs check names when built)."""
    return KINDS[name]
