"""The window table functions of a flow's GROUP BY: TUMBLE(ts, size) and HOP(ts, slide, size)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import NoReturn

from sqlglot import exp

from ..spec.parts import Hopping, Tumbling

WINDOW_FUNCTIONS = ("TUMBLE", "HOP")
Fail = Callable[[exp.Expression, str], NoReturn]  # raises the caller's error (it knows the file and line)
_UNITS = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400}


def is_window(node: exp.Expression) -> bool:
    """Whether `node` is a TUMBLE(...) or HOP(...) call."""
    return isinstance(node, exp.Anonymous) and node.name.upper() in WINDOW_FUNCTIONS


def same_window(node: exp.Anonymous, window, event_time: str, grouped: exp.Expression, fail: Fail) -> None:
    """Fail unless the window call `node` (in the select list) is the GROUP BY's window `grouped`: a flow
    has one window, and a SELECT naming another would silently show the GROUP BY's."""
    other, ts = window_of(node, fail)
    if (other, ts) != (window, event_time):
        fail(node, f"the SELECT's window {node.sql(dialect='spark')} differs from the GROUP BY's window "
                   f"{grouped.sql(dialect='spark')}: a flow has one window; write the same one in both (or select "
                   "window_start and window_end)")


def window_of(node: exp.Anonymous, fail: Fail):
    """(Tumbling | Hopping, name of the time column) of a window call."""
    args = node.expressions
    kind = node.name.upper()
    if kind == "TUMBLE" and len(args) == 2:
        ts, sizes = args[0], [interval_of(args[1], fail)]
    elif kind == "HOP" and len(args) == 3:
        ts, sizes = args[0], [interval_of(args[1], fail), interval_of(args[2], fail)]
    else:
        fail(node, "expected TUMBLE(ts, INTERVAL '1' MINUTE) or HOP(ts, INTERVAL slide, INTERVAL size)")
    if not isinstance(ts, exp.Column):
        fail(ts, "the window's time argument must be a column (derive it in a stage)")
    window = Tumbling(sizes[0]) if kind == "TUMBLE" else Hopping(size=sizes[1], slide=sizes[0])
    return window, ts.name


def interval_of(node: exp.Expression, fail: Fail) -> timedelta:
    """The length of an INTERVAL literal ('5' MINUTE, '5 minutes')."""
    if isinstance(node, exp.Interval) and node.this is not None:
        text = node.this.name.strip()
        unit = node.args.get("unit")
        unit_name = unit.name if unit is not None else ""
        if not unit_name and " " in text:
            text, unit_name = text.split(None, 1)
        unit_name = unit_name.upper().rstrip("S")
        try:
            amount = float(text)
        except ValueError:
            amount = 0.0
        if unit_name in _UNITS and amount > 0:
            try:
                return timedelta(seconds=amount * _UNITS[unit_name])
            except OverflowError:  # 'inf', or more days than a timedelta holds
                fail(node, f"the interval {text} {unit_name} is too long (at most {timedelta.max.days} days)")
    fail(node, "expected an interval like INTERVAL '5' MINUTE (SECOND, MINUTE, HOUR or DAY)")
