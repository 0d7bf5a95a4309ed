"""The two flows under test, read straight from the bench's `trades` source (no shared stage).

`bench_vwap_1m` is `vwap_1m`-like: sum/count/avg per symbol and minute, every aggregate retracts.
`bench_ohlc_5m` is `ohlc_5m`-like: first/max/min/last per symbol and 5 minutes; first, last, min
and max cannot retract, so updates and deletes refill the windows they touch.
"""

from __future__ import annotations

import dataclasses

from laminar_assets.engine import Agg, FlowSpec, Tumbling
from laminar_assets.flows.ohlc_5m import ohlc_5m

from .workload import TABLE


def bench_specs(table: str = TABLE) -> list[FlowSpec]:
    """The two flows over `table`: a name under the engine's root, or an absolute path (so several
    engines with their own roots, state and sinks can read one source table)."""
    vwap = FlowSpec(
        name="bench_vwap_1m",
        description="Per symbol and minute: notional, volume, trades, average price and VWAP.",
        source=table,
        event_time="event_time",
        window=Tumbling("1m"),
        keys=("symbol",),
        derived={"notional": "price * quantity"},
        aggregates=(
            Agg.sum("notional", name="notional"),
            Agg.sum("quantity", name="volume"),
            Agg.count(name="trades"),
            Agg.avg("price", name="avg_price"),
        ),
        post={"vwap": "notional / volume"},
        partitioning="hourly",
    )
    # the demo's own OHLC flow, reading the bench table
    ohlc = dataclasses.replace(ohlc_5m, name="bench_ohlc_5m", source=table)
    return [vwap, ohlc]
