"""Per-minute volume-weighted average price per symbol."""

from laminar_assets.engine import Agg, FlowSpec, PostgresExport, Tumbling

vwap_1m = FlowSpec(
    name="vwap_1m",
    owners=("team:markets-data",),
    tags={"domain": "trades", "tier": "gold"},
    description="Per symbol and minute: VWAP, volume and trade count.",
    source="normalized_trades",
    event_time="event_time",
    window=Tumbling("1m"),
    keys=("symbol",),
    aggregates=(
        Agg.sum("notional", name="notional"),
        Agg.sum("quantity", name="volume"),
        Agg.count(name="trades"),
    ),
    post={"vwap": "notional / volume"},
    partitioning="hourly",
)

# Delivered to the analytics database, table public.vwap_1m; `laminar demo` and `laminar serve` start an embedded
# Postgres for connection 'analytics' when LAMINAR_CONNECTION_ANALYTICS_URL is not set (docs/exports.md).
vwap_1m_pg = PostgresExport(name="vwap_1m_pg", source="vwap_1m", connection="analytics", table="vwap_1m")
