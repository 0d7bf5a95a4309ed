"""Hourly sector statistics, refreshed every 15 minutes (hopping window)."""

from laminar_assets.engine import Agg, FlowSpec, Hopping

sector_stats_1h = FlowSpec(
    name="sector_stats_1h",
    owners=("team:markets-data",),
    tags={"domain": "trades", "tier": "gold"},
    description="Per sector, 1 h windows every 15 min: mean and stddev of notional, approximate distinct "
                "accounts (HLL), approximate p50/p99 quantity (KLL).",
    source="normalized_trades",
    event_time="event_time",
    window=Hopping(size="1h", slide="15m"),
    keys=("sector",),
    aggregates=(
        Agg.avg("notional", name="avg_notional"),
        Agg.stddev_samp("notional", name="stddev_notional"),
        Agg.approx_count_distinct("account", name="accounts"),
        Agg.approx_percentile("quantity", 0.5, name="p50_quantity"),
        Agg.approx_percentile("quantity", 0.99, name="p99_quantity"),
        Agg.count(name="trades"),
    ),
    partitioning="hourly",
)
