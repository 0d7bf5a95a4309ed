"""Five-minute open/high/low/close bars per symbol."""

from laminar_assets.engine import Agg, FlowSpec, Tumbling

ohlc_5m = FlowSpec(
    name="ohlc_5m",
    owners=("team:markets-data",),
    tags={"domain": "trades", "tier": "gold"},
    description="Per symbol and 5 minutes: open, high, low, close (first/max/min/last by event time) and volume.",
    source="normalized_trades",
    event_time="event_time",
    window=Tumbling("5m"),
    keys=("symbol",),
    aggregates=(
        Agg.first("price", name="open"),
        Agg.max("price", name="high"),
        Agg.min("price", name="low"),
        Agg.last("price", name="close"),
        Agg.sum("quantity", name="volume"),
    ),
    partitioning="hourly",
)
