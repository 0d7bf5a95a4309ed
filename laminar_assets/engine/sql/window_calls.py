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
            return timedelta(seconds=amount * _UNITS[unit_name])
    fail(node, "expected an interval like INTERVAL '5' MINUTE (SECOND, MINUTE, HOUR or DAY)")
