"""Row-level stage: trades whose notional is above a threshold."""

from laminar_assets.engine import StageSpec

LARGE_NOTIONAL = 250_000.0

large_trades = StageSpec(
    name="large_trades",
    owners=("team:markets-data",),
    tags={"domain": "trades", "tier": "gold"},
    description=f"Normalized trades with notional above {LARGE_NOTIONAL:,.0f}.",
    source="normalized_trades",
    event_time="event_time",
    filter=f"notional > {LARGE_NOTIONAL}",
    columns=("trade_id", "event_time", "symbol", "account", "side", "price", "quantity", "notional", "sector"),
    partitioning="hourly",
)
