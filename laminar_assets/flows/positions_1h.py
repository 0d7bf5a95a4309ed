"""Hourly net position change per account and symbol."""

from laminar_assets.engine import Agg, FlowSpec, Tumbling

positions_1h = FlowSpec(
    name="positions_1h",
    owners=("team:markets-data",),
    tags={"domain": "trades", "tier": "gold"},
    description="Per account and symbol and hour: net signed quantity and gross notional.",
    source="normalized_trades",
    event_time="event_time",
    window=Tumbling("1h"),
    keys=("account", "symbol"),
    aggregates=(
        Agg.sum("signed_quantity", name="net_quantity"),
        Agg.sum("notional", name="gross_notional"),
        Agg.count(name="trades"),
    ),
    partitioning="hourly",
)
