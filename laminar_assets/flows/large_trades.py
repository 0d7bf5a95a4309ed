"""Row-level stage: trades whose notional is above a threshold."""

from laminar_assets.engine import StageSpec, WebhookExport

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

# Each large trade POSTed as an alert, 20 to a request; `laminar demo` and `laminar serve` start a local receiver
# for connection 'alerts' when LAMINAR_CONNECTION_ALERTS_URL is not set (docs/exports.md). initial="all": the first
# delivery sends the rows already there too (the demo's first batch), not only the ones that come after it.
large_trades_hook = WebhookExport(name="large_trades_hook", source="large_trades", connection="alerts",
                                  retractions="skip", initial="all", max_rows_per_second=500, rows_per_request=20)
